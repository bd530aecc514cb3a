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
#include "server/checkpointer.h"
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

// Step is a raw callback method (step_reactor.cc): its chunks bypass protobuf
// `bytes` in both directions. Every other method is registered raw too, as a
// sync stream of ByteBuffers whose messages the service parses itself
// (raw_stream.h): a malformed request is INVALID_ARGUMENT, never gRPC's
// INTERNAL, and a malformed message in a client stream fails the stream.
class DepotService final
    : public v1::Depot::WithRawCallbackMethod_Step<v1::Depot::Service> {
 public:
  // `jobs`, `metrics`, `checkpointer` (null: the server has no
  // --checkpoint_dir) and `auth` (null: every caller is the implicit tenant)
  // must outlive the service. A job belongs to the tenant that created it
  // (JobShape::tenant); job names are per tenant (JobKey).
  DepotService(JobStore* jobs, ServerMetrics* metrics,
               Checkpointer* checkpointer = nullptr,
               const TenantAuth* auth = nullptr);

  grpc::Status CreateJob(grpc::ServerContext* context,
                         const v1::CreateJobRequest* request,
                         v1::CreateJobResponse* response) override;
  // The client-streaming and server-streaming methods, called by their raw
  // handlers with the messages parsed (not overrides: gRPC never calls the
  // generated ones).
  grpc::Status InitWeights(grpc::ServerContext* context,
                           RequestReader<v1::InitWeightsRequest>* reader,
                           v1::InitWeightsResponse* response);
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Step(
      grpc::CallbackServerContext* context) override;
  grpc::Status PullWeights(grpc::ServerContext* context,
                           const v1::PullRequest* request,
                           ResponseWriter<v1::PullResponse>* writer);
  grpc::Status GetJob(grpc::ServerContext* context,
                      const v1::GetJobRequest* request,
                      v1::JobStatus* response) override;
  grpc::Status DeleteJob(grpc::ServerContext* context,
                         const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse* response) override;
  grpc::Status ExportState(grpc::ServerContext* context,
                           const v1::ExportStateRequest* request,
                           ResponseWriter<v1::StateChunk>* writer);
  grpc::Status ImportState(grpc::ServerContext* context,
                           RequestReader<v1::ImportStateRequest>* reader,
                           v1::ImportStateResponse* response);
  grpc::Status Checkpoint(grpc::ServerContext* context,
                          const v1::CheckpointRequest* request,
                          v1::CheckpointResponse* response) override;
  grpc::Status ListCheckpoints(grpc::ServerContext* context,
                               const v1::ListCheckpointsRequest* request,
                               v1::ListCheckpointsResponse* response) override;
  grpc::Status RollBack(grpc::ServerContext* context,
                        const v1::RollBackRequest* request,
                        v1::RollBackResponse* response) override;
  grpc::Status ImportCheckpoint(
      grpc::ServerContext* context, const v1::ImportCheckpointRequest* request,
      v1::ImportCheckpointResponse* response) override;
  // The operator's RPCs (depot_service_admin.cc, depotctl).
  grpc::Status ServerStatus(grpc::ServerContext* context,
                            const v1::ServerStatusRequest* request,
                            v1::ServerStatusResponse* response) override;
  grpc::Status Drain(grpc::ServerContext* context,
                     const v1::DrainRequest* request,
                     v1::DrainResponse* response) override;

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

  // Registers every method but Step raw (raw_stream.h), each handler parsing
  // its requests and calling the method above.
  void RegisterRawMethods();
  // Registers `method` (its name in the service) with `handler`.
  // A caller that does not authenticate is refused (by Serve, audited)
  // before its first message is read.
  void RegisterRaw(
      const char* method, Rpc rpc,
      std::function<grpc::Status(grpc::ServerContext*, RawStream*)> handler);
  // A unary method: reads its one request, calls `typed` and writes the
  // response once it succeeds.
  template <typename Request, typename Response>
  void RegisterRawUnary(const char* method, Rpc rpc,
                        grpc::Status (DepotService::*typed)(
                            grpc::ServerContext*, const Request*, Response*));
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
};

}  // namespace depot

#endif  // DEPOT_SERVER_DEPOT_SERVICE_H_
