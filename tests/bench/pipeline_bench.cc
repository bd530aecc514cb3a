#include "tests/bench/pipeline_bench.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "depot/client.h"
#include "depot/dtype.h"
#include "depot/job_config.h"
#include "depot/node_partition.h"
#include "gpu/host_collective.h"
#include "gpu/host_device.h"
#include "gpu/transfer_engine.h"
#include "server_process.h"
#include "tests/bench/bench_output.h"

ABSL_FLAG(uint64_t, pipeline_elems, uint64_t{32} << 20,
          "pipeline: elements of the job (one tensor, AdamW, fp32 master and "
          "moments on the servers).");
ABSL_FLAG(uint64_t, pipeline_chunk_elems, depot::kDefaultChunkElems,
          "pipeline: elements per chunk (the job's chunk_elems; a pinned "
          "slot holds one chunk).");
ABSL_FLAG(std::string, pipeline_dtype, "bf16",
          "pipeline: gradient and weight dtype, bf16 or fp32.");
ABSL_FLAG(int32_t, pipeline_servers, 2,
          "pipeline: depot-server processes on loopback the job is sharded "
          "over.");
ABSL_FLAG(int32_t, pipeline_server_threads, 1,
          "pipeline: update threads of each server.");
ABSL_FLAG(int32_t, pipeline_ranks, 1,
          "pipeline: local ranks of the one node (G), each a thread with its "
          "own throttled HostDevice, client and engine; G > 1 reduce-scatters "
          "and all-gathers between them (HostCollective).");
ABSL_FLAG(double, pipeline_link_gb_per_s, 0.5,
          "pipeline: each rank's emulated PCIe link, GB/s (1e9 bytes) in each "
          "direction: every host<->device copy takes bytes / this long.");
ABSL_FLAG(int32_t, pipeline_slots, 4,
          "pipeline: pinned slots of each of the engine's rings "
          "(TransferEngineOptions::d2h_slots and h2d_slots).");
ABSL_FLAG(uint64_t, pipeline_bucket_chunks, 0,
          "pipeline: chunks per bucket, a multiple of --pipeline_ranks (0: "
          "the engine's default, 4 per rank).");
ABSL_FLAG(int32_t, pipeline_streams, 1,
          "pipeline: the engine's step streams per server "
          "(TransferEngineOptions::streams_per_server).");
ABSL_FLAG(int32_t, pipeline_connections, 0,
          "pipeline: TCP connections per server of each client "
          "(ClientOptions::connections_per_server; 0: the client's default, "
          "at least --pipeline_streams). The plain Job::Step of the wire "
          "stage uses them all.");
ABSL_FLAG(bool, pipeline_trace, false,
          "pipeline: time every host<->device copy of the engine on rank 0 "
          "(a host function before and after each) and print where the step's "
          "time goes: trace_* fields, medians over the steps, in seconds from "
          "the step's start.");
ABSL_FLAG(double, pipeline_collective_timeout_s, 600,
          "pipeline: with --pipeline_ranks > 1, how long a collective of the "
          "node may wait for the other ranks "
          "(TransferEngineOptions::collective_timeout; 0: not watched, to "
          "time what the watch costs).");
ABSL_FLAG(int32_t, pipeline_steps, 10,
          "pipeline: rounds of (engine step, wire alone, D2H alone, H2D "
          "alone) timed after one warm-up round; medians are reported.");

namespace depot::bench {
namespace {

using gpu::Buffer;
using gpu::CopyKind;
using gpu::Device;
using gpu::Event;
using gpu::HostDevice;
using gpu::Stream;

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One host<->device copy the engine queued: when its stream reached it and
// when it finished.
struct CopySpan {
  CopyKind kind;
  Clock::time_point start, end;
};

// A Device that forwards to another and counts the pinned memory allocated
// through it: what the engine really holds, not what it says it holds. With
// tracing on, it also times every host<->device copy queued through it.
class ObservingDevice : public Device {
 public:
  explicit ObservingDevice(Device& inner, bool trace = false)
      : inner_(inner), trace_(trace) {}

  uint64_t pinned_live() const { return live_.load(); }
  uint64_t pinned_peak() const { return peak_.load(); }

  // The copies traced since the last call. REQUIRES: the streams are idle.
  std::vector<CopySpan> TakeSpans() {
    absl::MutexLock lock(&mu_);
    std::vector<CopySpan> spans;
    spans.swap(spans_);
    return spans;
  }

  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes) override {
    return inner_.Allocate(bytes);
  }
  absl::StatusOr<std::unique_ptr<Buffer>> AllocatePinned(
      size_t bytes) override {
    absl::StatusOr<std::unique_ptr<Buffer>> buffer =
        inner_.AllocatePinned(bytes);
    if (!buffer.ok()) return buffer.status();
    const uint64_t live = live_.fetch_add(bytes) + bytes;
    uint64_t peak = peak_.load();
    while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
    }
    return std::unique_ptr<Buffer>(
        new Counted(*std::move(buffer), &live_));
  }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    return inner_.CreateStream();
  }
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    return inner_.CreateEvent();
  }
  absl::Status CopyAsync(Stream& stream, void* dst, const void* src,
                         size_t bytes, CopyKind kind) override {
    if (!trace_ || kind == CopyKind::kDeviceToDevice)
      return inner_.CopyAsync(stream, dst, src, bytes, kind);
    size_t index;
    {
      absl::MutexLock lock(&mu_);
      index = spans_.size();
      spans_.push_back(CopySpan{kind, {}, {}});
    }
    absl::Status s = inner_.LaunchHostFunc(stream, [this, index] {
      absl::MutexLock lock(&mu_);
      spans_[index].start = Clock::now();
    });
    if (s.ok()) s = inner_.CopyAsync(stream, dst, src, bytes, kind);
    if (s.ok()) {
      s = inner_.LaunchHostFunc(stream, [this, index] {
        absl::MutexLock lock(&mu_);
        spans_[index].end = Clock::now();
      });
    }
    return s;
  }
  absl::Status Record(Event& event, Stream& stream) override {
    return inner_.Record(event, stream);
  }
  absl::Status Wait(Stream& stream, Event& event) override {
    return inner_.Wait(stream, event);
  }
  absl::Status Synchronize(Event& event) override {
    return inner_.Synchronize(event);
  }
  absl::StatusOr<bool> Query(Event& event) override {
    return inner_.Query(event);
  }
  absl::Status SynchronizeStream(Stream& stream) override {
    return inner_.SynchronizeStream(stream);
  }
  absl::Status LaunchHostFunc(Stream& stream,
                              std::function<void()> fn) override {
    return inner_.LaunchHostFunc(stream, std::move(fn));
  }
  absl::Status CheckHostAccess(const void* data, size_t bytes,
                               bool write) override {
    return inner_.CheckHostAccess(data, bytes, write);
  }

 private:
  // The inner buffer, which uncounts itself when freed.
  class Counted : public Buffer {
   public:
    Counted(std::unique_ptr<Buffer> inner, std::atomic<uint64_t>* live)
        : Buffer(inner->data(), inner->bytes()),
          inner_(std::move(inner)),
          live_(live) {}
    ~Counted() override { live_->fetch_sub(bytes()); }

   private:
    std::unique_ptr<Buffer> inner_;
    std::atomic<uint64_t>* live_;
  };

  Device& inner_;
  const bool trace_;
  std::atomic<uint64_t> live_{0};
  std::atomic<uint64_t> peak_{0};
  absl::Mutex mu_;
  std::vector<CopySpan> spans_ ABSL_GUARDED_BY(mu_);
};

// Small nonzero values of both signs, as `dtype`, different per `seed`.
std::string MakeValues(uint64_t n, DType dtype, uint32_t seed) {
  const size_t size = DTypeSize(dtype);
  std::string bytes(n * size, '\0');
  uint64_t state = 0x9E3779B97F4A7C15ull * (seed + 1);
  for (uint64_t i = 0; i < n; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    float value = (static_cast<float>(state >> 40) / 16777216.0f - 0.5f) * 1e-2f;
    if (value == 0.0f) value = 1e-4f;
    if (dtype == DType::kBFloat16) {
      const uint16_t bits = FloatToBFloat16(value);
      std::memcpy(bytes.data() + i * size, &bits, size);
    } else {
      std::memcpy(bytes.data() + i * size, &value, size);
    }
  }
  return bytes;
}

// One local rank: its throttled device, its client and job, its engine, and
// what the stages alone copy with.
struct Rank {
  uint32_t index = 0;
  // The rank's device (a throttled HostDevice, or a GPU), and the same as a
  // HostDevice when it is one (its checks are read at the end).
  std::unique_ptr<Device> host;
  HostDevice* host_device = nullptr;
  std::unique_ptr<ObservingDevice> device;  // the engine's view of host
  std::unique_ptr<gpu::Collective> collective;
  std::unique_ptr<Client> client;
  std::unique_ptr<Job> job;
  std::unique_ptr<gpu::TransferEngine> engine;
  std::unique_ptr<Stream> compute;  // the trainer's stream
  std::unique_ptr<Stream> copies;   // the stages alone
  // Device memory: the rank's gradients as backward left them (rewritten
  // into the engine's grads() before each step when the reduce-scatter
  // overwrote them), and weights for the H2D stage alone.
  std::unique_ptr<Buffer> pristine;
  std::unique_ptr<Buffer> stage_weights;
  // Pinned: `slots` chunks, the stages' staging ring.
  std::unique_ptr<Buffer> staging;
  std::string host_grads;  // the same gradients, in host memory
  std::vector<uint64_t> owned;  // the chunks this rank sends, bucket order
  uint64_t grad_bytes = 0;
  uint64_t weight_bytes = 0;
  uint64_t pinned_after_create = 0;
};

// Runs `body(rank)` on one thread per rank and returns the first error.
absl::Status OnEveryRank(std::vector<std::unique_ptr<Rank>>& ranks,
                         const std::function<absl::Status(Rank&)>& body) {
  if (ranks.size() == 1) return body(*ranks[0]);
  std::vector<absl::Status> statuses(ranks.size());
  std::vector<std::thread> threads;
  for (size_t g = 0; g < ranks.size(); ++g) {
    threads.emplace_back([&, g] { statuses[g] = body(*ranks[g]); });
  }
  for (std::thread& thread : threads) thread.join();
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// The engine's whole step, as a trainer drives it: backward has written the
// gradients (they are in grads() already), names the buckets last to first;
// the next forward waits for each bucket's weights first to last.
absl::Status EngineStep(Rank& rank, uint64_t step) {
  gpu::TransferEngine& engine = *rank.engine;
  const uint64_t buckets = engine.partition().num_buckets();
  if (absl::Status s = engine.BeginStep(step, StepOptions()); !s.ok())
    return s;
  for (uint64_t b = buckets; b-- > 0;) {
    if (absl::Status s = engine.GradientsReady(b, *rank.compute); !s.ok())
      return s;
  }
  for (uint64_t b = 0; b < buckets; ++b) {
    if (absl::Status s = engine.WaitWeights(b, *rank.compute); !s.ok())
      return s;
  }
  absl::StatusOr<StepResult> result = engine.FinishStep();
  if (!result.ok()) return result.status();
  if (absl::Status s = rank.host->SynchronizeStream(*rank.compute); !s.ok())
    return s;
  if (result->chunks != rank.owned.size() || result->skipped) {
    return absl::InternalError(absl::StrCat(
        "rank ", rank.index, " step ", step, ": ", result->chunks,
        " chunks of weights for ", rank.owned.size(), " sent, skipped ",
        result->skipped));
  }
  return absl::OkStatus();
}

// The link alone: the rank's chunks over its throttled device, chunk by
// chunk through the staging ring, one stream (one copy engine), as the
// engine's D2H (to_host) or H2D stream copies them.
absl::Status LinkAlone(Rank& rank, bool to_host, int slots) {
  const NodePartition& partition = rank.engine->partition();
  const Job& job = *rank.job;
  const size_t size = DTypeSize(to_host ? job.config().grad_dtype
                                        : job.config().weight_dtype);
  const size_t slot_bytes = partition.chunk_elems() * size;
  char* staging = static_cast<char*>(rank.staging->data());
  char* device = static_cast<char*>(
      to_host ? rank.engine->grads() : rank.stage_weights->data());
  for (size_t i = 0; i < rank.owned.size(); ++i) {
    const uint64_t c = rank.owned[i];
    char* host = staging + (i % slots) * slot_bytes;
    char* dev = device + c * partition.chunk_elems() * size;
    const size_t bytes = job.plan().chunk(c).size() * size;
    absl::Status s =
        to_host ? rank.host->CopyAsync(*rank.copies, host, dev, bytes,
                                       CopyKind::kDeviceToHost)
                : rank.host->CopyAsync(*rank.copies, dev, host, bytes,
                                       CopyKind::kHostToDevice);
    if (!s.ok()) return s;
  }
  return rank.host->SynchronizeStream(*rank.copies);
}

// One stage's timed rounds: wall seconds, and CPU seconds of this process and
// the servers together.
class Stage {
 public:
  explicit Stage(std::vector<pid_t> servers) : servers_(std::move(servers)) {}

  absl::Status Time(bool keep, const std::function<absl::Status()>& body) {
    const double cpu = Cpu();
    const Clock::time_point start = Clock::now();
    if (absl::Status s = body(); !s.ok()) return s;
    if (keep) {
      wall_.push_back(SecondsSince(start));
      cpu_.push_back(Cpu() - cpu);
    }
    return absl::OkStatus();
  }
  double wall() const { return Median(wall_); }
  double cpu() const { return Median(cpu_); }

 private:
  double Cpu() const {
    double total = ProcessCpuSeconds(getpid());
    for (const pid_t pid : servers_) total += ProcessCpuSeconds(pid);
    return total;
  }

  const std::vector<pid_t> servers_;
  std::vector<double> wall_, cpu_;
};

int UsableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

absl::StatusOr<DType> ParseDType(const std::string& name) {
  if (name == "bf16") return DType::kBFloat16;
  if (name == "fp32") return DType::kFloat32;
  return absl::InvalidArgumentError(absl::StrCat(
      "--pipeline_dtype=", name, " is not one of bf16, fp32"));
}

// The engine options every rank (and the quarter-size check) uses.
gpu::TransferEngineOptions EngineOptions(const PipelineBenchOptions& options,
                                         uint32_t rank) {
  gpu::TransferEngineOptions engine;
  engine.local_rank = rank;
  engine.local_ranks = static_cast<uint32_t>(options.local_ranks);
  engine.bucket_chunks = options.bucket_chunks;
  engine.d2h_slots = options.slots;
  engine.h2d_slots = options.slots;
  engine.streams_per_server = options.streams_per_server;
  engine.collective_timeout = absl::Seconds(options.collective_timeout_s);
  return engine;
}

JobConfig PipelineJob(const std::string& name, uint64_t elems,
                      const PipelineBenchOptions& options, DType dtype) {
  JobConfig config;
  config.name = name;
  config.tensors = {{"w", elems, 0}};
  config.optimizer.kind = OptimizerKind::kAdamW;
  config.grad_dtype = dtype;
  config.weight_dtype = dtype;
  config.chunk_elems = options.chunk_elems;
  config.num_servers = static_cast<uint32_t>(options.servers);
  return config;
}

// Sets up rank `g` of the node: device, client, job, engine, buffers.
absl::Status SetUpRank(const PipelineBenchOptions& options,
                       const ClientOptions& client_options,
                       const JobConfig& config,
                       gpu::HostCollectiveGroup* group,
                       const DeviceFactory& make_device, Rank& rank) {
  absl::StatusOr<std::unique_ptr<Device>> device =
      make_device(static_cast<int>(rank.index));
  if (!device.ok()) return device.status();
  rank.host = *std::move(device);
  rank.host_device = dynamic_cast<HostDevice*>(rank.host.get());
  rank.device = std::make_unique<ObservingDevice>(
      *rank.host, options.trace && rank.index == 0);
  if (group != nullptr) {
    rank.collective = group->Join(static_cast<int>(rank.index), *rank.device);
  }
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect(client_options);
  if (!client.ok()) return client.status();
  rank.client = *std::move(client);
  if (absl::Status s = rank.client->WaitForServers(absl::Seconds(60));
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<Job>> job = rank.client->OpenJob(config, 0);
  if (!job.ok()) return job.status();
  rank.job = *std::move(job);
  absl::StatusOr<std::unique_ptr<gpu::TransferEngine>> engine =
      gpu::TransferEngine::Create(*rank.job, *rank.device,
                                  rank.collective.get(),
                                  EngineOptions(options, rank.index));
  if (!engine.ok()) return engine.status();
  rank.engine = *std::move(engine);
  rank.pinned_after_create = rank.device->pinned_live();

  const NodePartition& partition = rank.engine->partition();
  const size_t gsize = DTypeSize(config.grad_dtype);
  const size_t wsize = DTypeSize(config.weight_dtype);
  for (uint64_t b = 0; b < partition.num_buckets(); ++b) {
    const ChunkSpan owned = partition.owned(b, rank.index);
    for (uint64_t c = owned.first; c < owned.end; ++c) {
      rank.owned.push_back(c);
      const uint64_t elems = rank.job->plan().chunk(c).size();
      rank.grad_bytes += elems * gsize;
      rank.weight_bytes += elems * wsize;
    }
  }
  for (std::unique_ptr<Stream>* stream : {&rank.compute, &rank.copies}) {
    absl::StatusOr<std::unique_ptr<Stream>> created =
        rank.host->CreateStream();
    if (!created.ok()) return created.status();
    *stream = *std::move(created);
  }
  const uint64_t padded = partition.padded_elems();
  absl::StatusOr<std::unique_ptr<Buffer>> buffer =
      rank.host->Allocate(padded * gsize);
  if (!buffer.ok()) return buffer.status();
  rank.pristine = *std::move(buffer);
  buffer = rank.host->Allocate(padded * wsize);
  if (!buffer.ok()) return buffer.status();
  rank.stage_weights = *std::move(buffer);
  buffer = rank.host->AllocatePinned(partition.chunk_elems() *
                                     std::max(gsize, wsize) * options.slots);
  if (!buffer.ok()) return buffer.status();
  rank.staging = *std::move(buffer);

  // Backward's output, once: host -> device (over the link, untimed), then
  // on the device into the engine's gradient buffer.
  const uint64_t n = rank.job->total_elems();
  rank.host_grads = MakeValues(n, config.grad_dtype, rank.index);
  absl::Status s =
      rank.host->CopyAsync(*rank.compute, rank.pristine->data(),
                           rank.host_grads.data(), n * gsize,
                           CopyKind::kHostToDevice);
  if (s.ok()) {
    s = rank.host->CopyAsync(*rank.compute, rank.engine->grads(),
                             rank.pristine->data(), n * gsize,
                             CopyKind::kDeviceToDevice);
  }
  if (s.ok()) s = rank.host->SynchronizeStream(*rank.compute);
  return s;
}

// Rewrites the gradients a reduce-scatter overwrote (G > 1): what the next
// backward would do, on the device and before the step's clock starts.
absl::Status RestoreGradients(Rank& rank) {
  const uint64_t bytes =
      rank.job->total_elems() * DTypeSize(rank.job->config().grad_dtype);
  absl::Status s = rank.host->CopyAsync(*rank.compute, rank.engine->grads(),
                                        rank.pristine->data(), bytes,
                                        CopyKind::kDeviceToDevice);
  if (s.ok()) s = rank.host->SynchronizeStream(*rank.compute);
  return s;
}

// The pinned bytes an engine with `options` holds for a job of `elems`
// elements on the same servers: opened, measured, closed and deleted.
absl::StatusOr<uint64_t> PinnedForJob(const PipelineBenchOptions& options,
                                      const JobConfig& config, Rank& rank) {
  absl::StatusOr<std::unique_ptr<Job>> job = rank.client->OpenJob(config, 0);
  if (!job.ok()) return job.status();
  uint64_t pinned = 0;
  {
    ObservingDevice counting(*rank.host);
    absl::StatusOr<std::unique_ptr<gpu::TransferEngine>> engine =
        gpu::TransferEngine::Create(**job, counting, rank.collective.get(),
                                    EngineOptions(options, rank.index));
    if (!engine.ok()) return engine.status();
    pinned = counting.pinned_live();
    if ((*engine)->pinned_bytes() != pinned) {
      return absl::InternalError(absl::StrCat(
          "an engine says it holds ", (*engine)->pinned_bytes(),
          " pinned bytes and allocated ", pinned));
    }
  }
  if (absl::Status s = (*job)->Delete(); !s.ok()) return s;
  return pinned;
}

// Where one engine step's time went on rank 0, in seconds from its start:
// each direction's first copy start, last copy end, time copying, and time
// idle between its first and last copy (waiting for a slot, for the wire,
// for an event); and the step's end.
struct StepTrace {
  std::vector<double> d2h_start, d2h_end, d2h_busy, d2h_gaps;
  std::vector<double> h2d_start, h2d_end, h2d_busy, h2d_gaps;
  std::vector<double> tail;  // step end - last H2D end

  void Add(const std::vector<CopySpan>& spans, Clock::time_point begin,
           Clock::time_point end) {
    const auto since = [begin](Clock::time_point t) {
      return std::chrono::duration<double>(t - begin).count();
    };
    for (const CopyKind kind :
         {CopyKind::kDeviceToHost, CopyKind::kHostToDevice}) {
      double first = 1e30, last = 0, busy = 0;
      for (const CopySpan& span : spans) {
        if (span.kind != kind) continue;
        first = std::min(first, since(span.start));
        last = std::max(last, since(span.end));
        busy += std::chrono::duration<double>(span.end - span.start).count();
      }
      if (first > last) continue;  // no copies that way
      const bool d2h = kind == CopyKind::kDeviceToHost;
      (d2h ? d2h_start : h2d_start).push_back(first);
      (d2h ? d2h_end : h2d_end).push_back(last);
      (d2h ? d2h_busy : h2d_busy).push_back(busy);
      (d2h ? d2h_gaps : h2d_gaps).push_back(last - first - busy);
      if (!d2h) tail.push_back(since(end) - last);
    }
  }

  void AppendTo(ResultLine& line) const {
    if (d2h_start.empty() || h2d_start.empty()) return;
    line.numbers.insert(line.numbers.end(),
                        {{"trace_d2h_start_s", Median(d2h_start)},
                         {"trace_d2h_end_s", Median(d2h_end)},
                         {"trace_d2h_busy_s", Median(d2h_busy)},
                         {"trace_d2h_gaps_s", Median(d2h_gaps)},
                         {"trace_h2d_start_s", Median(h2d_start)},
                         {"trace_h2d_end_s", Median(h2d_end)},
                         {"trace_h2d_busy_s", Median(h2d_busy)},
                         {"trace_h2d_gaps_s", Median(h2d_gaps)},
                         {"trace_tail_s", Median(tail)}});
  }
};

absl::StatusOr<PipelineFigures> Measure(const PipelineBenchOptions& options,
                                        DType dtype,
                                        const DeviceFactory& make_device,
                                        const std::string& device_name) {
  std::vector<std::unique_ptr<testing::ServerProcess>> servers;
  std::vector<pid_t> pids;
  ClientOptions client_options;
  for (int s = 0; s < options.servers; ++s) {
    absl::StatusOr<std::unique_ptr<testing::ServerProcess>> server =
        testing::ServerProcess::Start(
            {absl::StrCat("--threads=", options.server_threads)});
    if (!server.ok()) return server.status();
    client_options.servers.push_back((*server)->grpc_address());
    pids.push_back((*server)->pid());
    servers.push_back(*std::move(server));
  }
  client_options.connections_per_server =
      options.connections > 0
          ? options.connections
          : std::max(client_options.connections_per_server,
                     options.streams_per_server);

  const JobConfig config =
      PipelineJob("pipeline-bench", options.elems, options, dtype);
  std::shared_ptr<gpu::HostCollectiveGroup> group;
  if (options.local_ranks > 1)
    group = gpu::HostCollectiveGroup::Create(options.local_ranks);
  // Declared after the servers: destroyed before them.
  std::vector<std::unique_ptr<Rank>> ranks;
  for (int g = 0; g < options.local_ranks; ++g) {
    ranks.push_back(std::make_unique<Rank>());
    ranks.back()->index = static_cast<uint32_t>(g);
  }
  for (std::unique_ptr<Rank>& rank : ranks) {
    if (absl::Status s =
            SetUpRank(options, client_options, config, group.get(),
                      make_device, *rank);
        !s.ok()) {
      return s;
    }
  }
  Rank& first = *ranks[0];
  const NodePartition& partition = first.engine->partition();
  const size_t size = DTypeSize(dtype);
  // Pinned memory as stated: slots x chunk bytes, for each ring.
  const uint64_t stated = static_cast<uint64_t>(options.slots) *
                          partition.chunk_elems() * (size + size);
  // A job a quarter the size (at least one chunk per rank), which must need
  // no less and no more.
  const uint64_t quarter_elems = std::max<uint64_t>(
      options.elems / 4, options.chunk_elems * options.local_ranks);
  absl::StatusOr<uint64_t> quarter_pinned = PinnedForJob(
      options,
      PipelineJob("pipeline-bench-quarter", quarter_elems, options, dtype),
      first);
  if (!quarter_pinned.ok()) return quarter_pinned.status();

  // The wire and the servers alone: a plain Job::Step of the node's whole
  // gradient from host memory, through rank 0's client.
  std::string wire_weights(first.job->total_elems() * size, '\0');
  StepResult wire_result;

  Stage step(pids), wire(pids), d2h(pids), h2d(pids);
  StepTrace trace;
  uint64_t next_step = 1;
  // Round 0 is the warm-up (first touch of buffers and connections); the
  // rounds interleave the four so that the machine's noise falls on all.
  for (int round = 0; round <= options.steps; ++round) {
    const bool keep = round > 0;
    if (options.local_ranks > 1) {
      for (std::unique_ptr<Rank>& rank : ranks) {
        if (absl::Status s = RestoreGradients(*rank); !s.ok()) return s;
      }
    }
    const uint64_t engine_step = next_step++;
    const Clock::time_point begin = Clock::now();
    absl::Status status = step.Time(keep, [&] {
      return OnEveryRank(ranks,
                         [&](Rank& rank) { return EngineStep(rank, engine_step); });
    });
    if (!status.ok()) return status;
    const Clock::time_point end = Clock::now();
    if (keep && options.trace) trace.Add(first.device->TakeSpans(), begin, end);
    if (!keep) first.device->TakeSpans();
    const uint64_t wire_step = next_step++;
    status = wire.Time(keep, [&] {
      return first.job->Step(wire_step, first.host_grads.data(),
                             wire_weights.data(), &wire_result);
    });
    if (!status.ok()) return status;
    if (wire_result.two_phase || wire_result.skipped ||
        wire_result.chunks != first.job->plan().num_chunks()) {
      return absl::InternalError(absl::StrCat(
          "wire step ", wire_step, ": ", wire_result.chunks, " chunks of ",
          first.job->plan().num_chunks(), ", two_phase ",
          wire_result.two_phase, ", skipped ", wire_result.skipped));
    }
    status = d2h.Time(keep, [&] {
      return OnEveryRank(ranks, [&](Rank& rank) {
        return LinkAlone(rank, /*to_host=*/true, options.slots);
      });
    });
    if (!status.ok()) return status;
    status = h2d.Time(keep, [&] {
      return OnEveryRank(ranks, [&](Rank& rank) {
        return LinkAlone(rank, /*to_host=*/false, options.slots);
      });
    });
    if (!status.ok()) return status;
  }

  // What the HostDevice and the collectives saw must be clean: a bench of an
  // engine that reuses a slot too early measures nothing.
  uint64_t pinned_peak = 0;
  for (std::unique_ptr<Rank>& rank : ranks) {
    const std::vector<std::string> violations =
        rank->host_device != nullptr ? rank->host_device->violations()
                                     : std::vector<std::string>();
    if (!violations.empty()) {
      return absl::InternalError(
          absl::StrCat("rank ", rank->index, ": ", violations.size(),
                       " host-access violations, the first: ", violations[0]));
    }
    if (rank->engine->pinned_bytes() != first.engine->pinned_bytes() ||
        rank->device->pinned_peak() != first.device->pinned_peak()) {
      return absl::InternalError(absl::StrCat(
          "rank ", rank->index, " holds other pinned memory than rank 0"));
    }
    pinned_peak = std::max(pinned_peak, rank->device->pinned_peak());
  }
  if (group != nullptr && !group->errors().empty()) {
    return absl::InternalError(absl::StrCat(
        "collective mismatch: ", absl::StrJoin(group->errors(), "; ")));
  }

  const double slowest = std::max({d2h.wall(), h2d.wall(), wire.wall()});
  const char* slowest_name = slowest == wire.wall()  ? "wire"
                             : slowest == d2h.wall() ? "d2h"
                                                     : "h2d";
  const double wire_bytes =
      static_cast<double>(first.job->total_elems()) * size;
  ResultLine line;
  line.bench = "pipeline";
  line.text = {{"device", device_name},
               {"dtype", options.dtype},
               {"slowest", slowest_name}};
  line.numbers = {
      {"elems", static_cast<double>(options.elems)},
      {"chunk_elems", static_cast<double>(options.chunk_elems)},
      {"chunks", static_cast<double>(first.job->plan().num_chunks())},
      {"bucket_chunks", static_cast<double>(partition.bucket_chunks())},
      {"buckets", static_cast<double>(partition.num_buckets())},
      {"servers", static_cast<double>(options.servers)},
      {"local_ranks", static_cast<double>(options.local_ranks)},
      {"collective_timeout_s", options.collective_timeout_s},
      {"slots", static_cast<double>(options.slots)},
      {"streams_per_server", static_cast<double>(options.streams_per_server)},
      {"connections",
       static_cast<double>(client_options.connections_per_server)},
      {"steps", static_cast<double>(options.steps)},
      {"cores", static_cast<double>(UsableCores())}};
  if (first.host_device != nullptr) {
    // The throttled link, and its nominal times beside the measured ones.
    const double link = options.link_gb_per_s * 1e9;
    line.numbers.insert(line.numbers.end(),
                        {{"link_gb_per_s", options.link_gb_per_s},
                         {"rank_grad_bytes", static_cast<double>(first.grad_bytes)},
                         {"rank_weight_bytes",
                          static_cast<double>(first.weight_bytes)},
                         {"link_d2h_s", first.grad_bytes / link},
                         {"link_h2d_s", first.weight_bytes / link}});
  } else {
    line.numbers.insert(
        line.numbers.end(),
        {{"rank_grad_bytes", static_cast<double>(first.grad_bytes)},
         {"rank_weight_bytes", static_cast<double>(first.weight_bytes)}});
  }
  line.numbers.insert(line.numbers.end(), {
      {"d2h_s", d2h.wall()},
      {"h2d_s", h2d.wall()},
      {"wire_s", wire.wall()},
      {"step_s", step.wall()},
      // Gradient payload per second through the wire stage alone.
      {"wire_gb_per_s", wire_bytes / wire.wall() / 1e9},
      // CPU seconds (this process and the servers) of the step and of the
      // wire alone: the engine's extra copies show here.
      {"step_cpu_s", step.cpu()},
      {"wire_cpu_s", wire.cpu()},
      {"model_grad_bytes", wire_bytes},
      {"pinned_stated_bytes", static_cast<double>(stated)},
      {"pinned_bytes", static_cast<double>(first.engine->pinned_bytes())},
      {"pinned_allocated_bytes", static_cast<double>(first.pinned_after_create)},
      {"pinned_peak_bytes", static_cast<double>(pinned_peak)},
      {"quarter_model_elems", static_cast<double>(quarter_elems)},
      {"pinned_quarter_model_bytes", static_cast<double>(*quarter_pinned)},
      {"ratio", step.wall() / slowest},
  });
  trace.AppendTo(line);
  PipelineFigures figures;
  figures.line = std::move(line);
  figures.step_s = step.wall();
  figures.d2h_s = d2h.wall();
  figures.h2d_s = h2d.wall();
  figures.wire_s = wire.wall();
  figures.rank_grad_bytes = first.grad_bytes;
  figures.rank_weight_bytes = first.weight_bytes;
  return figures;
}

absl::Status ValidateOptions(const PipelineBenchOptions& options) {
  if (absl::StatusOr<DType> dtype = ParseDType(options.dtype); !dtype.ok())
    return dtype.status();
  if (options.elems == 0 || options.chunk_elems == 0 || options.servers < 1 ||
      options.server_threads < 1 || options.local_ranks < 1 ||
      !(options.link_gb_per_s > 0) || options.slots < 1 ||
      options.streams_per_server < 1 || options.connections < 0 ||
      options.steps < 1) {
    return absl::InvalidArgumentError(
        "--pipeline_elems, --pipeline_chunk_elems, --pipeline_servers, "
        "--pipeline_server_threads, --pipeline_ranks, "
        "--pipeline_link_gb_per_s, --pipeline_slots, --pipeline_streams and "
        "--pipeline_steps must be positive, --pipeline_connections >= 0");
  }
  if (!(options.collective_timeout_s >= 0)) {
    return absl::InvalidArgumentError(
        "--pipeline_collective_timeout_s must be >= 0 (0: not watched)");
  }
  if (options.bucket_chunks % options.local_ranks != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pipeline_bucket_chunks=", options.bucket_chunks,
        " is not a multiple of --pipeline_ranks=", options.local_ranks));
  }
  if (options.connections > 0 &&
      options.connections < options.streams_per_server) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pipeline_connections=", options.connections,
        " is fewer than --pipeline_streams=", options.streams_per_server));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PipelineFigures> MeasurePipeline(
    const PipelineBenchOptions& options, const DeviceFactory& make_device,
    const std::string& device_name) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  return Measure(options, *ParseDType(options.dtype), make_device,
                 device_name);
}

absl::Status RunPipelineBench(const PipelineBenchOptions& options) {
  const double link = options.link_gb_per_s * 1e9;
  absl::StatusOr<PipelineFigures> figures = MeasurePipeline(
      options,
      [link](int) -> absl::StatusOr<std::unique_ptr<Device>> {
        HostDevice::Options device_options;
        device_options.copy_bytes_per_second = link;
        return std::make_unique<HostDevice>(device_options);
      },
      "host (HostDevice, host<->device copies throttled)");
  if (!figures.ok()) return figures.status();
  figures->line.Print(options.json);
  return absl::OkStatus();
}

absl::Status RunPipelineCommand(bool json) {
  PipelineBenchOptions options;
  options.elems = absl::GetFlag(FLAGS_pipeline_elems);
  options.chunk_elems = absl::GetFlag(FLAGS_pipeline_chunk_elems);
  options.dtype = absl::GetFlag(FLAGS_pipeline_dtype);
  options.servers = absl::GetFlag(FLAGS_pipeline_servers);
  options.server_threads = absl::GetFlag(FLAGS_pipeline_server_threads);
  options.local_ranks = absl::GetFlag(FLAGS_pipeline_ranks);
  options.link_gb_per_s = absl::GetFlag(FLAGS_pipeline_link_gb_per_s);
  options.slots = absl::GetFlag(FLAGS_pipeline_slots);
  options.bucket_chunks = absl::GetFlag(FLAGS_pipeline_bucket_chunks);
  options.streams_per_server = absl::GetFlag(FLAGS_pipeline_streams);
  options.connections = absl::GetFlag(FLAGS_pipeline_connections);
  options.steps = absl::GetFlag(FLAGS_pipeline_steps);
  options.collective_timeout_s =
      absl::GetFlag(FLAGS_pipeline_collective_timeout_s);
  options.trace = absl::GetFlag(FLAGS_pipeline_trace);
  options.json = json;
  return RunPipelineBench(options);
}

}  // namespace depot::bench
