// JobImpl: depot::Job over gRPC. Each operation fans out to the servers in
// parallel (call_group.h); Step's per-server streams live in step_stream.h.
#ifndef DEPOT_CLIENT_SRC_JOB_IMPL_H_
#define DEPOT_CLIENT_SRC_JOB_IMPL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "call_group.h"
#include "channel.h"
#include "depot/client.h"
#include "grpcpp/client_context.h"
#include "state_blob.h"
#include "step_stream.h"

namespace depot::client_internal {

class JobImpl : public Job {
 public:
  // REQUIRES: job_ids[s] is the id server s returned for this job, for every s;
  // config, layout, plan and fingerprint agree (OpenJob computed them
  // together).
  JobImpl(JobConfig config, Layout layout, ShardPlan plan, uint64_t fingerprint,
          uint32_t worker_rank, std::shared_ptr<const Connections> connections,
          ClientOptions options, std::vector<uint64_t> job_ids);

  absl::Status InitWeights(const void* weights, DType dtype) override;
  absl::Status Step(uint64_t step, const void* grads, void* weights_out,
                    StepResult* result, const StepOptions& options) override;
  using Job::Pull;
  absl::Status Pull(uint64_t begin, uint64_t end, DType dtype, void* out,
                    uint64_t step) override;
  absl::StatusOr<std::vector<ServerJobStatus>> Status(
      bool with_checksum) override;
  absl::Status Delete() override;
  absl::StatusOr<uint64_t> Checkpoint() override;
  // job_recovery.cc
  absl::StatusOr<std::vector<ServerCheckpoints>> ListCheckpoints() override;
  absl::Status RollBack(uint64_t step) override;
  absl::Status ImportCheckpoint(
      uint64_t step, const std::vector<std::string>& checkpoint_dirs) override;
  absl::StatusOr<Reconciled> Reconcile() override;
  // job_state.cc
  absl::StatusOr<std::string> SaveState() override;
  absl::Status LoadState(const std::string& blob) override;
  absl::StatusOr<FlatState> DecodeState(
      const std::string& blob) const override;
  absl::StatusOr<std::string> EncodeState(
      const FlatState& state) const override;
  absl::StatusOr<FlatState> ReadStatePart(uint64_t begin,
                                          uint64_t end) override;
  absl::Status PatchCapturePart(uint64_t step, uint64_t begin, uint64_t end,
                                const FlatState& part) override;
  absl::StatusOr<uint64_t> NewestCheckpointWithWorkerState(
      uint64_t at) override;
  absl::Status PatchStatePart(uint64_t begin, uint64_t end,
                              const FlatState& part) override;

  // A streamed step (step_stream.h). When it runs in two phases
  // (NeedsTwoPhases), its routes are exactly one per server with chunks (in
  // any order), each possibly without chunks: every process of a node
  // commits the decision of every server's GradStats.
  absl::Status StepStreamed(const StreamedStep& step, StepResult* result);

  // Whether a Step with `options` runs in two phases: no known commit, and the
  // config clips, has a skip threshold or scales the loss dynamically.
  bool NeedsTwoPhases(const StepOptions& options) const;

 private:
  // One attempt at Step (Step adds the recovery of job_recovery.cc).
  absl::Status StepOnce(uint64_t step, const void* grads, void* weights_out,
                        StepResult* result, const StepOptions& options);
  // job_recovery.cc: CreateJob again on every server (attaching), the job
  // ids refreshed. DATA_LOSS when a server created the job afresh: it had
  // lost it (the fresh job is deleted again).
  absl::Status Reattach();
  // ListCheckpoints on `servers`, indexed by server.
  absl::StatusOr<std::vector<ServerCheckpoints>> QueryCheckpoints(
      const std::vector<uint32_t>& servers) const;
  // RollBack(step) on `servers`.
  absl::Status RollBackServers(const std::vector<uint32_t>& servers,
                               uint64_t step) const;
  // ImportCheckpoint on every server with chunks: a check only when
  // `verify_only`.
  absl::Status ImportCheckpointOnServers(
      uint64_t step, const std::vector<std::string>& checkpoint_dirs,
      bool verify_only) const;
  // Reconcile, retried while servers are UNAVAILABLE (restarting) or lose the
  // job ids it just learnt (restarted again) until `give_up`.
  absl::StatusOr<Reconciled> ReconcileUntil(absl::Time give_up);

  // The servers whose shard holds at least one chunk: the only ones that take
  // part in InitWeights and Step.
  std::vector<uint32_t> ServersWithChunks() const;

  // Step's checks of its number and options; the no_grad_tensors bitmap.
  absl::StatusOr<std::string> CheckStepOptions(
      uint64_t step, const StepOptions& options) const;
  // The stream parameters every Step stream of the step shares.
  StepStreamParams StreamParams(uint64_t step, const StepOptions& options,
                                const std::string& no_grad,
                                absl::Time start) const;
  // *result from the streams' stats (and the barrier's decision).
  void FillResult(uint64_t step, const StepOptions& options,
                  const std::vector<StepStreamStats>& stats,
                  const CommitBarrier* barrier, absl::Time start,
                  StepResult* result) const;

  // OUT_OF_RANGE unless begin < end <= N (ReadStatePart, PatchStatePart).
  absl::Status CheckPartRange(uint64_t begin, uint64_t end) const;
  // ReadStatePart and PatchStatePart: the chunks over [begin, end), each
  // from its server (ExportState of those chunks), in index order, all at
  // one step, with the sizes of the job's arrays (INTERNAL otherwise).
  // OUT_OF_RANGE, FAILED_PRECONDITION as ReadStatePart.
  absl::StatusOr<std::vector<v1::StateChunk>> ExportPart(uint64_t begin,
                                                         uint64_t end);
  // ExportState on each of `servers` at once, of the chunks `wanted` lists
  // for it (empty: its whole shard), into out[server], in the order sent.
  absl::Status ExportFromServers(
      const std::vector<uint32_t>& servers,
      const std::vector<std::vector<uint64_t>>& wanted,
      std::vector<std::vector<v1::StateChunk>>& out);
  // ImportState of chunks[server] on each of `servers` at once (`patch`: only
  // those chunks, docs/protocol.md "Patching a part of the state"); the
  // chunks are moved out.
  // `capture_step` (with patch): into the servers' captures of that step.
  absl::Status ImportOnServers(const std::vector<uint32_t>& servers,
                               std::vector<std::vector<v1::StateChunk>>& chunks,
                               bool patch, uint64_t capture_step = 0);
  // EncodeState's and PatchStatePart's checks of `state`'s arrays: `n`
  // master weights and as many per slot the job keeps, one count per tensor.
  // INVALID_ARGUMENT naming `what`.
  absl::Status CheckStateArrays(const char* what, const FlatState& state,
                                uint64_t n) const;
  // A SaveState blob of this job's config, decoded. DATA_LOSS: corrupt;
  // FAILED_PRECONDITION: of another config or server count.
  absl::StatusOr<StateBlob> DecodeOwnStateBlob(const std::string& bytes) const;
  // What differs between the config `blob` was saved from and this job's, in
  // words ("checkpoint" vs "this job"), or the two fingerprints when the blob
  // does not carry its config (format version 1).
  std::string SavedConfigDifferences(const StateBlob& blob) const;
  // A list of tensors (StepOptions::no_grad_tensors, `field`) as the
  // header's bitmap (empty for none).
  // INVALID_ARGUMENT: an index out of range or listed twice.
  absl::StatusOr<std::string> TensorBitmap(
      const std::vector<uint32_t>& tensors,
      absl::string_view field = "no_grad_tensors") const;
  // StepOptions::weight_overrides cut into per-chunk pieces, sorted by chunk.
  // INVALID_ARGUMENT: an index out of range or twice, or null values.
  absl::StatusOr<std::vector<ChunkOverride>> OverridePieces(
      const std::vector<TensorWeights>& tensors) const;

  // Step's streams to one server (params has its job id and index): one in
  // a two-phase step (params.barrier set: the GradStats and the commit are
  // one exchange per stream, and the barrier expects one report per server);
  // in one phase, one per connection, each over a contiguous part of the
  // shard. Their stats summed; the first failure
  // (which cancels the group).
  absl::StatusOr<StepStreamStats> StepServer(StepStreamParams params,
                                             CallGroup& group) const;

  absl::Status InitShard(uint32_t server, const void* weights, DType dtype,
                         absl::Time deadline, CallGroup& group) const;
  absl::Status PullRange(uint32_t server, uint64_t begin, uint64_t end,
                         DType dtype, uint64_t step, void* out,
                         absl::Time deadline, CallGroup& group) const;

  // job_status.cc: server `server`'s GetJob on `context`, its fingerprint
  // checked (FAILED_PRECONDITION when the server holds another job under the
  // id).
  absl::StatusOr<ServerJobStatus> QueryStatus(
      uint32_t server, bool with_checksum, grpc::ClientContext* context) const;

  // job_status.cc: `status` from a Step that ran into its `deadline`
  // (DEADLINE_EXCEEDED, or CANCELLED once the deadline has passed) with what
  // each of `servers` says that step waits for, asked with a short deadline;
  // DEADLINE_EXCEEDED either way. Any other status is returned as it is.
  absl::Status ExplainStepDeadline(uint64_t step, absl::Time deadline,
                                   const std::vector<uint32_t>& servers,
                                   absl::Status status) const;

  std::shared_ptr<const Connections> connections_;
  ClientOptions options_;
  std::vector<uint64_t> job_ids_;
};

// CreateJob (create, or attach to the job of that name) on every server of
// `connections`, each as its own server index, each answer checked against
// `fingerprint` and its shard of `plan` (client.cc): the job ids, and
// whether each server created the job afresh.
struct CreatedJob {
  std::vector<uint64_t> ids;
  std::vector<char> created;
};
absl::StatusOr<CreatedJob> CreateJobOnServers(const Connections& connections,
                                              const JobConfig& config,
                                              uint64_t fingerprint,
                                              const ShardPlan& plan,
                                              absl::Time deadline);

// Whether a streamed step of `job` with `options` runs in two phases (false
// for a Job that is not a JobImpl).
bool StreamedStepIsTwoPhase(Job& job, const StepOptions& options);

// job.StepStreamed when `job` is a JobImpl (a Job from Client::OpenJob of
// this library), else FAILED_PRECONDITION.
absl::Status RunStreamedStep(Job& job, const StreamedStep& step,
                             StepResult* result);

// A second handle on `job` as it is now (its servers' job ids included),
// for a thread that calls it while `job` is in use elsewhere: one Job's
// methods must not run concurrently, two handles' may. FAILED_PRECONDITION
// when `job` is not a JobImpl.
absl::StatusOr<std::unique_ptr<Job>> CopyJobHandle(const Job& job);

}  // namespace depot::client_internal

#endif  // DEPOT_CLIENT_SRC_JOB_IMPL_H_
