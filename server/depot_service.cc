// DepotService's core: the dispatch of every call (CreateReactor), reading
// and authenticating requests, auditing (Serve), the RPCs in flight and the
// shutdown. The methods: depot_service_jobs.cc, depot_service_checkpoints.cc,
// depot_service_admin.cc and step_reactor.cc.
#include "server/depot_service.h"

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
#include "google/protobuf/descriptor.h"
#include "server/blocking_call.h"
#include "wire/wire.h"

namespace depot {
namespace {

constexpr const char* kRpcNames[kNumRpcs] = {
    "CreateJob", "InitWeights", "Step",        "PullWeights",
    "GetJob",    "DeleteJob",   "ExportState", "ImportState",
    "Checkpoint", "ListCheckpoints", "RollBack",
    "ImportCheckpoint", "ServerStatus", "Drain"};

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

// The path of `rpc` in a call ("/depot.v1.Depot/GetJob"), from depot.proto's
// descriptor: a name the proto lacks stops the server at start-up.
std::string MethodPath(Rpc rpc) {
  const char* name = kRpcNames[static_cast<int>(rpc)];
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          "depot.v1.Depot");
  if (service == nullptr || service->FindMethodByName(name) == nullptr) {
    std::fprintf(stderr,
                 "depot-server: internal error: depot.proto has no method %s\n",
                 name);
    std::abort();
  }
  return absl::StrCat("/", service->full_name(), "/", name);
}

}  // namespace

DepotService::DepotService(JobStore* jobs, ServerMetrics* metrics,
                           Checkpointer* checkpointer, const TenantAuth* auth,
                           int max_handler_threads)
    : jobs_(jobs),
      metrics_(metrics),
      checkpointer_(checkpointer),
      auth_(auth),
      handler_threads_(max_handler_threads) {
  metrics_->handler_calls_limit.Set(max_handler_threads);
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
      [this, context, handler = &found->second.handler](RawStream& stream) {
        metrics_->handler_calls.Increment();
        const grpc::Status status = (*handler)(context, &stream);
        metrics_->handler_calls.Decrement();
        return status;
      },
      [this, rpc](const absl::Status& status) {
        metrics_->CountRpc(rpc);
        RecordFailure(rpc, status);
      });
}

void DepotService::AddMethod(Rpc rpc, Handler handler) {
  methods_[MethodPath(rpc)] = Method{rpc, std::move(handler)};
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

template <typename Request, typename Body>
void DepotService::AddWithOneRequest(Rpc rpc, Body body) {
  AddMethod(rpc, [this, rpc, body](grpc::ServerContextBase* context,
                                   RawStream* stream) {
    Request request;
    if (absl::Status s = ReadOneRequest(stream, rpc, &request); !s.ok()) {
      return ToGrpcStatus(s);
    }
    return body(context, request, stream);
  });
}

template <typename Request, typename Response>
void DepotService::AddUnary(
    Rpc rpc, grpc::Status (DepotService::*typed)(grpc::ServerContextBase*,
                                                 const Request*, Response*)) {
  AddWithOneRequest<Request>(
      rpc, [this, typed](grpc::ServerContextBase* context,
                         const Request& request, RawStream* stream) {
        Response response;
        const grpc::Status status =
            (this->*typed)(context, &request, &response);
        if (status.ok()) ResponseWriter<Response>(stream).Write(response);
        return status;
      });
}

template <typename Request, typename Response>
void DepotService::AddServerStreaming(
    Rpc rpc, grpc::Status (DepotService::*typed)(grpc::ServerContextBase*,
                                                 const Request*,
                                                 ResponseWriter<Response>*)) {
  AddWithOneRequest<Request>(
      rpc, [this, typed](grpc::ServerContextBase* context,
                         const Request& request, RawStream* stream) {
        ResponseWriter<Response> writer(stream);
        return (this->*typed)(context, &request, &writer);
      });
}

template <typename Request, typename Response>
void DepotService::AddClientStreaming(
    Rpc rpc,
    grpc::Status (DepotService::*typed)(grpc::ServerContextBase*,
                                        RequestReader<Request>*, Response*)) {
  AddMethod(rpc, [this, rpc, typed](grpc::ServerContextBase* context,
                                    RawStream* stream) {
    RequestReader<Request> reader(
        stream, absl::StrCat(kRpcNames[static_cast<int>(rpc)], " request"));
    Response response;
    const grpc::Status status = (this->*typed)(context, &reader, &response);
    if (status.ok()) ResponseWriter<Response>(stream).Write(response);
    return status;
  });
}

void DepotService::AddMethods() {
  step_path_ = MethodPath(Rpc::kStep);
  AddUnary(Rpc::kCreateJob, &DepotService::CreateJob);
  AddUnary(Rpc::kGetJob, &DepotService::GetJob);
  AddUnary(Rpc::kDeleteJob, &DepotService::DeleteJob);
  AddUnary(Rpc::kCheckpoint, &DepotService::Checkpoint);
  AddUnary(Rpc::kListCheckpoints, &DepotService::ListCheckpoints);
  AddUnary(Rpc::kRollBack, &DepotService::RollBack);
  AddUnary(Rpc::kImportCheckpoint, &DepotService::ImportCheckpoint);
  AddUnary(Rpc::kServerStatus, &DepotService::ServerStatus);
  AddUnary(Rpc::kDrain, &DepotService::Drain);
  AddServerStreaming(Rpc::kPullWeights, &DepotService::PullWeights);
  AddServerStreaming(Rpc::kExportState, &DepotService::ExportState);
  AddClientStreaming(Rpc::kInitWeights, &DepotService::InitWeights);
  AddClientStreaming(Rpc::kImportState, &DepotService::ImportState);
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

void DepotService::Log(const std::string& line) {
  std::fprintf(stderr, "depot-server: %s\n", line.c_str());
}

void DepotService::NoteJob(std::string* job, const ShardState& shard) {
  *job = absl::StrFormat("job %d \"%s\"", shard.job_id(),
                         absl::CHexEscape(shard.shape().config().name));
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

void DepotService::FailStreamsOf(uint64_t job_id, const absl::Status& status) {
  FailStepStreams([job_id](uint64_t stream_job) { return stream_job == job_id; },
                  status);
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
