#include "server/depot_service.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "server/blocking_call.h"
#include "server/checkpoint_import.h"
#include "wire/wire.h"

namespace depot {
namespace {

constexpr const char* kRpcNames[kNumRpcs] = {
    "CreateJob", "InitWeights", "Step",        "PullWeights",
    "GetJob",    "DeleteJob",   "ExportState", "ImportState",
    "Checkpoint", "ListCheckpoints", "RollBack",
    "ImportCheckpoint", "ServerStatus", "Drain"};

void Log(const std::string& line) {
  std::fprintf(stderr, "depot-server: %s\n", line.c_str());
}

// The RPCs whose every call, allowed or refused, gets an audit line: those
// that create, read or change a job's state (docs/security.md, "Audit").
bool Audited(Rpc rpc) {
  switch (rpc) {
    case Rpc::kCreateJob:
    case Rpc::kInitWeights:
    case Rpc::kPullWeights:
    case Rpc::kDeleteJob:
    case Rpc::kExportState:
    case Rpc::kImportState:
    case Rpc::kCheckpoint:
    case Rpc::kRollBack:
    case Rpc::kImportCheckpoint:
    case Rpc::kDrain:
      return true;
    default:
      return false;
  }
}

// The largest request a unary or server-streaming method takes, checked
// before the request is parsed (a parse copies what it keeps, unknown fields
// too). Those of fixed fields (ids, a fingerprint, steps, a range) are a few
// dozen bytes; CreateJob's spec and ImportCheckpoint's directories may be
// large, and keep the server's message limit (daemon.cc).
size_t MaxRequestBytes(Rpc rpc) {
  switch (rpc) {
    case Rpc::kCreateJob:
    case Rpc::kImportCheckpoint:
      return std::numeric_limits<size_t>::max();
    default:
      return kMaxFixedFieldRequestBytes;
  }
}

}  // namespace

DepotService::DepotService(JobStore* jobs, ServerMetrics* metrics,
                           Checkpointer* checkpointer, const TenantAuth* auth)
    : jobs_(jobs), metrics_(metrics), checkpointer_(checkpointer), auth_(auth) {
  AddMethods();
}

namespace {

// A call answered with `status` before any message is read.
class Refusal final : public grpc::ServerGenericBidiReactor {
 public:
  explicit Refusal(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerGenericBidiReactor* DepotService::CreateReactor(
    grpc::GenericCallbackServerContext* context) {
  if (context->method() == step_path_) return Step(context);
  const auto found = methods_.find(context->method());
  if (found == methods_.end()) {
    return new Refusal(grpc::Status(
        grpc::StatusCode::UNIMPLEMENTED,
        absl::StrCat("depot-server has no method ", context->method())));
  }
  const Rpc rpc = found->second.rpc;
  // The caller is authenticated before its first message is read: without
  // a valid token or certificate every method is UNAUTHENTICATED, a request
  // that does not parse too (Serve checks again, and audits). Refused here,
  // on gRPC's thread: it takes no handler thread.
  if (!TenantOf(*context).ok()) {
    return new Refusal(
        Serve(rpc, *context, [](Caller&) { return absl::OkStatus(); }));
  }
  return BlockingCall::Start(
      handler_threads_,
      [context, handler = &found->second.handler](RawStream& stream) {
        return (*handler)(context, &stream);
      });
}

void DepotService::AddMethod(const char* method, Rpc rpc, Handler handler) {
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          "depot.v1.Depot");
  if (service->FindMethodByName(method) == nullptr) {
    std::fprintf(stderr,
                 "depot-server: internal error: depot.proto has no "
                 "method %s\n",
                 method);
    std::abort();
  }
  methods_[absl::StrCat("/", service->full_name(), "/", method)] =
      Method{rpc, std::move(handler)};
}

absl::Status DepotService::ReadOneRequest(
    RawStream* stream, Rpc rpc, google::protobuf::MessageLite* request) {
  const std::string what =
      absl::StrCat(kRpcNames[static_cast<int>(rpc)], " request");
  grpc::ByteBuffer buffer;
  absl::Status status;
  if (!stream->Read(&buffer)) {
    status = absl::InvalidArgumentError(absl::StrCat("no ", what, " message"));
  } else if (buffer.Length() > MaxRequestBytes(rpc)) {
    status = absl::ResourceExhaustedError(absl::StrCat(
        what, " of ", buffer.Length(), " bytes is larger than its limit of ",
        MaxRequestBytes(rpc), " bytes"));
  } else {
    status = ParseRawMessage(&buffer, what, request);
  }
  if (!status.ok()) {
    metrics_->CountRpc(rpc);
    RecordFailure(rpc, status);
  }
  return status;
}

template <typename Request, typename Response>
void DepotService::AddUnary(
    const char* method, Rpc rpc,
    grpc::Status (DepotService::*typed)(grpc::ServerContextBase*,
                                        const Request*, Response*)) {
  AddMethod(
      method, rpc,
      [this, rpc, typed](grpc::ServerContextBase* context, RawStream* stream) {
        Request request;
        if (absl::Status s = ReadOneRequest(stream, rpc, &request); !s.ok()) {
          return ToGrpcStatus(s);
        }
        Response response;
        const grpc::Status status =
            (this->*typed)(context, &request, &response);
        if (status.ok()) ResponseWriter<Response>(stream).Write(response);
        return status;
      });
}

void DepotService::AddMethods() {
  step_path_ = "/depot.v1.Depot/Step";
  AddUnary("CreateJob", Rpc::kCreateJob, &DepotService::CreateJob);
  AddUnary("GetJob", Rpc::kGetJob, &DepotService::GetJob);
  AddUnary("DeleteJob", Rpc::kDeleteJob, &DepotService::DeleteJob);
  AddUnary("Checkpoint", Rpc::kCheckpoint, &DepotService::Checkpoint);
  AddUnary("ListCheckpoints", Rpc::kListCheckpoints,
           &DepotService::ListCheckpoints);
  AddUnary("RollBack", Rpc::kRollBack, &DepotService::RollBack);
  AddUnary("ImportCheckpoint", Rpc::kImportCheckpoint,
           &DepotService::ImportCheckpoint);
  AddUnary("ServerStatus", Rpc::kServerStatus, &DepotService::ServerStatus);
  AddUnary("Drain", Rpc::kDrain, &DepotService::Drain);
  AddMethod("PullWeights", Rpc::kPullWeights,
            [this](grpc::ServerContextBase* context, RawStream* stream) {
              v1::PullRequest request;
              if (absl::Status s =
                      ReadOneRequest(stream, Rpc::kPullWeights, &request);
                  !s.ok()) {
                return ToGrpcStatus(s);
              }
              ResponseWriter<v1::PullResponse> writer(stream);
              return PullWeights(context, &request, &writer);
            });
  AddMethod("ExportState", Rpc::kExportState,
            [this](grpc::ServerContextBase* context, RawStream* stream) {
              v1::ExportStateRequest request;
              if (absl::Status s =
                      ReadOneRequest(stream, Rpc::kExportState, &request);
                  !s.ok()) {
                return ToGrpcStatus(s);
              }
              ResponseWriter<v1::StateChunk> writer(stream);
              return ExportState(context, &request, &writer);
            });
  AddMethod("InitWeights", Rpc::kInitWeights,
            [this](grpc::ServerContextBase* context, RawStream* stream) {
              RequestReader<v1::InitWeightsRequest> reader(
                  stream, "InitWeights request");
              v1::InitWeightsResponse response;
              const grpc::Status status =
                  InitWeights(context, &reader, &response);
              if (status.ok())
                ResponseWriter<v1::InitWeightsResponse>(stream).Write(response);
              return status;
            });
  AddMethod("ImportState", Rpc::kImportState,
            [this](grpc::ServerContextBase* context, RawStream* stream) {
              RequestReader<v1::ImportStateRequest> reader(
                  stream, "ImportState request");
              v1::ImportStateResponse response;
              const grpc::Status status =
                  ImportState(context, &reader, &response);
              if (status.ok())
                ResponseWriter<v1::ImportStateResponse>(stream).Write(response);
              return status;
            });
}

absl::StatusOr<std::string> DepotService::TenantOf(
    const grpc::ServerContextBase& context) const {
  if (auth_ == nullptr) return std::string(kImplicitTenant);
  return auth_->TenantOf(context);
}

grpc::Status DepotService::Serve(
    Rpc rpc, const grpc::ServerContextBase& context,
    absl::FunctionRef<absl::Status(Caller&)> body) {
  metrics_->CountRpc(rpc);
  Caller caller;
  caller.peer = context.peer();
  bool authenticated = false;
  absl::Status status;
  if (EnterCall()) {
    // An exception must not skip ExitCall, or shutdown would wait for the
    // call until its grace period ends.
    try {
      absl::StatusOr<std::string> tenant = TenantOf(context);
      if (tenant.ok()) {
        authenticated = true;
        caller.tenant = *std::move(tenant);
        status = body(caller);
      } else {
        status = tenant.status();
      }
    } catch (const std::exception& e) {
      status = ExceptionStatus(e);
    }
    ExitCall();
  } else {
    status = absl::UnavailableError(kShuttingDown);
  }
  if (Audited(rpc)) {
    Log(absl::StrFormat(
        "audit: %s tenant=%s peer=%s%s: %s", kRpcNames[static_cast<int>(rpc)],
        // Escaped: a certificate's CN is the client's to choose, and must
        // not forge audit lines.
        authenticated
            ? absl::StrCat("\"", absl::CHexEscape(caller.tenant), "\"")
            : std::string("(unauthenticated)"),
        absl::CHexEscape(caller.peer),
        caller.job.empty() ? "" : absl::StrCat(" ", caller.job),
        status.ok() ? std::string("OK")
                    : std::string(absl::StatusCodeToString(status.code()))));
  }
  if (!status.ok()) RecordFailure(rpc, status);
  return ToGrpcStatus(status);
}

namespace {

void NoteJob(std::string* job, const ShardState& shard) {
  *job = absl::StrFormat("job %d \"%s\"", shard.job_id(),
                         absl::CHexEscape(shard.shape().config().name));
}

absl::Status UnknownJob(uint64_t job_id) {
  // JobStore's words for an id it does not hold.
  return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
}

}  // namespace

absl::StatusOr<std::shared_ptr<ShardState>> DepotService::FindOwned(
    Caller& caller, uint64_t job_id) const {
  absl::StatusOr<std::shared_ptr<ShardState>> shard = jobs_->Find(job_id);
  if (!shard.ok() || (*shard)->shape().tenant() != caller.tenant) {
    return UnknownJob(job_id);
  }
  NoteJob(&caller.job, **shard);
  return shard;
}

absl::StatusOr<std::shared_ptr<ShardState>> DepotService::FindOwned(
    Caller& caller, uint64_t job_id, uint64_t fingerprint) const {
  // The owner first: another tenant's job must not tell its fingerprint
  // apart.
  if (absl::StatusOr<std::shared_ptr<ShardState>> owned =
          FindOwned(caller, job_id);
      !owned.ok()) {
    return owned;
  }
  return jobs_->Find(job_id, fingerprint);
}

absl::Status DepotService::ExceptionStatus(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) {
    return absl::ResourceExhaustedError(
        "the server could not allocate the memory this request needs");
  }
  return absl::InternalError(
      absl::StrCat("unexpected exception in the server: ", e.what()));
}

bool DepotService::EnterCall() {
  absl::MutexLock lock(&streams_mu_);
  if (!accepting()) return false;
  ++calls_in_flight_;
  return true;
}

void DepotService::ExitCall() {
  absl::MutexLock lock(&streams_mu_);
  --calls_in_flight_;
}

void DepotService::RecordFailure(Rpc rpc, const absl::Status& status) {
  metrics_->CountError(status.code());
  Log(absl::StrCat(kRpcNames[static_cast<int>(rpc)],
                   " failed: ", status.ToString()));
}

grpc::Status DepotService::CreateJob(grpc::ServerContextBase* context,
                                     const v1::CreateJobRequest* request,
                                     v1::CreateJobResponse* response) {
  return Serve(Rpc::kCreateJob, *context, [&](Caller& caller) {
    return DoCreateJob(caller, *request, response);
  });
}

grpc::Status DepotService::InitWeights(
    grpc::ServerContextBase* context,
    RequestReader<v1::InitWeightsRequest>* reader,
    v1::InitWeightsResponse* response) {
  return Serve(Rpc::kInitWeights, *context, [&](Caller& caller) {
    return DoInitWeights(caller, reader, response);
  });
}

grpc::Status DepotService::PullWeights(
    grpc::ServerContextBase* context, const v1::PullRequest* request,
    ResponseWriter<v1::PullResponse>* writer) {
  return Serve(Rpc::kPullWeights, *context, [&](Caller& caller) {
    return DoPullWeights(caller, *request, writer);
  });
}

grpc::Status DepotService::GetJob(grpc::ServerContextBase* context,
                                  const v1::GetJobRequest* request,
                                  v1::JobStatus* response) {
  return Serve(Rpc::kGetJob, *context, [&](Caller& caller) {
    return DoGetJob(caller, *request, response);
  });
}

grpc::Status DepotService::DeleteJob(grpc::ServerContextBase* context,
                                     const v1::DeleteJobRequest* request,
                                     v1::DeleteJobResponse*) {
  return Serve(Rpc::kDeleteJob, *context,
               [&](Caller& caller) { return DoDeleteJob(caller, *request); });
}

absl::Status DepotService::DoCreateJob(Caller& caller,
                                       const v1::CreateJobRequest& request,
                                       v1::CreateJobResponse* response) {
  absl::StatusOr<JobConfig> config = JobConfigFromProto(request.spec());
  if (!config.ok()) return config.status();
  if (draining()) {
    // A drained server takes no new job; the jobs it holds go on.
    const JobKey key{caller.tenant, config->name};
    bool held = false;
    for (const std::shared_ptr<ShardState>& shard : jobs_->Jobs()) {
      held = held || shard->shape().key() == key;
    }
    if (!held) {
      return absl::UnavailableError(
          "this server is drained (depotctl drain) and takes no new job: "
          "create the job on other servers, or resume this one with "
          "`depotctl drain --resume`");
    }
  }
  absl::StatusOr<OpenedJob> opened = jobs_->CreateOrAttach(
      *std::move(config), request.server_index(), caller.tenant);
  if (!opened.ok()) return opened.status();
  const ShardState& shard = *opened->shard;
  NoteJob(&caller.job, shard);
  const JobShape& shape = shard.shape();
  response->set_job_id(shard.job_id());
  response->set_fingerprint(shape.fingerprint());
  response->set_created(opened->created);
  response->set_shard_begin(shape.shard().begin);
  response->set_shard_end(shape.shard().end);
  response->set_first_chunk(shape.shard().first_chunk);
  response->set_end_chunk(shape.shard().end_chunk);
  response->set_state_bytes(shape.state_bytes());
  Log(absl::StrFormat("%s %s (server %d of %d, %d bytes of state)",
                      opened->created ? "created" : "attached to",
                      Describe(shape.key(), shard.job_id()),
                      shape.server_index(), shape.config().num_servers,
                      shape.state_bytes()));
  return absl::OkStatus();
}

absl::Status DepotService::DoInitWeights(
    Caller& caller, RequestReader<v1::InitWeightsRequest>* reader,
    v1::InitWeightsResponse* response) {
  v1::InitWeightsRequest request;
  if (!reader->Read(&request)) {
    if (!reader->status().ok()) return reader->status();
  }
  if (!request.has_header()) {
    return absl::InvalidArgumentError(
        "the first message of an InitWeights stream must be its header");
  }
  const v1::InitHeader& header = request.header();
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      FindOwned(caller, header.job_id(), header.fingerprint());
  if (!shard.ok()) return shard.status();
  absl::StatusOr<DType> dtype = DTypeFromProto(header.dtype(), "dtype");
  if (!dtype.ok()) return dtype.status();
  uint64_t chunks = 0;
  while (reader->Read(&request)) {
    if (ended()) return absl::UnavailableError(kShuttingDown);
    if (!request.has_chunk()) {
      return absl::InvalidArgumentError(
          "an InitWeights stream carries one header, then only chunks");
    }
    const v1::Chunk& chunk = request.chunk();
    if (absl::Status s =
            (*shard)->InitChunk(chunk.index(), *dtype, chunk.payload());
        !s.ok()) {
      return s;
    }
    metrics_->received_init_bytes.Increment(
        static_cast<double>(chunk.payload().size()));
    ++chunks;
  }
  // A malformed message ends the reads: the stream fails with it (the chunks
  // before it stay written), it is never taken for the stream's end.
  if (!reader->status().ok()) return reader->status();
  response->set_chunks(chunks);
  return absl::OkStatus();
}

absl::Status DepotService::DoPullWeights(
    Caller& caller, const v1::PullRequest& request,
    ResponseWriter<v1::PullResponse>* writer) {
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      FindOwned(caller, request.job_id(), request.fingerprint());
  if (!shard.ok()) return shard.status();
  absl::StatusOr<DType> dtype = DTypeFromProto(request.dtype(), "dtype");
  if (!dtype.ok()) return dtype.status();
  absl::Status status = (*shard)->ReadWeights(
      request.begin(), request.end(), *dtype, request.step(),
      [&](uint64_t offset, std::string payload) {
        if (ended()) return false;
        v1::PullResponse response;
        response.set_offset(offset);
        const size_t bytes = payload.size();
        *response.mutable_payload() = std::move(payload);
        if (!writer->Write(response)) return false;
        metrics_->sent_pull_bytes.Increment(static_cast<double>(bytes));
        return true;
      });
  return ended() && !status.ok() ? absl::UnavailableError(kShuttingDown)
                                 : status;
}

absl::Status DepotService::DoGetJob(Caller& caller,
                                    const v1::GetJobRequest& request,
                                    v1::JobStatus* response) {
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      FindOwned(caller, request.job_id());
  if (!shard.ok()) return shard.status();
  const JobShape& shape = (*shard)->shape();
  response->set_job_id((*shard)->job_id());
  JobConfigToProto(shape.config(), response->mutable_spec());
  response->set_fingerprint(shape.fingerprint());
  response->set_server_index(shape.server_index());
  response->set_step((*shard)->completed_step());
  response->set_newest_step((*shard)->newest_step());
  response->set_shard_begin(shape.shard().begin);
  response->set_shard_end(shape.shard().end);
  response->set_shard_params(shape.shard().size());
  response->set_total_params(shape.layout().total_elems());
  response->set_state_bytes(shape.state_bytes());
  if (request.with_checksum()) {
    response->set_state_checksum((*shard)->Checksum());
  }
  const PendingStepReport pending = (*shard)->OldestPendingStep();
  if (pending.step != 0) {
    response->set_pending_step(pending.step);
    for (uint32_t rank : pending.missing_workers) {
      response->add_missing_workers(rank);
    }
    response->set_waiting_seconds(
        std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                      pending.since)
            .count());
  }
  return absl::OkStatus();
}

absl::Status DepotService::DoDeleteJob(Caller& caller,
                                       const v1::DeleteJobRequest& request) {
  // Ownership and fingerprint first: Delete itself cannot be undone.
  if (absl::StatusOr<std::shared_ptr<ShardState>> found =
          FindOwned(caller, request.job_id(), request.fingerprint());
      !found.ok()) {
    return found.status();
  }
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      jobs_->Delete(request.job_id(), request.fingerprint());
  if (!shard.ok()) return shard.status();
  FailStreamsOf(request.job_id(),
                absl::AbortedError(
                    absl::StrCat("job ", request.job_id(), " was deleted")));
  Log(absl::StrCat("deleted ",
                   Describe((*shard)->shape().key(), request.job_id())));
  return absl::OkStatus();
}

grpc::Status DepotService::ExportState(grpc::ServerContextBase* context,
                                       const v1::ExportStateRequest* request,
                                       ResponseWriter<v1::StateChunk>* writer) {
  return Serve(Rpc::kExportState, *context, [&](Caller& caller) {
    return DoExportState(caller, *request, writer);
  });
}

grpc::Status DepotService::ImportState(
    grpc::ServerContextBase* context,
    RequestReader<v1::ImportStateRequest>* reader,
    v1::ImportStateResponse* response) {
  return Serve(Rpc::kImportState, *context, [&](Caller& caller) {
    return DoImportState(caller, reader, response);
  });
}

grpc::Status DepotService::Checkpoint(grpc::ServerContextBase* context,
                                      const v1::CheckpointRequest* request,
                                      v1::CheckpointResponse* response) {
  return Serve(Rpc::kCheckpoint, *context, [&](Caller& caller) {
    return DoCheckpoint(caller, *request, response);
  });
}

absl::Status DepotService::DoCheckpoint(Caller& caller,
                                        const v1::CheckpointRequest& request,
                                        v1::CheckpointResponse* response) {
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      FindOwned(caller, request.job_id(), request.fingerprint());
  if (!shard.ok()) return shard.status();
  if (checkpointer_ == nullptr) {
    return absl::FailedPreconditionError(
        "this server has no --checkpoint_dir: start it with one to take "
        "checkpoints");
  }
  absl::StatusOr<uint64_t> step = checkpointer_->CheckpointNow(*shard);
  if (!step.ok()) return step.status();
  response->set_step(*step);
  return absl::OkStatus();
}

void DepotService::FailStreamsOf(uint64_t job_id, const absl::Status& status) {
  FailStepStreams([job_id](uint64_t stream_job) { return stream_job == job_id; },
                  status);
}

grpc::Status DepotService::ListCheckpoints(
    grpc::ServerContextBase* context, const v1::ListCheckpointsRequest* request,
    v1::ListCheckpointsResponse* response) {
  return Serve(Rpc::kListCheckpoints, *context, [&](Caller& caller) {
    return DoListCheckpoints(caller, *request, response);
  });
}

absl::Status DepotService::DoListCheckpoints(
    Caller& caller, const v1::ListCheckpointsRequest& request,
    v1::ListCheckpointsResponse* response) {
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      FindOwned(caller, request.job_id(), request.fingerprint());
  if (!shard.ok()) return shard.status();
  response->set_step((*shard)->completed_step());
  response->set_newest_step((*shard)->newest_step());
  // Without a --checkpoint_dir there are none: the list is empty.
  if (checkpointer_ == nullptr) return absl::OkStatus();
  absl::StatusOr<std::vector<uint64_t>> steps =
      checkpointer_->CompleteSteps((*shard)->shape().key());
  if (!steps.ok()) return steps.status();
  for (const uint64_t step : *steps) response->add_steps(step);
  if (request.verify()) return VerifyCheckpoints(**shard, *steps, response);
  return absl::OkStatus();
}

grpc::Status DepotService::RollBack(grpc::ServerContextBase* context,
                                    const v1::RollBackRequest* request,
                                    v1::RollBackResponse* response) {
  return Serve(Rpc::kRollBack, *context, [&](Caller& caller) {
    return DoRollBack(caller, *request, response);
  });
}

absl::Status DepotService::DoRollBack(Caller& caller,
                                      const v1::RollBackRequest& request,
                                      v1::RollBackResponse* response) {
  absl::StatusOr<std::shared_ptr<ShardState>> found =
      FindOwned(caller, request.job_id(), request.fingerprint());
  if (!found.ok()) return found.status();
  ShardState& shard = **found;
  const JobKey key = shard.shape().key();
  const uint64_t step = request.step();
  // Checked before anything changes: a step the shard has not reached, or
  // one it has left without a checkpoint to go back to.
  const uint64_t completed = shard.completed_step();
  if (step > completed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot roll job ", request.job_id(), " back to step ", step,
        ": this server has completed only step ", completed));
  }
  const bool at_step = step == completed && shard.newest_step() == step;
  if (!at_step) {
    if (checkpointer_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot roll job ", request.job_id(), " back to step ", step,
          ": it is at step ", completed,
          " and this server has no --checkpoint_dir to restore from"));
    }
    absl::StatusOr<std::vector<uint64_t>> steps =
        checkpointer_->CompleteSteps(key);
    if (!steps.ok()) return steps.status();
    if (std::find(steps->begin(), steps->end(), step) == steps->end()) {
      return absl::NotFoundError(absl::StrCat(
          "job ", request.job_id(), " has no complete checkpoint of step ",
          step, " on this server (it has: ", absl::StrJoin(*steps, ", "),
          ")"));
    }
  }
  const absl::Status aborted = absl::AbortedError(absl::StrCat(
      "job ", request.job_id(), " is being rolled back to step ", step,
      " (a client asked for it: a server restarted behind the others, or an "
      "operator's rollback); open the job again and resume after step ",
      step));
  // Before and after the shard stops taking contributions: a stream that
  // opened in between may have added some.
  FailStreamsOf(request.job_id(), aborted);
  shard.BeginRollBack();
  FailStreamsOf(request.job_id(), aborted);
  const uint64_t dropped = shard.DropInFlight();
  absl::Status status;
  bool restored = false;
  // The checkpoint, read whole before it replaces the state, is charged to
  // the memory budget meanwhile.
  ScopedReservation staged(jobs_->budget().get());
  if (!(shard.completed_step() == step && shard.newest_step() == step)) {
    absl::StatusOr<ShardCheckpoint> loaded =
        checkpointer_ == nullptr
            ? absl::FailedPreconditionError("no --checkpoint_dir")
        : !staged.TryAdd(shard.shape().state_bytes())
            ? absl::ResourceExhaustedError(absl::StrCat(
                  "the server's memory budget (", jobs_->budget()->limit(),
                  " bytes, ", jobs_->budget()->used(),
                  " in use) has no room to read the checkpoint's ",
                  shard.shape().state_bytes(), " bytes of state"))
            : checkpointer_->Load(key, step);
    if (loaded.ok() && (loaded->fingerprint != shard.shape().fingerprint() ||
                        loaded->server_index != shard.shape().server_index() ||
                        loaded->chunks.size() != shard.shape().shard().num_chunks())) {
      loaded = absl::FailedPreconditionError(absl::StrCat(
          "the checkpoint of step ", step, " is of another shard or config "
          "than the job's"));
    }
    status = loaded.ok() ? shard.ImportChunks(std::move(loaded->chunks))
                         : loaded.status();
    restored = status.ok();
  }
  shard.EndRollBack();
  metrics_->rollback_dropped_contributions.Increment(
      static_cast<double>(dropped));
  if (!status.ok()) {
    Log(absl::StrFormat(
        "%s NOT rolled back to step %d (it stays at step %d; %d "
        "contributions in flight were dropped): %s",
        Describe(key, request.job_id()), step, shard.completed_step(), dropped,
        status.ToString()));
    return status;
  }
  if (checkpointer_ != nullptr) checkpointer_->RemoveStepsAfter(key, step);
  metrics_->rollbacks.Increment();
  Log(absl::StrFormat(
      "%s rolled back to step %d (%s; %d contributions in flight "
      "dropped)",
      Describe(key, request.job_id()), step,
      restored ? "restored from its checkpoint" : "it was at that step",
      dropped));
  response->set_step(step);
  response->set_restored(restored);
  response->set_dropped_contributions(dropped);
  return absl::OkStatus();
}

grpc::Status DepotService::ImportCheckpoint(
    grpc::ServerContextBase* context,
    const v1::ImportCheckpointRequest* request,
    v1::ImportCheckpointResponse* response) {
  return Serve(Rpc::kImportCheckpoint, *context, [&](Caller& caller) {
    return DoImportCheckpoint(caller, *request, response);
  });
}

absl::Status DepotService::DoImportCheckpoint(
    Caller& caller, const v1::ImportCheckpointRequest& request,
    v1::ImportCheckpointResponse* response) {
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      FindOwned(caller, request.job_id(), request.fingerprint());
  if (!shard.ok()) return shard.status();
  const JobShape& shape = (*shard)->shape();
  // Only directories under --import_roots, read through their canonical
  // paths (import_roots.h).
  absl::StatusOr<std::vector<std::string>> dirs =
      import_roots_.Resolve(std::vector<std::string>(
          request.checkpoint_dirs().begin(), request.checkpoint_dirs().end()));
  if (!dirs.ok()) return dirs.status();
  // The shard's state, read and staged whole before it replaces the job's,
  // is charged to the memory budget meanwhile.
  ScopedReservation staged(jobs_->budget().get());
  if (!request.verify_only() && !staged.TryAdd(shape.state_bytes())) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "ImportCheckpoint: the server's memory budget (",
        jobs_->budget()->limit(), " bytes, ", jobs_->budget()->used(),
        " in use) has no room to stage the shard's ", shape.state_bytes(),
        " bytes of state"));
  }
  // Read on this call's thread: the files are other servers', so the
  // checkpointer's writer (this server's directory) has no part in it.
  absl::StatusOr<CheckpointForShard> read = ReadCheckpointForShard(
      *dirs, shape, request.step(), /*keep_chunks=*/!request.verify_only());
  if (!read.ok()) return read.status();
  response->set_step(request.step());
  response->set_old_num_servers(read->old_num_servers);
  for (const std::string& file : read->shard_files) {
    response->add_shard_files(file);
  }
  if (request.verify_only()) return absl::OkStatus();
  if (absl::Status s = (*shard)->ImportChunks(std::move(read->chunks));
      !s.ok()) {
    return s;
  }
  jobs_->NoteStateReplaced(*shard);
  Log(absl::StrFormat(
      "job %d \"%s\" (server %d of %d) imported the checkpoint of step %d "
      "written by %d servers, from %s",
      request.job_id(), shape.config().name, shape.server_index(),
      shape.config().num_servers, request.step(), read->old_num_servers,
      read->shard_files.empty() ? std::string("no file (an empty shard)")
                                : absl::StrJoin(read->shard_files, ", ")));
  return absl::OkStatus();
}

absl::Status DepotService::DoExportState(
    Caller& caller, const v1::ExportStateRequest& request,
    ResponseWriter<v1::StateChunk>* writer) {
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      FindOwned(caller, request.job_id(), request.fingerprint());
  if (!shard.ok()) return shard.status();
  absl::Status status = (*shard)->ExportChunks([&](ChunkSnapshot snapshot) {
    if (ended()) return false;
    v1::StateChunk message;
    message.set_index(snapshot.index);
    message.set_applied_step(snapshot.applied_step);
    message.set_optimizer_step(snapshot.optimizer_step);
    for (const uint64_t count : snapshot.tensor_steps) {
      message.add_tensor_steps(count);
    }
    *message.mutable_master() = std::move(snapshot.master);
    for (std::string& slot : snapshot.slots) {
      *message.add_slots() = std::move(slot);
    }
    return writer->Write(message);
  });
  return ended() && !status.ok() ? absl::UnavailableError(kShuttingDown)
                                 : status;
}

absl::Status DepotService::DoImportState(
    Caller& caller, RequestReader<v1::ImportStateRequest>* reader,
    v1::ImportStateResponse* response) {
  v1::ImportStateRequest request;
  if (!reader->Read(&request) && !reader->status().ok()) {
    return reader->status();
  }
  if (!request.has_header()) {
    return absl::InvalidArgumentError(
        "the first message of an ImportState stream must be its header");
  }
  absl::StatusOr<std::shared_ptr<ShardState>> shard = FindOwned(
      caller, request.header().job_id(), request.header().fingerprint());
  if (!shard.ok()) return shard.status();
  // Staged whole: ImportChunks checks everything before it replaces anything.
  // The staged chunks are charged to the memory budget while they are held:
  // a client that sends more than it holds is refused.
  std::vector<ChunkSnapshot> chunks;
  ScopedReservation staged(jobs_->budget().get());
  while (reader->Read(&request)) {
    if (ended()) return absl::UnavailableError(kShuttingDown);
    if (!request.has_chunk()) {
      return absl::InvalidArgumentError(
          "an ImportState stream carries one header, then only chunks");
    }
    v1::StateChunk* chunk = request.mutable_chunk();
    if (!staged.TryAdd(chunk->ByteSizeLong())) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "ImportState: the server's memory budget (",
          jobs_->budget()->limit(), " bytes, ", jobs_->budget()->used(),
          " in use) has no room to stage chunk ", chunk->index(), " (",
          chunk->ByteSizeLong(), " bytes) after ", chunks.size(),
          " chunks staged (", staged.bytes(), " bytes)"));
    }
    ChunkSnapshot& snapshot = chunks.emplace_back();
    snapshot.index = chunk->index();
    snapshot.applied_step = chunk->applied_step();
    snapshot.optimizer_step = chunk->optimizer_step();
    snapshot.tensor_steps.assign(chunk->tensor_steps().begin(),
                                 chunk->tensor_steps().end());
    snapshot.master = std::move(*chunk->mutable_master());
    for (std::string& slot : *chunk->mutable_slots()) {
      snapshot.slots.push_back(std::move(slot));
    }
  }
  if (!reader->status().ok()) return reader->status();
  if (absl::Status s = (*shard)->ImportChunks(std::move(chunks)); !s.ok()) {
    return s;
  }
  jobs_->NoteStateReplaced(*shard);
  response->set_chunks((*shard)->shape().shard().num_chunks());
  return absl::OkStatus();
}

void DepotService::TrackStepStream(const std::shared_ptr<StepStream>& stream,
                                   uint64_t job_id) {
  absl::MutexLock lock(&streams_mu_);
  if (streams_.insert_or_assign(stream.get(), TrackedStream{stream, job_id})
          .second) {
    metrics_->active_streams.Increment();
  }
}

void DepotService::UntrackStepStream(StepStream* stream) {
  absl::MutexLock lock(&streams_mu_);
  if (streams_.erase(stream) > 0) metrics_->active_streams.Decrement();
}

bool DepotService::NoRpcsInFlight() const {
  return streams_.empty() && calls_in_flight_ == 0;
}

void DepotService::StopAcceptingRpcs() {
  // Under the lock that EnterCall takes: once this returns, no handler can
  // still be about to enter, so WaitForRpcs sees every one that runs.
  absl::MutexLock lock(&streams_mu_);
  accepting_.store(false, std::memory_order_release);
}

DepotService::RpcsInFlight DepotService::InFlight() const {
  absl::MutexLock lock(&streams_mu_);
  return RpcsInFlight{static_cast<int>(streams_.size()), calls_in_flight_};
}

bool DepotService::WaitForRpcs(absl::Time deadline) {
  absl::MutexLock lock(&streams_mu_);
  return streams_mu_.AwaitWithDeadline(
      absl::Condition(this, &DepotService::NoRpcsInFlight), deadline);
}

void DepotService::EndRpcs() {
  ended_.store(true, std::memory_order_release);
  FailStepStreams([](uint64_t) { return true; },
                  absl::UnavailableError(kShuttingDown));
}

void DepotService::FailStepStreams(
    absl::FunctionRef<bool(uint64_t job_id)> selected,
    const absl::Status& status) {
  std::vector<std::shared_ptr<StepStream>> chosen;
  {
    absl::MutexLock lock(&streams_mu_);
    for (const auto& [key, tracked] : streams_) {
      if (!selected(tracked.job_id)) continue;
      if (std::shared_ptr<StepStream> stream = tracked.stream.lock()) {
        chosen.push_back(std::move(stream));
      }
    }
  }
  for (const std::shared_ptr<StepStream>& stream : chosen) stream->Fail(status);
}

}  // namespace depot
