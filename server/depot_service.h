// DepotService: the gRPC handlers of depot.v1.Depot. Each handler translates
// the request, validates what only the wire can get wrong, and delegates to
// JobStore and ShardState; the behaviour itself lives there (see
// docs/protocol.md).
//
// It also tracks the RPCs in flight, so that deleting a job can end its Step
// streams, and shutting the server down can wait for what runs and then end
// whatever would otherwise run on (a Step stream waiting for absent workers,
// an export to a client that stopped reading, a checkpoint still being
// written) with UNAVAILABLE instead of waiting for it.
#ifndef DEPOT_SERVER_DEPOT_SERVICE_H_
#define DEPOT_SERVER_DEPOT_SERVICE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "depot/v1/depot.grpc.pb.h"
#include "grpcpp/generic/async_generic_service.h"
#include "server/checkpointer.h"
#include "server/handler_threads.h"
#include "server/import_roots.h"
#include "server/job_store.h"
#include "server/metrics.h"
#include "server/raw_stream.h"
#include "server/step_stream.h"
#include "server/tenant_auth.h"

namespace depot {

// The limit of a request made of fixed fields only (GetJob, DeleteJob,
// PullWeights, ExportState, Checkpoint, ListCheckpoints, RollBack): a larger
// one is RESOURCE_EXHAUSTED before it is parsed.
inline constexpr size_t kMaxFixedFieldRequestBytes = 64 << 10;

// The service is a generic callback service of gRPC's public API (register it
// with ServerBuilder::RegisterCallbackGenericService): every method of
// depot.v1.Depot reaches CreateReactor as a bidi stream of raw ByteBuffers,
// whatever its shape in the proto; the wire is unchanged.
// - Step runs on a reactor (step_reactor.cc): its chunks bypass protobuf
//   `bytes` in both directions, and it never blocks.
// - Every other method runs a blocking handler on a thread of its own
//   (BlockingCall, HandlerThreads), which parses its messages itself
//   (raw_stream.h): a malformed request is INVALID_ARGUMENT, never gRPC's
//   INTERNAL, and a malformed message in a client stream fails the stream.
// - A caller that does not authenticate is refused before its first message
//   is read, and a method the service lacks is UNIMPLEMENTED.
class DepotService final : public grpc::CallbackGenericService {
 public:
  // `jobs`, `metrics`, `checkpointer` (null: the server has no
  // --checkpoint_dir) and `auth` (null: every caller is the implicit tenant)
  // must outlive the service. A job belongs to the tenant that created it
  // (JobShape::tenant); job names are per tenant (JobKey). At most
  // `max_handler_threads` calls of methods other than Step are served at
  // once (a call past them is RESOURCE_EXHAUSTED).
  DepotService(JobStore* jobs, ServerMetrics* metrics,
               Checkpointer* checkpointer = nullptr,
               const TenantAuth* auth = nullptr,
               int max_handler_threads = HandlerThreads::kDefaultMaxThreads);

  // Every call of the service: Step's reactor, a BlockingCall running the
  // method's handler, or a refusal (an unauthenticated caller, an unknown
  // method, no handler thread left). A server that no longer accepts RPCs
  // refuses in the handler (Serve), as before.
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override;

  // The methods, called with their messages parsed (server-streaming and
  // client-streaming ones with a reader or writer of them).
  grpc::Status CreateJob(grpc::ServerContextBase* context,
                         const v1::CreateJobRequest* request,
                         v1::CreateJobResponse* response);
  grpc::Status InitWeights(grpc::ServerContextBase* context,
                           RequestReader<v1::InitWeightsRequest>* reader,
                           v1::InitWeightsResponse* response);
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Step(
      grpc::CallbackServerContext* context);
  grpc::Status PullWeights(grpc::ServerContextBase* context,
                           const v1::PullRequest* request,
                           ResponseWriter<v1::PullResponse>* writer);
  grpc::Status GetJob(grpc::ServerContextBase* context,
                      const v1::GetJobRequest* request,
                      v1::JobStatus* response);
  grpc::Status DeleteJob(grpc::ServerContextBase* context,
                         const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse* response);
  grpc::Status ExportState(grpc::ServerContextBase* context,
                           const v1::ExportStateRequest* request,
                           ResponseWriter<v1::StateChunk>* writer);
  grpc::Status ImportState(grpc::ServerContextBase* context,
                           RequestReader<v1::ImportStateRequest>* reader,
                           v1::ImportStateResponse* response);
  grpc::Status Checkpoint(grpc::ServerContextBase* context,
                          const v1::CheckpointRequest* request,
                          v1::CheckpointResponse* response);
  grpc::Status ListCheckpoints(grpc::ServerContextBase* context,
                               const v1::ListCheckpointsRequest* request,
                               v1::ListCheckpointsResponse* response);
  grpc::Status RollBack(grpc::ServerContextBase* context,
                        const v1::RollBackRequest* request,
                        v1::RollBackResponse* response);
  grpc::Status ImportCheckpoint(grpc::ServerContextBase* context,
                                const v1::ImportCheckpointRequest* request,
                                v1::ImportCheckpointResponse* response);
  // The operator's RPCs (depot_service_admin.cc, depotctl).
  grpc::Status ServerStatus(grpc::ServerContextBase* context,
                            const v1::ServerStatusRequest* request,
                            v1::ServerStatusResponse* response);
  grpc::Status Drain(grpc::ServerContextBase* context,
                     const v1::DrainRequest* request,
                     v1::DrainResponse* response);

  // What the operator's RPCs need from the daemon around the service.
  struct AdminHooks {
    // The tenants that may drain the server and see every tenant's jobs in
    // ServerStatus (--admin_tenants). Without authentication every caller
    // may.
    std::vector<std::string> admin_tenants;
    // Sets the health status of depot.v1.Depot (false: NOT_SERVING) while
    // drained; the server's overall status ("") stays SERVING.
    std::function<void(bool serving)> set_serving;
    // Asks the process to shut down as on SIGTERM (Drain's `shutdown`); not
    // set: such a Drain is FAILED_PRECONDITION.
    std::function<void()> request_shutdown;
  };
  // REQUIRES: called before the server serves.
  void SetAdminHooks(AdminHooks hooks);
  bool draining() const { return draining_.load(std::memory_order_acquire); }

  // The directories ImportCheckpoint may read (none until set: every import
  // is refused). Call before serving.
  void set_import_roots(ImportRoots roots) { import_roots_ = std::move(roots); }

  // The message of every UNAVAILABLE that shutting down causes.
  static constexpr const char* kShuttingDown = "server is shutting down";

  // From now on every new RPC fails with UNAVAILABLE; RPCs already running,
  // Step streams included, go on.
  void StopAcceptingRpcs();
  // What is in flight: open Step streams, and the other RPCs whose handlers
  // run.
  struct RpcsInFlight {
    int step_streams = 0;
    int others = 0;
  };
  RpcsInFlight InFlight() const;
  // Waits until no RPC is in flight, or until `deadline`. True if none is.
  bool WaitForRpcs(absl::Time deadline);
  // Ends what is still in flight with UNAVAILABLE (kShuttingDown): every open
  // Step stream at once (StepStream::Fail), and every other handler at its
  // next message (an export or a pull stops sending, an import or an init
  // stops reading). A handler blocked on a client that does not read is
  // left to grpc::Server::Shutdown's cancellation. REQUIRES:
  // StopAcceptingRpcs ran.
  void EndRpcs();

 private:
  // One Step stream's reactor (step_reactor.cc).
  class StepReactor;

  // A blocking method's handler: parses its requests from the stream and
  // calls the method above.
  using Handler =
      std::function<grpc::Status(grpc::ServerContextBase*, RawStream*)>;
  struct Method {
    Rpc rpc;
    Handler handler;
  };

  // Fills methods_: every method but Step.
  void AddMethods();
  // Adds the method of `rpc` (kRpcNames: its name in depot.proto) with
  // `handler`.
  void AddMethod(Rpc rpc, Handler handler);
  // A unary or server-streaming method: reads its one request and calls
  // `body(context, request, stream)`.
  template <typename Request, typename Body>
  void AddWithOneRequest(Rpc rpc, Body body);
  // A unary method: reads its one request, calls `typed` and writes the
  // response once it succeeds.
  template <typename Request, typename Response>
  void AddUnary(Rpc rpc,
                grpc::Status (DepotService::*typed)(grpc::ServerContextBase*,
                                                    const Request*, Response*));
  // A server-streaming method: reads its one request and calls `typed` with
  // a writer of its responses.
  template <typename Request, typename Response>
  void AddServerStreaming(Rpc rpc, grpc::Status (DepotService::*typed)(
                                       grpc::ServerContextBase*, const Request*,
                                       ResponseWriter<Response>*));
  // A client-streaming method: calls `typed` with a reader of its requests
  // and writes the response once it succeeds.
  template <typename Request, typename Response>
  void AddClientStreaming(Rpc rpc, grpc::Status (DepotService::*typed)(
                                       grpc::ServerContextBase*,
                                       RequestReader<Request>*, Response*));
  // The one request message of a unary or server-streaming raw method.
  // INVALID_ARGUMENT when there is none or it does not parse (counted and
  // logged as a failure of `rpc`).
  absl::Status ReadOneRequest(RawStream* stream, Rpc rpc,
                              google::protobuf::MessageLite* request);


  // Who calls: the tenant TenantAuth found, the peer's address, and the job
  // the call turned out to be about (for the audit line).
  struct Caller {
    std::string tenant;
    std::string peer;
    std::string job;  // `job 3 "name"` once known
  };

  // Counts the RPC, rejects it when shutting down, authenticates the caller
  // (UNAUTHENTICATED before `body` runs), runs `body` (counted in flight),
  // records a failure, writes the audit line of the RPCs that read or change
  // a job's state, and converts the status.
  grpc::Status Serve(Rpc rpc, const grpc::ServerContextBase& context,
                     absl::FunctionRef<absl::Status(Caller&)> body);
  // The caller's tenant (TenantAuth::TenantOf; the implicit one without auth).
  absl::StatusOr<std::string> TenantOf(
      const grpc::ServerContextBase& context) const;
  // jobs_->Find, for the job's owner only: another tenant's job is NOT_FOUND
  // with the very message of an unknown id, before its fingerprint is
  // compared. Notes the job in `caller`.
  absl::StatusOr<std::shared_ptr<ShardState>> FindOwned(Caller& caller,
                                                        uint64_t job_id) const;
  absl::StatusOr<std::shared_ptr<ShardState>> FindOwned(
      Caller& caller, uint64_t job_id, uint64_t fingerprint) const;
  // Writes `line` to the server's log (stderr).
  static void Log(const std::string& line);
  // Sets `*job` to the job's words in the audit line: `job 3 "name"`.
  static void NoteJob(std::string* job, const ShardState& shard);
  // The status of a request whose handler threw `e`: RESOURCE_EXHAUSTED for
  // a failed allocation, INTERNAL otherwise.
  static absl::Status ExceptionStatus(const std::exception& e);
  // Registers a handler as running; false once the service stopped
  // accepting RPCs (the handler must then refuse its call).
  bool EnterCall();
  void ExitCall();
  // True once EndRpcs ran: a running handler stops at its next message.
  bool ended() const { return ended_.load(std::memory_order_acquire); }
  // Counts and logs an RPC that ends with `status` (not OK).
  void RecordFailure(Rpc rpc, const absl::Status& status);
  bool accepting() const { return accepting_.load(std::memory_order_acquire); }

  absl::Status DoCreateJob(Caller& caller, const v1::CreateJobRequest& request,
                           v1::CreateJobResponse* response);
  absl::Status DoInitWeights(Caller& caller,
                             RequestReader<v1::InitWeightsRequest>* reader,
                             v1::InitWeightsResponse* response);
  absl::Status DoPullWeights(Caller& caller, const v1::PullRequest& request,
                             ResponseWriter<v1::PullResponse>* writer);
  absl::Status DoGetJob(Caller& caller, const v1::GetJobRequest& request,
                        v1::JobStatus* response);
  absl::Status DoDeleteJob(Caller& caller, const v1::DeleteJobRequest& request);
  absl::Status DoExportState(Caller& caller,
                             const v1::ExportStateRequest& request,
                             ResponseWriter<v1::StateChunk>* writer);
  absl::Status DoImportState(Caller& caller,
                             RequestReader<v1::ImportStateRequest>* reader,
                             v1::ImportStateResponse* response);
  absl::Status DoCheckpoint(Caller& caller,
                            const v1::CheckpointRequest& request,
                            v1::CheckpointResponse* response);
  absl::Status DoListCheckpoints(Caller& caller,
                                 const v1::ListCheckpointsRequest& request,
                                 v1::ListCheckpointsResponse* response);
  absl::Status DoRollBack(Caller& caller, const v1::RollBackRequest& request,
                          v1::RollBackResponse* response);
  absl::Status DoImportCheckpoint(Caller& caller,
                                  const v1::ImportCheckpointRequest& request,
                                  v1::ImportCheckpointResponse* response);
  absl::Status DoServerStatus(const Caller& caller,
                              v1::ServerStatusResponse* response);
  absl::Status DoDrain(const Caller& caller, const v1::DrainRequest& request,
                       v1::DrainResponse* response);
  // Whether `caller` is an admin (AdminHooks::admin_tenants).
  bool IsAdmin(const Caller& caller) const;
  // Reads and verifies this server's checkpoint of `shard` at each of
  // `steps`, into `response` (ListCheckpoints' `verify`).
  absl::Status VerifyCheckpoints(const ShardState& shard,
                                 const std::vector<uint64_t>& steps,
                                 v1::ListCheckpointsResponse* response);
  // Fails every open Step stream of job `job_id` with `status`.
  void FailStreamsOf(uint64_t job_id, const absl::Status& status);

  // Records an open Step stream and its job (0 until its header is read), or
  // updates its job.
  void TrackStepStream(const std::shared_ptr<StepStream>& stream,
                       uint64_t job_id);
  // Forgets the stream once its RPC is over.
  void UntrackStepStream(StepStream* stream);
  bool NoRpcsInFlight() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(streams_mu_);
  // Fails with `status` the open Step streams whose job `selected` accepts.
  // StepStream::Fail may call into gRPC (finish the RPC), so it is called
  // with no lock of ours held; a stream whose RPC ended meanwhile ignores it
  // (it had decided to finish before its reactor could be done).
  void FailStepStreams(absl::FunctionRef<bool(uint64_t job_id)> selected,
                       const absl::Status& status);

  JobStore* const jobs_;
  ServerMetrics* const metrics_;
  // The blocking methods by path ("/depot.v1.Depot/GetJob"); fixed once
  // constructed.
  std::map<std::string, Method, std::less<>> methods_;
  // The path of Step.
  std::string step_path_;
  Checkpointer* const checkpointer_;
  const TenantAuth* const auth_;
  AdminHooks admin_;
  std::atomic<bool> draining_{false};
  ImportRoots import_roots_;
  std::atomic<bool> accepting_{true};
  std::atomic<bool> ended_{false};

  mutable absl::Mutex streams_mu_;
  // Handlers of RPCs other than Step that are running (EnterCall).
  int calls_in_flight_ ABSL_GUARDED_BY(streams_mu_) = 0;
  struct TrackedStream {
    std::weak_ptr<StepStream> stream;
    uint64_t job_id = 0;
  };
  // Open Step streams and their jobs, until their reactors untrack them.
  std::map<StepStream*, TrackedStream> streams_ ABSL_GUARDED_BY(streams_mu_);
  // Last, so destroyed first: its destructor waits for the handlers'
  // threads, which may still be leaving a call.
  HandlerThreads handler_threads_;
};

}  // namespace depot

#endif  // DEPOT_SERVER_DEPOT_SERVICE_H_
