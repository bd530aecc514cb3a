// depot-soak: sends hostile requests to a live depot-server and checks that
// it stays up and healthy, that a legitimate job is left untouched and that
// its memory stays within its budget (docs/fuzzing.md, "The soak tool").
//
//   depot-soak --requests 1000000 [--threads 8] [--memory_limit_bytes N]
//              [--server HOST:PORT --server_pid PID] [--json]
//              [--fatal_internal]
//
// Without --server it starts the depot-server built beside it (or
// $DEPOT_SERVER_BINARY) on loopback with --memory_limit_bytes. Then:
//   1. creates a legitimate job, initializes its weights, trains it a few
//      steps and records its state checksum (GetJob with_checksum) and a hash
//      of its weights (PullWeights, fp32);
//   2. creates a "victim" job, which hostile requests may address with its
//      real fingerprint (so they reach the code behind the job lookup);
//   3. sends --requests hostile requests from --threads threads, each with a
//      deadline: messages of every RPC method (streaming ones included) with
//      random and extreme field values (protobuf reflection), mutated bytes
//      (bit flips, truncation, junk, random bytes), the legitimate job's id
//      with wrong fingerprints, the victim's with its own, near-valid Step,
//      InitWeights and ImportState streams with wrong sizes and NaNs,
//      cancelled streams, messages over the server's size limit, and raw TCP
//      connections that send garbage instead of HTTP/2;
//   4. meanwhile probes health (grpc.health.v1 Check and GetJob of the
//      legitimate job) every --health_interval_seconds, watches the process
//      and samples its RSS (/proc/PID/status VmRSS, VmHWM);
//   5. re-reads the legitimate job's checksum and weights.
// Prints a table (requests, counts per status code, INTERNAL/UNKNOWN samples,
// crashes, hangs, RSS peak vs budget, checksum equal) or --json. Exits 1 when
// the server crashed or hung, the legitimate job changed, the RSS peak went
// over budget + --rss_slack_bytes, or (with --fatal_internal) any request got
// INTERNAL or UNKNOWN.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "depot/v1/depot.grpc.pb.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/reflection.h"
#include "google/protobuf/stubs/logging.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "raw_bidi_call.h"
#include "server_process.h"
#include "wire/wire.h"

ABSL_FLAG(std::string, server, "",
          "host:port of a live depot-server; empty: start one");
ABSL_FLAG(int32_t, server_pid, 0,
          "with --server: its pid, for the crash check and RSS samples "
          "(0: neither)");
ABSL_FLAG(uint64_t, requests, 100000, "hostile requests to send");
ABSL_FLAG(int32_t, threads, 8, "client threads sending them");
ABSL_FLAG(uint64_t, memory_limit_bytes, uint64_t{256} << 20,
          "the server's --memory_limit_bytes (the RSS budget); with --server, "
          "the budget the server was started with");
ABSL_FLAG(uint64_t, rss_slack_bytes, uint64_t{64} << 20,
          "RSS allowed above the budget");
ABSL_FLAG(uint64_t, seed, 1, "seed of the hostile requests");
ABSL_FLAG(double, deadline_seconds, 3, "deadline of each hostile request");
ABSL_FLAG(double, health_interval_seconds, 1, "seconds between probes");
ABSL_FLAG(double, hang_seconds, 10,
          "a probe that gets no answer within this is a hang");
ABSL_FLAG(bool, fatal_internal, false,
          "exit 1 when a request gets INTERNAL or UNKNOWN");
ABSL_FLAG(bool, json, false, "print the summary as JSON");
ABSL_FLAG(uint64_t, oversized_every, 20000,
          "one request in this many is a message over the server's 64 MiB "
          "limit (0: none)");

ABSL_FLAG(std::string, send_method, "",
          "reproduce one input instead of a soak: the method (e.g. CreateJob) "
          "that gets --send_file's bytes as its (first) message; prints the "
          "status and whether the server is still alive");
ABSL_FLAG(std::string, send_file, "", "with --send_method: the message");

namespace {

using depot::testing::ServerProcess;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

constexpr char kService[] = "depot.v1.Depot";
constexpr uint64_t kServerMaxMessageBytes = uint64_t{64} << 20;  // daemon.cc

enum class Kind { kUnary, kServerStream, kClientStream, kBidi };
struct Method {
  const char* name;  // "/depot.v1.Depot/CreateJob"
  Kind kind;
  const Message* prototype;  // of the request
};

std::vector<Method> Methods() {
  using namespace depot::v1;
  static const CreateJobRequest create_job;
  static const InitWeightsRequest init_weights;
  static const StepRequest step;
  static const PullRequest pull;
  static const GetJobRequest get_job;
  static const DeleteJobRequest delete_job;
  static const ExportStateRequest export_state;
  static const ImportStateRequest import_state;
  static const CheckpointRequest checkpoint;
  static const ListCheckpointsRequest list_checkpoints;
  static const RollBackRequest roll_back;
  static const ImportCheckpointRequest import_checkpoint;
  return {
      {"/depot.v1.Depot/CreateJob", Kind::kUnary, &create_job},
      {"/depot.v1.Depot/InitWeights", Kind::kClientStream, &init_weights},
      {"/depot.v1.Depot/Step", Kind::kBidi, &step},
      {"/depot.v1.Depot/PullWeights", Kind::kServerStream, &pull},
      {"/depot.v1.Depot/GetJob", Kind::kUnary, &get_job},
      {"/depot.v1.Depot/DeleteJob", Kind::kUnary, &delete_job},
      {"/depot.v1.Depot/ExportState", Kind::kServerStream, &export_state},
      {"/depot.v1.Depot/ImportState", Kind::kClientStream, &import_state},
      {"/depot.v1.Depot/Checkpoint", Kind::kUnary, &checkpoint},
      {"/depot.v1.Depot/ListCheckpoints", Kind::kUnary, &list_checkpoints},
      {"/depot.v1.Depot/RollBack", Kind::kUnary, &roll_back},
      {"/depot.v1.Depot/ImportCheckpoint", Kind::kUnary, &import_checkpoint},
  };
}

grpc::ByteBuffer ToBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string Hex(const std::string& bytes, size_t max) {
  std::string out;
  for (size_t i = 0; i < bytes.size() && i < max; ++i) {
    absl::StrAppendFormat(&out, "%02x", static_cast<uint8_t>(bytes[i]));
  }
  if (bytes.size() > max) absl::StrAppend(&out, "...");
  return out;
}

// ---------------------------------------------------------------------------
// The legitimate and victim jobs.

struct JobHandle {
  uint64_t id = 0;
  uint64_t fingerprint = 0;
  uint64_t total_params = 0;
  uint64_t chunk_elems = 0;
  uint64_t num_chunks = 0;
};

depot::v1::JobSpec MakeSpec(const std::string& name, uint64_t numel,
                            uint64_t chunk_elems) {
  depot::JobConfig config;  // AdamW with torch's defaults
  config.name = name;
  config.tensors = {{"w", numel - numel / 4, 0}, {"b", numel / 4, 1}};
  config.optimizer.lr = 1e-2;
  config.chunk_elems = chunk_elems;
  config.alignment_elems = 16;
  depot::v1::JobSpec spec;
  depot::JobConfigToProto(config, &spec);
  return spec;
}

grpc::Status CreateJob(depot::v1::Depot::Stub& stub,
                       const depot::v1::JobSpec& spec, JobHandle* job) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  depot::v1::CreateJobRequest request;
  *request.mutable_spec() = spec;
  depot::v1::CreateJobResponse response;
  grpc::Status s = stub.CreateJob(&ctx, request, &response);
  if (!s.ok()) return s;
  job->id = response.job_id();
  job->fingerprint = response.fingerprint();
  job->chunk_elems = spec.chunk_elems();
  job->num_chunks = response.end_chunk() - response.first_chunk();
  job->total_params = response.shard_end() - response.shard_begin();
  return s;
}

std::string FloatPayload(uint64_t elems, std::mt19937_64& rng, float scale) {
  std::string out(elems * 4, '\0');
  std::uniform_real_distribution<float> dist(-scale, scale);
  for (uint64_t i = 0; i < elems; ++i) {
    const float v = dist(rng);
    std::memcpy(out.data() + 4 * i, &v, 4);
  }
  return out;
}

uint64_t ChunkSize(const JobHandle& job, uint64_t chunk) {
  const uint64_t begin = chunk * job.chunk_elems;
  return std::min(job.total_params, begin + job.chunk_elems) - begin;
}

grpc::Status InitWeights(depot::v1::Depot::Stub& stub, const JobHandle& job,
                         std::mt19937_64& rng) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  depot::v1::InitWeightsResponse response;
  auto writer = stub.InitWeights(&ctx, &response);
  depot::v1::InitWeightsRequest header;
  header.mutable_header()->set_job_id(job.id);
  header.mutable_header()->set_fingerprint(job.fingerprint);
  header.mutable_header()->set_dtype(depot::v1::DTYPE_FP32);
  writer->Write(header);
  for (uint64_t c = 0; c < job.num_chunks; ++c) {
    depot::v1::InitWeightsRequest chunk;
    chunk.mutable_chunk()->set_index(c);
    chunk.mutable_chunk()->set_payload(FloatPayload(ChunkSize(job, c), rng, 1));
    if (!writer->Write(chunk)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

grpc::Status TrainStep(depot::v1::Depot::Stub& stub, const JobHandle& job,
                       uint64_t step, std::mt19937_64& rng) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto stream = stub.Step(&ctx);
  depot::v1::StepRequest header;
  header.mutable_header()->set_job_id(job.id);
  header.mutable_header()->set_fingerprint(job.fingerprint);
  header.mutable_header()->set_step(step);
  stream->Write(header);
  for (uint64_t c = 0; c < job.num_chunks; ++c) {
    depot::v1::StepRequest chunk;
    chunk.mutable_chunk()->set_index(c);
    chunk.mutable_chunk()->set_payload(
        FloatPayload(ChunkSize(job, c), rng, 0.1f));
    if (!stream->Write(chunk)) break;
  }
  stream->WritesDone();
  depot::v1::StepResponse response;
  uint64_t chunks = 0;
  while (stream->Read(&response)) chunks += response.has_chunk() ? 1 : 0;
  grpc::Status s = stream->Finish();
  if (s.ok() && chunks != job.num_chunks) {
    return grpc::Status(
        grpc::StatusCode::INTERNAL,
        absl::StrCat("step ", step, ": ", chunks,
                     " weight chunks back, expected ", job.num_chunks));
  }
  return s;
}

// The job's state checksum and a hash (FNV-1a) of its fp32 weights.
struct JobFingerprint {
  uint64_t state_checksum = 0;
  uint64_t weights_hash = 0;
  uint64_t step = 0;
  bool operator==(const JobFingerprint& o) const {
    return state_checksum == o.state_checksum &&
           weights_hash == o.weights_hash && step == o.step;
  }
};

grpc::Status ReadJob(depot::v1::Depot::Stub& stub, const JobHandle& job,
                     JobFingerprint* out) {
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(30));
    depot::v1::GetJobRequest request;
    request.set_job_id(job.id);
    request.set_with_checksum(true);
    depot::v1::JobStatus status;
    grpc::Status s = stub.GetJob(&ctx, request, &status);
    if (!s.ok()) return s;
    out->state_checksum = status.state_checksum();
    out->step = status.step();
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  depot::v1::PullRequest request;
  request.set_job_id(job.id);
  request.set_fingerprint(job.fingerprint);
  request.set_begin(0);
  request.set_end(job.total_params);
  request.set_dtype(depot::v1::DTYPE_FP32);
  auto reader = stub.PullWeights(&ctx, request);
  depot::v1::PullResponse piece;
  uint64_t hash = 0xcbf29ce484222325ULL;
  auto mix = [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) hash = (hash ^ b[i]) * 0x100000001b3ULL;
  };
  uint64_t elems = 0;
  while (reader->Read(&piece)) {
    const uint64_t offset = piece.offset();
    mix(&offset, sizeof(offset));
    mix(piece.payload().data(), piece.payload().size());
    elems += piece.payload().size() / 4;
  }
  grpc::Status s = reader->Finish();
  if (s.ok() && elems != job.total_params) {
    return grpc::Status(
        grpc::StatusCode::INTERNAL,
        absl::StrCat("pulled ", elems, " elements of ", job.total_params));
  }
  out->weights_hash = hash;
  return s;
}

// ---------------------------------------------------------------------------
// Hostile messages.

class Hostile {
 public:
  Hostile(uint64_t seed, const JobHandle& legit, const JobHandle& victim,
          std::string checkpoint_dir)
      : rng_(seed),
        legit_(legit),
        victim_(victim),
        checkpoint_dir_(std::move(checkpoint_dir)) {}

  std::mt19937_64& rng() { return rng_; }
  bool Chance(double p) {
    return std::uniform_real_distribution<double>(0, 1)(rng_) < p;
  }
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }

  uint64_t ExtremeU64() {
    static const uint64_t kValues[] = {
        0,
        1,
        2,
        7,
        255,
        65536,
        (uint64_t{1} << 31) - 1,
        uint64_t{1} << 31,
        (uint64_t{1} << 32) - 1,
        uint64_t{1} << 32,
        uint64_t{1} << 62,
        (uint64_t{1} << 62) + 1,
        uint64_t{1} << 63,
        std::numeric_limits<uint64_t>::max(),
        std::numeric_limits<uint64_t>::max() - 1};
    if (Chance(0.3)) return rng_() >> Below(64);
    return kValues[Below(std::size(kValues))];
  }
  double ExtremeDouble() {
    static const double kValues[] = {0.0,
                                     -0.0,
                                     1.0,
                                     -1.0,
                                     0.5,
                                     1e-3,
                                     std::numeric_limits<double>::quiet_NaN(),
                                     -std::numeric_limits<double>::quiet_NaN(),
                                     std::numeric_limits<double>::infinity(),
                                     -std::numeric_limits<double>::infinity(),
                                     std::numeric_limits<double>::max(),
                                     std::numeric_limits<double>::lowest(),
                                     std::numeric_limits<double>::denorm_min(),
                                     std::numeric_limits<double>::min(),
                                     1e300,
                                     -1e300,
                                     3.4e38,
                                     1e39};
    if (Chance(0.2)) {
      uint64_t bits = rng_();
      double d;
      std::memcpy(&d, &bits, 8);
      return d;
    }
    return kValues[Below(std::size(kValues))];
  }
  std::string RandomBytes(size_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(rng_());
    return s;
  }
  std::string ExtremeString() {
    switch (Below(8)) {
      case 0:
        return "";
      case 1:
        return "a";
      case 2:
        return "../../../../etc/passwd";
      case 3:
        return std::string(Below(4096) + 1, 'x');
      case 4:
        return std::string("\0\xff\xfe/\n", 5);
      case 5:
        return checkpoint_dir_;
      case 6:
        return Chance(0.02) ? std::string(size_t{1} << 20, 'y')
                            : RandomBytes(Below(64));
      default:
        return RandomBytes(Below(16));
    }
  }

  // Sets random fields of `m` to random or extreme values.
  void Randomize(Message* m, int depth) {
    const google::protobuf::Descriptor* d = m->GetDescriptor();
    const Reflection* r = m->GetReflection();
    // A oneof: one member at most, as a real peer sends.
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      if (f->containing_oneof() != nullptr && !Chance(0.15)) continue;
      if (!Chance(0.7)) continue;
      const int repeats = f->is_repeated()
                              ? static_cast<int>(Chance(0.01) ? 1000 : Below(5))
                              : 1;
      for (int k = 0; k < repeats; ++k) SetField(m, r, f, depth);
    }
    if (d->oneof_decl_count() > 0 && Chance(0.9)) {
      const auto* oneof = d->oneof_decl(0);
      const FieldDescriptor* f = oneof->field(Below(oneof->field_count()));
      SetField(m, r, f, depth);
    }
  }

  void SetField(Message* m, const Reflection* r, const FieldDescriptor* f,
                int depth) {
    const bool rep = f->is_repeated();
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_UINT64: {
        const uint64_t v = ExtremeU64();
        rep ? r->AddUInt64(m, f, v) : r->SetUInt64(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_INT64: {
        const int64_t v = static_cast<int64_t>(ExtremeU64());
        rep ? r->AddInt64(m, f, v) : r->SetInt64(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_UINT32: {
        const uint32_t v = static_cast<uint32_t>(ExtremeU64());
        rep ? r->AddUInt32(m, f, v) : r->SetUInt32(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_INT32: {
        const int32_t v = static_cast<int32_t>(ExtremeU64());
        rep ? r->AddInt32(m, f, v) : r->SetInt32(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_DOUBLE: {
        const double v = ExtremeDouble();
        rep ? r->AddDouble(m, f, v) : r->SetDouble(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_FLOAT: {
        const float v = static_cast<float>(ExtremeDouble());
        rep ? r->AddFloat(m, f, v) : r->SetFloat(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_BOOL: {
        const bool v = Chance(0.5);
        rep ? r->AddBool(m, f, v) : r->SetBool(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_ENUM: {
        const int v = Chance(0.7) ? static_cast<int>(Below(6))
                                  : static_cast<int>(ExtremeU64());
        rep ? r->AddEnumValue(m, f, v) : r->SetEnumValue(m, f, v);
        break;
      }
      case FieldDescriptor::CPPTYPE_STRING: {
        std::string v =
            f->name() == "payload" || f->name() == "master" ||
                    f->name() == "slots"
                ? FloatBytes(Chance(0.5) ? victim_.chunk_elems : Below(5000))
                : ExtremeString();
        rep ? r->AddString(m, f, std::move(v))
            : r->SetString(m, f, std::move(v));
        break;
      }
      case FieldDescriptor::CPPTYPE_MESSAGE: {
        if (depth > 4) break;
        Message* sub = rep ? r->AddMessage(m, f) : r->MutableMessage(m, f);
        Randomize(sub, depth + 1);
        break;
      }
    }
  }

  // fp32 values, some of them NaN, Inf or huge; a length that is sometimes
  // not a multiple of 4.
  std::string FloatBytes(uint64_t elems) {
    std::string out(elems * 4 + (Chance(0.1) ? Below(4) : 0), '\0');
    for (uint64_t i = 0; i + 4 <= out.size(); i += 4) {
      const float v = Chance(0.05) ? static_cast<float>(ExtremeDouble())
                                   : static_cast<float>(rng_() % 1000) * 1e-3f;
      std::memcpy(out.data() + i, &v, 4);
    }
    return out;
  }

  // Points the message's job id and fingerprint (at the top level or in its
  // header) at the legitimate job with a wrong fingerprint, at the victim with
  // its own, or leaves what Randomize chose.
  void Aim(Message* m) {
    Message* target = m;
    const google::protobuf::Descriptor* d = m->GetDescriptor();
    const Reflection* r = m->GetReflection();
    if (d->FindFieldByName("job_id") == nullptr) {
      const FieldDescriptor* header = d->FindFieldByName("header");
      if (header == nullptr) return;
      target = r->MutableMessage(m, header);
    }
    const google::protobuf::Descriptor* td = target->GetDescriptor();
    const Reflection* tr = target->GetReflection();
    const FieldDescriptor* id = td->FindFieldByName("job_id");
    const FieldDescriptor* fp = td->FindFieldByName("fingerprint");
    if (id == nullptr) return;
    const double p = std::uniform_real_distribution<double>(0, 1)(rng_);
    if (p < 0.3) {
      tr->SetUInt64(target, id, legit_.id);
      if (fp != nullptr) {
        uint64_t wrong = tr->GetUInt64(*target, fp);
        if (wrong == legit_.fingerprint) wrong ^= 1;
        tr->SetUInt64(target, fp, wrong);
      }
    } else if (p < 0.7) {
      tr->SetUInt64(target, id, victim_.id);
      if (fp != nullptr && Chance(0.8)) {
        tr->SetUInt64(target, fp, victim_.fingerprint);
      }
    }
  }

  // Damages serialized bytes (or not).
  std::string Mutate(std::string s) {
    const double p = std::uniform_real_distribution<double>(0, 1)(rng_);
    if (p < 0.5) return s;
    if (p < 0.6) return RandomBytes(Below(256));
    const int count = 1 + static_cast<int>(Below(4));
    for (int i = 0; i < count; ++i) {
      const size_t at = s.empty() ? 0 : Below(s.size());
      switch (Below(6)) {
        case 0:
          if (!s.empty()) s[at] = static_cast<char>(s[at] ^ (1 << Below(8)));
          break;
        case 1:
          s.resize(at);  // truncated
          break;
        case 2:
          s.insert(at, RandomBytes(1 + Below(16)));
          break;
        case 3:
          if (!s.empty()) s[at] = static_cast<char>(Chance(0.5) ? 0xff : 0x80);
          break;
        case 4:
          s += RandomBytes(1 + Below(32));
          break;
        case 5:  // an overlong length or varint
          s.insert(at, std::string(Below(12) + 1, '\xff'));
          break;
      }
    }
    return s;
  }

  // One serialized message for `method`.
  std::string Message_(const Method& method) {
    std::unique_ptr<Message> m(method.prototype->New());
    Randomize(m.get(), 0);
    Aim(m.get());
    return Mutate(m->SerializeAsString());
  }

  // A Step, InitWeights or ImportState stream for the victim that is valid
  // but for a few details.
  std::vector<std::string> NearValidStream(const Method& method) {
    std::vector<std::string> out;
    const std::string name = method.name;
    const uint64_t chunks = 1 + Below(victim_.num_chunks + 1);
    if (name.find("/Step") != std::string::npos) {
      depot::v1::StepRequest header;
      auto* h = header.mutable_header();
      h->set_job_id(victim_.id);
      h->set_fingerprint(victim_.fingerprint);
      h->set_step(Chance(0.8) ? 1 + Below(20) : ExtremeU64());
      h->set_worker_rank(Chance(0.9) ? 0 : static_cast<uint32_t>(ExtremeU64()));
      if (Chance(0.2)) h->set_loss_scale(ExtremeDouble());
      if (Chance(0.2)) h->set_two_phase(true);
      if (Chance(0.1)) h->mutable_commit()->set_clip_coef(ExtremeDouble());
      if (Chance(0.1)) h->set_no_grad_tensors(RandomBytes(Below(3)));
      if (Chance(0.1)) h->set_sum_only_tensors(RandomBytes(Below(3)));
      if (Chance(0.05)) h->set_omit_sums(true);
      if (Chance(0.1)) {
        h->set_local_ranks(static_cast<uint32_t>(Below(5)));
        h->set_local_rank(static_cast<uint32_t>(Below(5)));
        h->set_bucket_chunks(Below(9));
      }
      if (Chance(0.2)) {
        auto* g = h->add_group_hparams();
        g->set_param_group(static_cast<uint32_t>(Below(3)));
        g->set_lr(ExtremeDouble());
        g->set_weight_decay(ExtremeDouble());
      }
      out.push_back(header.SerializeAsString());
      for (uint64_t i = 0; i < chunks; ++i) {
        depot::v1::StepRequest m;
        if (Chance(0.05)) {
          auto* w = m.mutable_weights_override();
          w->set_chunk_index(Below(victim_.num_chunks + 1));
          w->set_offset(Chance(0.8) ? Below(victim_.chunk_elems)
                                    : ExtremeU64());
          w->set_payload(FloatBytes(Below(victim_.chunk_elems + 2)));
        } else if (Chance(0.03)) {
          m.mutable_commit()->set_clip_coef(ExtremeDouble());
          m.mutable_commit()->set_skip(Chance(0.5));
        } else {
          const uint64_t index =
              Chance(0.9) ? i % victim_.num_chunks : ExtremeU64();
          m.mutable_chunk()->set_index(index);
          const uint64_t elems =
              Chance(0.85) ? ChunkSize(victim_, index % victim_.num_chunks)
                           : Below(victim_.chunk_elems * 2);
          m.mutable_chunk()->set_payload(FloatBytes(elems));
        }
        out.push_back(Chance(0.1) ? Mutate(m.SerializeAsString())
                                  : m.SerializeAsString());
      }
    } else if (name.find("/InitWeights") != std::string::npos) {
      depot::v1::InitWeightsRequest header;
      header.mutable_header()->set_job_id(victim_.id);
      header.mutable_header()->set_fingerprint(victim_.fingerprint);
      header.mutable_header()->set_dtype(
          static_cast<depot::v1::DType>(Chance(0.9) ? 1 + Below(3) : Below(9)));
      out.push_back(header.SerializeAsString());
      for (uint64_t i = 0; i < chunks; ++i) {
        depot::v1::InitWeightsRequest m;
        const uint64_t index = Chance(0.9) ? i : ExtremeU64();
        m.mutable_chunk()->set_index(index);
        m.mutable_chunk()->set_payload(
            FloatBytes(Chance(0.8) ? ChunkSize(victim_, i % victim_.num_chunks)
                                   : Below(victim_.chunk_elems * 2)));
        out.push_back(m.SerializeAsString());
      }
    } else {  // ImportState
      depot::v1::ImportStateRequest header;
      header.mutable_header()->set_job_id(victim_.id);
      header.mutable_header()->set_fingerprint(victim_.fingerprint);
      out.push_back(header.SerializeAsString());
      for (uint64_t i = 0; i < chunks; ++i) {
        depot::v1::ImportStateRequest m;
        auto* c = m.mutable_chunk();
        c->set_index(Chance(0.9) ? i : ExtremeU64());
        c->set_applied_step(Chance(0.7) ? Below(10) : ExtremeU64());
        c->set_optimizer_step(Chance(0.7) ? Below(10) : ExtremeU64());
        const uint64_t elems = Chance(0.8)
                                   ? ChunkSize(victim_, i % victim_.num_chunks)
                                   : Below(victim_.chunk_elems * 2);
        c->set_master(FloatBytes(elems));
        for (uint64_t k = 0, n = Chance(0.8) ? 2 : Below(5); k < n; ++k) {
          c->add_slots(FloatBytes(elems));
        }
        for (uint64_t k = 0, n = Below(4); k < n; ++k) {
          c->add_tensor_steps(Chance(0.7) ? Below(10) : ExtremeU64());
        }
        out.push_back(m.SerializeAsString());
      }
    }
    return out;
  }

 private:
  std::mt19937_64 rng_;
  JobHandle legit_;
  JobHandle victim_;
  std::string checkpoint_dir_;
};

// ---------------------------------------------------------------------------
// Counting.

struct Sample {
  std::string method;
  std::string status;
  std::string first_message_hex;
};

class Tally {
 public:
  // `valid`: every message sent was a valid encoding of the method's request
  // type (an INTERNAL or UNKNOWN then is not the malformed-protobuf case).
  void Add(const std::string& method, const grpc::Status& s,
           const std::string& first_message, bool valid = false) {
    std::lock_guard<std::mutex> lock(mu_);
    ++requests_;
    ++by_code_[s.error_code()];
    ++by_method_[method][s.error_code()];
    if ((s.error_code() == grpc::StatusCode::INTERNAL ||
         s.error_code() == grpc::StatusCode::UNKNOWN)) {
      if (valid) ++internal_unknown_on_valid_;
      std::string key = absl::StrCat(method, " ", s.error_code(), " ",
                                     s.error_message().substr(0, 80));
      if (sample_keys_.insert(key).second && samples_.size() < 40) {
        samples_.push_back({method,
                            absl::StrCat(CodeName(s.error_code()), ": \"",
                                         s.error_message(), "\""),
                            Hex(first_message, 96)});
      }
    }
  }
  void AddRaw() {
    std::lock_guard<std::mutex> lock(mu_);
    ++requests_;
    ++raw_;
  }
  uint64_t requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

  // A gRPC status code's name (its value is absl::StatusCode's).
  static const char* CodeName(int code) {
    static const std::vector<std::string> kNames = [] {
      std::vector<std::string> names;
      for (int c = 0; c <= 16; ++c) {
        names.push_back(
            absl::StatusCodeToString(static_cast<absl::StatusCode>(c)));
      }
      return names;
    }();
    return code >= 0 && code < static_cast<int>(kNames.size())
               ? kNames[code].c_str()
               : "?";
  }

  mutable std::mutex mu_;
  uint64_t requests_ = 0;
  uint64_t raw_ = 0;
  uint64_t internal_unknown_on_valid_ = 0;
  std::map<int, uint64_t> by_code_;
  std::map<std::string, std::map<int, uint64_t>> by_method_;
  std::set<std::string> sample_keys_;
  std::vector<Sample> samples_;
};

// ---------------------------------------------------------------------------
// Sending.

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // A channel of its own per thread, not shared through gRPC's subchannel
  // pool, so the threads' streams do not queue on one connection.
  args.SetInt("grpc.use_local_subchannel_pool", 1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   args);
}

void SetDeadline(grpc::ClientContext* ctx, double seconds) {
  ctx->set_deadline(
      std::chrono::system_clock::now() +
      std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6)));
}

// Raw TCP: garbage instead of HTTP/2, a truncated preface, or a preface and
// a truncated frame; then close.
void SendRawGarbage(const std::string& address, Hostile& h) {
  const size_t colon = address.rfind(':');
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port =
      htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &addr.sin_addr);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  timeval tv{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    static const std::string kPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    std::string bytes;
    switch (h.Below(4)) {
      case 0:
        bytes = h.RandomBytes(1 + h.Below(512));
        break;
      case 1:
        bytes = kPreface.substr(0, h.Below(kPreface.size()));
        break;
      case 2:  // preface, then a frame header promising more than follows
        bytes = kPreface +
                std::string("\x00\x40\x00\x04\x00\x00\x00\x00\x00", 9) +
                h.RandomBytes(h.Below(64));
        break;
      default:
        bytes = kPreface + h.RandomBytes(1 + h.Below(256));
        break;
    }
    (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (h.Chance(0.3)) {
      char buf[256];
      (void)!::recv(fd, buf, sizeof(buf), 0);
    }
  }
  ::close(fd);
}

// One hostile request on `method`; returns the first message sent. Every
// kind of method is the same exchange on the wire (messages, a half-close,
// the answers, the status), sent through RawBidiCall over gRPC's public
// generic API; the kind decides how many messages go out and whether this
// side walks away.
std::string SendOne(grpc::GenericStub& stub, const Method& method, Hostile& h,
                    Tally& tally, double deadline) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, deadline);
  std::vector<std::string> messages;
  const bool streaming_in =
      method.kind == Kind::kClientStream || method.kind == Kind::kBidi;
  if (streaming_in && h.Chance(0.4)) {
    messages = h.NearValidStream(method);
  } else {
    const int n = streaming_in ? static_cast<int>(h.Below(5)) : 1;
    for (int i = 0; i < n; ++i) messages.push_back(h.Message_(method));
  }
  const std::string first = messages.empty() ? std::string() : messages[0];
  const bool cancel = streaming_in && h.Chance(0.05);
  depot::client_internal::RawBidiCall call(stub, method.name, &ctx);
  size_t sent = 0;
  for (const std::string& m : messages) {
    if (cancel && sent == messages.size() / 2) break;
    if (!call.Write(ToBuffer(m))) break;
    ++sent;
  }
  if (cancel) {
    ctx.TryCancel();
  } else {
    call.WritesDone();
  }
  grpc::ByteBuffer response;
  uint64_t answers = 0;
  while (call.Read(&response)) {
    if (method.kind == Kind::kServerStream && ++answers > 4 && h.Chance(0.1)) {
      ctx.TryCancel();  // walk away from a long answer
      break;
    }
  }
  const grpc::Status status = call.Finish();
  bool valid = true;
  for (const std::string& m : messages) {
    std::unique_ptr<Message> parsed(method.prototype->New());
    valid = valid && parsed->ParseFromString(m);
  }
  // A stream this tool cancelled ends CANCELLED by its own doing.
  tally.Add(method.name + std::string(cancel ? " (cancelled)" : ""), status,
            first, valid);
  return first;
}

// One message `bytes` on `method`, a half-close, every answer read and
// dropped: the call's status.
grpc::Status SendAndDrain(grpc::GenericStub& stub, const std::string& method,
                          grpc::ClientContext* ctx, const std::string& bytes) {
  depot::client_internal::RawBidiCall call(stub, method, ctx);
  call.Write(ToBuffer(bytes));
  call.WritesDone();
  grpc::ByteBuffer response;
  while (call.Read(&response)) {
  }
  return call.Finish();
}

// A message over the server's limit, to a random method.
void SendOversized(grpc::GenericStub& stub, const Method& method,
                   Tally& tally) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 30);
  const std::string big(kServerMaxMessageBytes + 1024, '\x01');
  tally.Add(method.name + std::string(" (oversized)"),
            SendAndDrain(stub, method.name, &ctx, big), "");
}

// ---------------------------------------------------------------------------
// Watching the server.

struct Rss {
  uint64_t rss = 0;
  uint64_t hwm = 0;
};

Rss ReadRss(int pid) {
  Rss out;
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    uint64_t kb = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %lu kB", &kb) == 1)
      out.rss = kb << 10;
    if (std::sscanf(line.c_str(), "VmHWM: %lu kB", &kb) == 1)
      out.hwm = kb << 10;
  }
  return out;
}

bool ProcessAlive(int pid) {
  if (::kill(pid, 0) != 0) return false;
  // A zombie (exited, not reaped) is not alive.
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  std::getline(in, stat);
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() ||
         stat[paren + 2] != 'Z';
}

struct Watch {
  std::atomic<bool> stop{false};
  std::atomic<bool> crashed{false};
  std::atomic<uint64_t> probes{0};
  std::atomic<uint64_t> hangs{0};
  std::atomic<uint64_t> rss_peak{0};
  std::atomic<uint64_t> hwm{0};
  std::mutex mu;
  std::vector<std::string> hang_notes;
};

void WatchServer(const std::string& address, int pid, const JobHandle& legit,
                 Watch& w) {
  auto channel = MakeChannel(address);
  auto health = grpc::health::v1::Health::NewStub(channel);
  auto depot = depot::v1::Depot::NewStub(channel);
  const double interval = absl::GetFlag(FLAGS_health_interval_seconds);
  const double hang = absl::GetFlag(FLAGS_hang_seconds);
  auto next_probe = std::chrono::steady_clock::now();
  while (!w.stop.load()) {
    if (pid > 0) {
      if (!ProcessAlive(pid)) {
        w.crashed = true;
        return;
      }
      const Rss rss = ReadRss(pid);
      w.rss_peak = std::max(w.rss_peak.load(), rss.rss);
      w.hwm = std::max(w.hwm.load(), rss.hwm);
    }
    if (std::chrono::steady_clock::now() >= next_probe) {
      next_probe +=
          std::chrono::microseconds(static_cast<int64_t>(interval * 1e6));
      grpc::ClientContext hctx;
      SetDeadline(&hctx, hang);
      grpc::health::v1::HealthCheckRequest hreq;
      hreq.set_service(kService);
      grpc::health::v1::HealthCheckResponse hresp;
      const grpc::Status hs = health->Check(&hctx, hreq, &hresp);
      grpc::ClientContext jctx;
      SetDeadline(&jctx, hang);
      depot::v1::GetJobRequest jreq;
      jreq.set_job_id(legit.id);
      depot::v1::JobStatus jresp;
      const grpc::Status js = depot->GetJob(&jctx, jreq, &jresp);
      ++w.probes;
      if (!hs.ok() ||
          hresp.status() != grpc::health::v1::HealthCheckResponse::SERVING ||
          !js.ok()) {
        ++w.hangs;
        std::lock_guard<std::mutex> lock(w.mu);
        if (w.hang_notes.size() < 10) {
          w.hang_notes.push_back(absl::StrCat(
              "health ", Tally::CodeName(hs.error_code()), " ",
              hs.error_message(), " serving=", hresp.status(), "; GetJob ",
              Tally::CodeName(js.error_code()), " ", js.error_message()));
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "depot-soak: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "sends hostile requests to a live depot-server and checks that it "
      "stays up and healthy, that a legitimate job is left untouched and "
      "that its memory stays within its budget (docs/fuzzing.md, \"The soak "
      "tool\").\n\n"
      "  depot-soak --requests=1000000 [--threads=8] "
      "[--memory_limit_bytes=N] [--server=HOST:PORT --server_pid=PID] "
      "[--json] [--fatal_internal]\n\n"
      "Without --server it starts the depot-server built beside it (or "
      "$DEPOT_SERVER_BINARY). Exits 1 when the server crashed or hung, the "
      "legitimate job changed or the RSS peak went over the budget plus "
      "--rss_slack_bytes; with --fatal_internal also on INTERNAL or UNKNOWN "
      "caused by input.");
  // --help lists this program's own flags, not Abseil's and gRPC's.
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::StrContains(path, "depot_soak");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  ::signal(SIGPIPE, SIG_IGN);
  // Hostile strings are not UTF-8, and protobuf would log each of them.
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  const uint64_t budget = absl::GetFlag(FLAGS_memory_limit_bytes);
  const uint64_t total = absl::GetFlag(FLAGS_requests);
  const int threads = std::max(1, absl::GetFlag(FLAGS_threads));
  const double deadline = absl::GetFlag(FLAGS_deadline_seconds);

  // A checkpoint directory for the server we start (and a path the hostile
  // ImportCheckpoint requests name).
  char dir_template[] = "/tmp/depot-soak-XXXXXX";
  const char* dir = ::mkdtemp(dir_template);
  if (dir == nullptr) return Fail("mkdtemp failed");
  const std::string checkpoint_dir = dir;

  std::unique_ptr<ServerProcess> server;
  std::string address = absl::GetFlag(FLAGS_server);
  int pid = absl::GetFlag(FLAGS_server_pid);
  if (address.empty()) {
    absl::StatusOr<std::unique_ptr<ServerProcess>> started =
        ServerProcess::Start({absl::StrCat("--memory_limit_bytes=", budget),
                              "--threads=2", "--nopin_threads",
                              "--checkpoint_dir=" + checkpoint_dir});
    if (!started.ok()) return Fail(started.status().ToString());
    server = *std::move(started);
    address = server->grpc_address();
    pid = server->pid();
  }

  auto channel = MakeChannel(address);
  auto stub = depot::v1::Depot::NewStub(channel);
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));

  if (!absl::GetFlag(FLAGS_send_method).empty()) {
    const std::string name =
        "/depot.v1.Depot/" + absl::GetFlag(FLAGS_send_method);
    std::ifstream in(absl::GetFlag(FLAGS_send_file), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), {});
    for (const Method& method : Methods()) {
      if (name != method.name) continue;
      grpc::ClientContext ctx;
      SetDeadline(&ctx, 60);
      grpc::GenericStub generic(channel);
      const grpc::Status status =
          SendAndDrain(generic, method.name, &ctx, bytes);
      std::this_thread::sleep_for(std::chrono::seconds(1));
      const bool alive = pid <= 0 || ProcessAlive(pid);
      const Rss rss = pid > 0 ? ReadRss(pid) : Rss{};
      std::printf(
          "%s (%zu bytes): %s \"%s\"; server %s, VmRSS %.1f MiB, "
          "VmHWM %.1f MiB\n",
          method.name, bytes.size(), Tally::CodeName(status.error_code()),
          status.error_message().c_str(),
          pid <= 0 ? "not watched"
          : alive  ? "alive"
                   : "DEAD",
          rss.rss / 1048576.0, rss.hwm / 1048576.0);
      if (!alive && server != nullptr) {
        absl::StatusOr<depot::testing::ProcessExit> exit =
            server->Wait(absl::Seconds(5));
        if (exit.ok()) {
          std::printf("server exit code %d, signal %d\n%s\n", exit->exit_code,
                      exit->signal, server->Log().c_str());
        }
      }
      return alive ? 0 : 1;
    }
    return Fail("no method " + name);
  }
  const auto t0 = std::chrono::steady_clock::now();

  // 1. The legitimate job: 40,000 parameters in 10 chunks, 3 steps.
  JobHandle legit;
  if (grpc::Status s =
          CreateJob(*stub, MakeSpec("soak-legit", 40000, 4096), &legit);
      !s.ok()) {
    return Fail("CreateJob(legit): " + s.error_message());
  }
  if (grpc::Status s = InitWeights(*stub, legit, rng); !s.ok()) {
    return Fail("InitWeights(legit): " + s.error_message());
  }
  for (uint64_t step = 1; step <= 3; ++step) {
    if (grpc::Status s = TrainStep(*stub, legit, step, rng); !s.ok()) {
      return Fail(absl::StrCat("Step(legit, ", step, "): ", s.error_message()));
    }
  }
  JobFingerprint before;
  if (grpc::Status s = ReadJob(*stub, legit, &before); !s.ok()) {
    return Fail("reading the legit job: " + s.error_message());
  }
  // 2. The victim job.
  JobHandle victim;
  if (grpc::Status s =
          CreateJob(*stub, MakeSpec("soak-victim", 2000, 256), &victim);
      !s.ok()) {
    return Fail("CreateJob(victim): " + s.error_message());
  }

  // 3. Hostile requests, 4. watched.
  Watch watch;
  std::thread watcher([&] { WatchServer(address, pid, legit, watch); });
  Tally tally;
  std::atomic<uint64_t> next{0};
  const std::vector<Method> methods = Methods();
  const uint64_t oversized_every = absl::GetFlag(FLAGS_oversized_every);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      Hostile h(absl::GetFlag(FLAGS_seed) * 1000003 + t, legit, victim,
                checkpoint_dir);
      auto ch = MakeChannel(address);
      auto stub = std::make_unique<grpc::GenericStub>(ch);
      uint64_t mine = 0;
      while (!watch.crashed.load()) {
        const uint64_t i = next.fetch_add(1);
        if (i >= total) break;
        if (++mine % 5000 == 0) {  // a new connection
          ch = MakeChannel(address);
          stub = std::make_unique<grpc::GenericStub>(ch);
        }
        if (oversized_every != 0 &&
            i % oversized_every == oversized_every / 2) {
          SendOversized(*stub, methods[h.Below(methods.size())], tally);
        } else if (h.Chance(0.01)) {
          SendRawGarbage(address, h);
          tally.AddRaw();
        } else {
          SendOne(*stub, methods[h.Below(methods.size())], h, tally, deadline);
        }
      }
    });
  }
  uint64_t last_print = 0;
  while (true) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const uint64_t done = tally.requests();
    if (done >= total || watch.crashed.load()) break;
    if (!absl::GetFlag(FLAGS_json) && done - last_print >= total / 20 + 1) {
      last_print = done;
      std::fprintf(
          stderr, "  %llu / %llu requests, %.0f s, rss %.1f MiB\n",
          static_cast<unsigned long long>(done),
          static_cast<unsigned long long>(total),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
              .count(),
          watch.rss_peak.load() / 1048576.0);
    }
  }
  for (std::thread& w : workers) w.join();
  const double hostile_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();

  // 5. The legitimate job again (a last probe first, so a server that died at
  // the end is seen).
  std::this_thread::sleep_for(std::chrono::milliseconds(
      static_cast<int64_t>(absl::GetFlag(FLAGS_health_interval_seconds) *
                           1000) +
      100));
  JobFingerprint after;
  grpc::Status after_status =
      watch.crashed.load()
          ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server crashed")
          : ReadJob(*stub, legit, &after);
  watch.stop = true;
  watcher.join();
  const bool checksum_equal = after_status.ok() && after == before;
  std::string server_exit;
  if (watch.crashed.load() && server != nullptr) {
    absl::StatusOr<depot::testing::ProcessExit> exit =
        server->Wait(absl::Seconds(5));
    if (exit.ok()) {
      server_exit = absl::StrCat("exit code ", exit->exit_code, ", signal ",
                                 exit->signal);
    }
    std::string log = server->Log();
    if (log.size() > 4000) log = log.substr(log.size() - 4000);
    server_exit += "\n--- server log (tail) ---\n" + log;
  }
  const uint64_t rss_peak = std::max(watch.rss_peak.load(), watch.hwm.load());
  const bool rss_ok =
      pid <= 0 || rss_peak <= budget + absl::GetFlag(FLAGS_rss_slack_bytes);
  uint64_t internal = 0, unknown = 0;
  for (const auto& [code, n] : tally.by_code_) {
    if (code == grpc::StatusCode::INTERNAL) internal += n;
    if (code == grpc::StatusCode::UNKNOWN) unknown += n;
  }
  const bool crashed = watch.crashed.load();
  const bool passed =
      !crashed && watch.hangs.load() == 0 && checksum_equal && rss_ok &&
      !(absl::GetFlag(FLAGS_fatal_internal) && internal + unknown > 0);

  if (absl::GetFlag(FLAGS_json)) {
    std::string j = absl::StrFormat(
        "{\"requests\": %d, \"raw_connections\": %d, \"seconds\": %.1f, "
        "\"threads\": %d, \"crashes\": %d, \"hangs\": %d, \"probes\": %d, "
        "\"internal\": %d, \"unknown\": %d, "
        "\"internal_unknown_on_valid_encodings\": %d, \"rss_peak_bytes\": %d, "
        "\"rss_budget_bytes\": %d, \"rss_slack_bytes\": %d, \"rss_ok\": %s, "
        "\"checksum_equal\": %s, \"passed\": %s, \"codes\": {",
        tally.requests_, tally.raw_, hostile_seconds, threads, crashed ? 1 : 0,
        watch.hangs.load(), watch.probes.load(), internal, unknown,
        tally.internal_unknown_on_valid_, rss_peak, budget,
        absl::GetFlag(FLAGS_rss_slack_bytes), rss_ok ? "true" : "false",
        checksum_equal ? "true" : "false", passed ? "true" : "false");
    bool first = true;
    for (const auto& [code, n] : tally.by_code_) {
      absl::StrAppendFormat(&j, "%s\"%s\": %d", first ? "" : ", ",
                            Tally::CodeName(code), n);
      first = false;
    }
    j += "}, \"by_method\": {";
    first = true;
    for (const auto& [method, codes] : tally.by_method_) {
      absl::StrAppendFormat(&j, "%s\"%s\": {", first ? "" : ", ",
                            JsonEscape(method));
      bool f2 = true;
      for (const auto& [code, n] : codes) {
        absl::StrAppendFormat(&j, "%s\"%s\": %d", f2 ? "" : ", ",
                              Tally::CodeName(code), n);
        f2 = false;
      }
      j += "}";
      first = false;
    }
    j += "}, \"internal_unknown_samples\": [";
    first = true;
    for (const Sample& s : tally.samples_) {
      absl::StrAppendFormat(&j,
                            "%s{\"method\": \"%s\", \"status\": \"%s\", "
                            "\"first_message_hex\": \"%s\"}",
                            first ? "" : ", ", JsonEscape(s.method),
                            JsonEscape(s.status), s.first_message_hex);
      first = false;
    }
    j += "]}";
    std::printf("%s\n", j.c_str());
  } else {
    std::printf("depot-soak against %s (pid %d), %d threads, seed %llu\n",
                address.c_str(), pid, threads,
                static_cast<unsigned long long>(absl::GetFlag(FLAGS_seed)));
    std::printf(
        "  requests          %llu (%llu raw TCP garbage) in %.1f s, "
        "%.0f/s\n",
        static_cast<unsigned long long>(tally.requests_),
        static_cast<unsigned long long>(tally.raw_), hostile_seconds,
        tally.requests_ / hostile_seconds);
    for (const auto& [code, n] : tally.by_code_) {
      const bool flag = code == grpc::StatusCode::INTERNAL ||
                        code == grpc::StatusCode::UNKNOWN;
      std::printf("  %-19s %llu%s\n", Tally::CodeName(code),
                  static_cast<unsigned long long>(n),
                  flag ? "   <-- flagged" : "");
    }
    std::printf("  per method:\n");
    for (const auto& [method, codes] : tally.by_method_) {
      std::string line;
      for (const auto& [code, n] : codes) {
        absl::StrAppend(&line, " ", Tally::CodeName(code), "=", n);
      }
      std::printf("    %-45s%s\n", method.c_str(), line.c_str());
    }
    std::printf(
        "  INTERNAL/UNKNOWN  %llu of them for requests that were valid "
        "encodings (the rest: malformed protobuf)\n",
        static_cast<unsigned long long>(tally.internal_unknown_on_valid_));
    std::printf("  crashes           %d%s\n", crashed ? 1 : 0,
                server_exit.empty() ? "" : (" (" + server_exit + ")").c_str());
    std::printf("  hangs             %llu of %llu probes\n",
                static_cast<unsigned long long>(watch.hangs.load()),
                static_cast<unsigned long long>(watch.probes.load()));
    for (const std::string& note : watch.hang_notes) {
      std::printf("    %s\n", note.c_str());
    }
    std::printf(
        "  RSS peak          %.1f MiB (budget %.1f MiB + %.1f MiB): %s\n",
        rss_peak / 1048576.0, budget / 1048576.0,
        absl::GetFlag(FLAGS_rss_slack_bytes) / 1048576.0,
        pid <= 0 ? "not measured"
        : rss_ok ? "ok"
                 : "OVER");
    std::printf(
        "  legit checksum    %s (state %016llx -> %016llx, weights "
        "%016llx -> %016llx, step %llu -> %llu)%s\n",
        checksum_equal ? "equal" : "CHANGED",
        static_cast<unsigned long long>(before.state_checksum),
        static_cast<unsigned long long>(after.state_checksum),
        static_cast<unsigned long long>(before.weights_hash),
        static_cast<unsigned long long>(after.weights_hash),
        static_cast<unsigned long long>(before.step),
        static_cast<unsigned long long>(after.step),
        after_status.ok() ? "" : (" " + after_status.error_message()).c_str());
    if (!tally.samples_.empty()) {
      std::printf(
          "  INTERNAL/UNKNOWN samples (method, status, first message):\n");
      for (const Sample& s : tally.samples_) {
        std::printf("    %s %s\n      %s\n", s.method.c_str(), s.status.c_str(),
                    s.first_message_hex.c_str());
      }
    }
    std::printf("  %s\n", passed ? "PASSED" : "FAILED");
  }
  std::error_code ec;
  std::filesystem::remove_all(checkpoint_dir, ec);
  return passed ? 0 : 1;
}
