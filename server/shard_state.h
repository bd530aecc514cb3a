// ShardState: the state of one job on this server — the fp32 master weights and
// optimizer slots of the server's shard, each chunk's last applied step, and
// the gradient contributions waiting for the rest of the workers — and the
// rules that change it (see docs/protocol.md):
//
// - A contribution for step s to a chunk whose last applied step is a is stored
//   when s == a + 1, replayed (the chunk's current weights are sent back,
//   nothing is applied) when s == a, and ABORTED otherwise.
// - Once all W workers have contributed a chunk, an update task on the thread
//   pool applies the step's commit (skip: then nothing changes but the applied
//   step), and otherwise makes one fused pass over each tensor segment of the
//   chunk (OptimizerKernel::FusedUpdate): it sums the contributions in
//   worker-rank order, undoes the loss scale, applies the clip coefficient,
//   updates the master weights and slots, and writes the new weights into a
//   PayloadPool buffer, which it delivers to every subscribed sink. The
//   contributions' payloads go back to the pool.
// - In a two-phase step the sum runs first, on its own: each summed chunk is
//   acknowledged and kept, the shard's gradient statistics go to the step's
//   streams once every chunk is summed (TwoPhaseStep), and the updates start at
//   the first commit.
// - Each chunk counts its applied training steps and, separately for each
//   tensor segment in it, that tensor's optimizer steps (those not skipped
//   that had a gradient for the tensor), which drive bias correction, as
//   torch's per-parameter state["step"].
// - A step's header may list tensors a worker has no gradient for: a tensor
//   no worker has one for is skipped (no update, count unchanged), one that
//   some workers lack takes their parts as zero.
// - A worker may send new master weights for part of a chunk before the
//   chunk's gradient (OverrideWeights): the update writes them first.
// - A worker may be a node of several local ranks, each on its own streams
//   (server/node_sender.h): a local rank's chunks and overrides must be its
//   own, and every stream of a worker's step declares the same node shape;
//   the node still counts as one contribution per chunk.
// - At checkpoint steps (EnableCaptures), each chunk's update also copies the
//   chunk into the job's capture, so the capture is the shard at that step's
//   boundary whatever later steps do (server/shard_capture.cc).
// - Each chunk keeps the weights its last two updates answered with (the
//   shared answer buffers, weight dtype, no copy), so that a pull reads the
//   whole shard at one step also while a step is half applied (ReadWeights).
// - Every request is validated in full before any state changes: a rejected
//   request leaves the state exactly as it was.
//
// The result is deterministic: the same contributions give bitwise-identical
// state whatever the thread count or arrival order.
//
// Thread safety: all methods may be called concurrently. Each chunk has its own
// lock; an update works on its chunk's arrays without holding it, and readers
// of those arrays (pulls, replays, checksums) wait for the update to finish.
#ifndef DEPOT_SERVER_SHARD_STATE_H_
#define DEPOT_SERVER_SHARD_STATE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/aligned_buffer.h"
#include "server/job_key.h"
#include "server/job_shape.h"
#include "server/memory_budget.h"
#include "server/metrics.h"
#include "server/node_sender.h"
#include "server/optimizer/optimizer_kernel.h"
#include "server/payload_pool.h"
#include "server/step_numerics.h"
#include "server/step_reply_sink.h"
#include "server/tensor_update.h"
#include "server/thread_pool.h"
#include "server/two_phase_step.h"

namespace depot {

// The largest step a job may reach (2^62): step numbers, and the applied step
// of an imported state, above it are INVALID_ARGUMENT, so that a step + 2 can
// never wrap around (issue 13: an import at 2^64 - 1 left a job stuck).
inline constexpr uint64_t kMaxStep = uint64_t{1} << 62;

// One worker's gradient for one chunk of one step.
struct Contribution {
  uint64_t step = 0;
  uint32_t worker_rank = 0;
  uint64_t chunk_index = 0;
  // grad dtype, chunk elements * dtype size bytes; kept as received (moved in).
  std::string payload;
  // Receives the chunk's weights once updated (or at once for a replay).
  std::shared_ptr<StepReplySink> sink;
  // The part of the worker that sent it (its stream's header): a node
  // worker's local rank may send only the chunks it owns.
  NodeSender sender;
};

// New master weights for elements [offset, offset + values) of a chunk
// (offset from the chunk's first element), fp32 little-endian.
struct WeightsPiece {
  uint64_t offset = 0;
  std::string payload;
};

// The saved state of one chunk (ExportState / ImportState).
struct ChunkSnapshot {
  uint64_t index = 0;
  uint64_t applied_step = 0;
  // The optimizer step count of each tensor segment of the chunk, in order.
  // On import, an empty list (a state saved before per-tensor counts) gives
  // every segment `optimizer_step`.
  std::vector<uint64_t> tensor_steps;
  uint64_t optimizer_step = 0;  // the largest of tensor_steps
  std::string master;              // fp32, chunk elements * 4 bytes
  std::vector<std::string> slots;  // one per slot, in its storage dtype
  // When set, the CRC-32C of `master` followed by every slot, in order: the
  // checksum of the chunk's section in a checkpoint file, taken by the
  // capture in the same pass as its copy (CopyChunk), so that the writer
  // does not read the chunk a second time. Unset, the writer computes it.
  // Whoever changes the bytes must reset it.
  std::optional<uint32_t> payload_crc;
  // The state of the chunk's sum-only tensors (those a worker keeps and
  // updates itself) is older than applied_step (depot.proto
  // StateChunk.lacks_worker_state): the chunk applied a step with sum-only
  // tensors since that state was last written into it.
  bool lacks_worker_state = false;
};

// One server's shard of a job at a step boundary: what a checkpoint holds
// (server/checkpoint_format.h) and what a capture copies (EnableCaptures).
struct ShardCheckpoint {
  JobConfig config;
  // The tenant that owns the job (JobShape::tenant). Not in the files, whose
  // format predates tenants: a checkpoint's directory says whose it is
  // (CheckpointDirectory).
  std::string tenant;
  JobKey key() const { return JobKey{tenant, config.name}; }
  uint64_t fingerprint = 0;
  uint32_t server_index = 0;
  uint64_t step = 0;
  // Every chunk of the shard, in index order, each at applied step `step`.
  std::vector<ChunkSnapshot> chunks;
  // Whether some chunk lacks the workers' state (ChunkSnapshot).
  bool LacksWorkerState() const {
    for (const ChunkSnapshot& chunk : chunks) {
      if (chunk.lacks_worker_state) return true;
    }
    return false;
  }
};

// What a shard does at the steps a checkpoint is taken (EnableCaptures).
struct CaptureHooks {
  // Capture at every step that is a multiple of this; 0: never.
  uint64_t every_steps = 0;
  // Receives each complete capture, on an update thread: it must only hand
  // it on (and later give it back with ReleaseCapture).
  std::function<void(std::unique_ptr<ShardCheckpoint>)> on_captured;
  // Called once for a capture step that is skipped because the previous
  // capture has not been given back yet.
  std::function<void(uint64_t step)> on_skipped;
  // --checkpoint_max_lag_steps: while the capture of step t is out (not yet
  // given back: being written), a Step stream of a step beyond t +
  // max_lag_steps does not finish (MayFinishStep). Unset: none is held.
  std::optional<uint64_t> max_lag_steps;
};

// The oldest step of a shard that still waits for contributions
// (ShardState::OldestPendingStep): what a server can tell about a stalled step.
struct PendingStepReport {
  // 0 when no chunk of the shard holds a contribution that waits for others.
  uint64_t step = 0;
  // The worker ranks, ascending, that have not yet contributed some chunk of
  // `step` that another worker has contributed. Empty when every chunk that
  // any worker has sent is complete (its update, or in a two-phase step the
  // commit, is what the step waits for).
  std::vector<uint32_t> missing_workers;
  // The step's first contribution on this server.
  std::chrono::steady_clock::time_point since;
};

// A step header's sum-only tensors (depot.proto StepHeader.sum_only_tensors,
// omit_sums; docs/protocol.md, "Sum-only tensors").
struct SumOnlyTensors {
  SumOnlyTensors() = default;
  // Implicit: a bitmap alone is the common case.
  SumOnlyTensors(std::string bitmap, bool omit_sums = false,  // NOLINT
                 bool fills_captures = false)
      : bitmap(std::move(bitmap)),
        omit_sums(omit_sums),
        fills_captures(fills_captures) {}
  std::string bitmap;  // empty: none
  // GradSums without the sums (a job of one worker, which holds them).
  bool omit_sums = false;
  // The workers fill the checkpoint captures with those tensors' state
  // (StepHeader.fills_captures; PatchCapture).
  bool fills_captures = false;
};

class ShardState : public std::enable_shared_from_this<ShardState> {
 public:
  // Allocates the state for `shape`'s shard (AlignedBuffer: 2 MiB-aligned,
  // huge pages) and has `pool`'s threads touch it first, chunk by chunk in
  // parallel, writing the initial values (master weights zero, optimizer slots
  // at InitOptimizerSlots' values) before it returns, so that the pages are
  // committed on the NUMA nodes of the threads that update them. Update tasks
  // run on `pool`, which, like `metrics`, must outlive every task (destroy the
  // pool first). Payloads are recycled through `payloads` (the server's one
  // PayloadPool). REQUIRES: not called from a task on `pool`.
  // RESOURCE_EXHAUSTED when the memory cannot be allocated.
  //
  // `noop_update` is for benchmarks that time the transfer alone: chunks are
  // neither summed nor updated (master weights, slots and optimizer step
  // counts never change), and each chunk's weights answer is worker 0's
  // gradient payload itself when the grad and weight dtypes are the same (no
  // conversion, no copy), else the unchanged weights.
  //
  // `budget` (the server's, shared with JobStore; null: none) is charged the
  // gradient payloads the shard holds while they wait for the rest of their
  // chunk's workers, and a two-phase step's sums until the update: a
  // contribution that does not fit is RESOURCE_EXHAUSTED (Contribute).
  static absl::StatusOr<std::shared_ptr<ShardState>> Create(
      uint64_t job_id, JobShape shape, ThreadPool* pool,
      std::shared_ptr<PayloadPool> payloads, ServerMetrics* metrics,
      bool noop_update = false,
      std::shared_ptr<MemoryBudget> budget = nullptr);

  ShardState(const ShardState&) = delete;
  ShardState& operator=(const ShardState&) = delete;
  ~ShardState();

  // The most a shard of `shape` keeps besides its state arrays, whatever its
  // clients send (saturated at 2^64 - 1): the job's config, layout and shard
  // plan (per tensor, per server), each chunk's bookkeeping and the slots of
  // its next step's contributions (per worker), the tensor step counts, and
  // the steps' per-worker header records (at most kTrackedSteps steps, each
  // with every worker's no_grad_tensors bitmap). The payloads themselves are
  // not in it. JobStore counts it against the budget with the state.
  static uint64_t BookkeepingBytes(const JobShape& shape);
  // The steps a shard records headers of at once: its completed step and the
  // two after it (BeginStep refuses later ones).
  static constexpr uint64_t kTrackedSteps = 3;

  // The job's own bound on what it holds in flight, apart from the server's
  // budget: the gradient payloads a shard of `shape` holds are at most
  // kHeldChunksPerWorker chunks per worker (or the shard's chunk count, if
  // fewer): num_workers x that x a chunk's payload size. (A two-phase step's
  // sums and the weights overrides, each at most a chunk per chunk and
  // worker, are bounded apart.) A contribution beyond it is
  // RESOURCE_EXHAUSTED and not kept (Contribute). Each stream holds at most
  // StepStream::kCredits (16) unanswered chunks, and a correct worker keeps
  // max_inflight_chunks (4) per stream on `connections` (3) streams per
  // local rank: a node worker of up to 85 local ranks at those defaults, or
  // one with up to 64 streams to a server kept full, never meets the bound,
  // while a client that opens stream after stream cannot make its job hold
  // more. Saturates at 2^64 - 1.
  static constexpr uint64_t kHeldChunksPerWorker = 1024;
  static uint64_t MaxHeldBytes(const JobShape& shape);

  uint64_t job_id() const { return job_id_; }
  const JobShape& shape() const { return shape_; }

  // The server's buffer pool: take a contribution's payload from it
  // (Take(bytes)); updates give the payloads back once summed, and take the
  // weights answers from it.
  PayloadPool& payload_pool() const { return *payloads_; }

  // Sets the master weights of chunk `chunk_index` from `payload` (`dtype`,
  // upcast to fp32; padding elements are stored as 0).
  // OUT_OF_RANGE: chunk outside the shard. INVALID_ARGUMENT: wrong payload
  // size. FAILED_PRECONDITION: the chunk has applied a step or has pending
  // contributions. ABORTED: the job was deleted.
  absl::Status InitChunk(uint64_t chunk_index, DType dtype,
                         std::string_view payload);

  // Checks a Step stream's header and fixes the step's group hyperparameters
  // and numerics on this server if it is the first header for that step. In a
  // two-phase step, `stats_sink` (the stream) will receive the shard's
  // GradStats.
  // INVALID_ARGUMENT: worker_rank >= num_workers, step 0, a param group not in
  // the layout or listed twice, lr or weight_decay negative or not finite,
  // invalid numerics (ValidateStepNumerics), a two-phase step without a sink.
  // FAILED_PRECONDITION: an earlier header of the same step sent other
  // hyperparameters or numerics. ABORTED: the job was deleted.
  //
  // `no_grad_tensors` is the header's bitmap of tensors this worker has no
  // gradient for (empty: none; see depot.proto StepHeader.no_grad_tensors):
  // INVALID_ARGUMENT unless it is empty or ceil(T / 8) bytes with the bits
  // past T clear; FAILED_PRECONDITION when another stream of the same worker
  // and step sent another bitmap.
  //
  // `node_shape` is how the header says the worker is split into processes
  // (NodeSender::FromHeader checked it): FAILED_PRECONDITION when another
  // stream of the same worker and step declared another shape (docs/
  // protocol.md, "Node workers").
  //
  // `sum_only` (depot.proto StepHeader.sum_only_tensors, omit_sums,
  // fills_captures; empty: none): the bitmap is validated as
  // no_grad_tensors; omit_sums needs the bitmap and a job of one worker,
  // fills_captures the bitmap (INVALID_ARGUMENT); FAILED_PRECONDITION when
  // any differs from the step's first header's.
  absl::Status BeginStep(uint64_t step, uint32_t worker_rank,
                         std::vector<GroupHyperParams> group_hparams,
                         const StepNumerics& numerics = {},
                         const std::shared_ptr<StepReplySink>& stats_sink = {},
                         std::string no_grad_tensors = {},
                         NodeShape node_shape = {},
                         SumOnlyTensors sum_only = {});

  // New master weights for part of chunk `chunk_index` from worker
  // `worker_rank` in step `step`, sent before the worker's gradient for that
  // chunk: `payload` holds fp32 values for the chunk's elements from
  // `offset` on. The chunk's update of `step` writes them (padding stays
  // zero) before the optimizer runs, and keeps the slots and step counts; the
  // lowest worker rank's values win where several overlap. Ignored (OK) when
  // the chunk already applied `step` (a resent step).
  // OUT_OF_RANGE: chunk outside the shard, or values past its end.
  // INVALID_ARGUMENT: payload empty or not a whole number of floats,
  // worker_rank out of range. FAILED_PRECONDITION: the worker already sent
  // its gradient for the chunk in this step. ABORTED: step out of order for
  // the chunk, or the job was deleted. INVALID_ARGUMENT also when `sender`,
  // a node worker's local rank, does not own the chunk (as Contribute).
  absl::Status OverrideWeights(uint64_t step, uint32_t worker_rank,
                               uint64_t chunk_index, WeightsPiece piece,
                               const NodeSender& sender = {});

  // OUT_OF_RANGE unless chunk `chunk_index` is in the shard; INVALID_ARGUMENT
  // unless `payload_bytes` is the chunk's size in the grad dtype: Contribute's
  // first checks, for a reader to make before it copies a payload anywhere.
  absl::Status CheckGradientPayload(uint64_t chunk_index,
                                    size_t payload_bytes) const {
    return CheckChunkPayload(chunk_index, payload_bytes,
                             DTypeSize(shape_.config().grad_dtype));
  }

  // Accepts one contribution (see the class comment). REQUIRES: BeginStep(step,
  // worker_rank, ...) succeeded. OUT_OF_RANGE: chunk outside the shard.
  // INVALID_ARGUMENT: wrong payload size, worker_rank out of range, or the
  // contribution's sender is a local rank of a node worker that does not own
  // the chunk (NodeSender::CheckOwns). ALREADY_EXISTS: this worker already
  // contributed the chunk for this step from a stream that is still open.
  // ABORTED: step out of order for the chunk, or the job was deleted.
  // RESOURCE_EXHAUSTED: the server's memory budget has no room for the
  // payload (it is not kept; the worker may send it again later).
  absl::Status Contribute(Contribution contribution);

  // A worker's commit of two-phase step `step`; the first one starts the
  // updates of every chunk of the shard (TwoPhaseStep::Commit states the
  // rules). FAILED_PRECONDITION also when `step` is not a two-phase step on
  // this server. ABORTED: the job was deleted.
  absl::Status Commit(uint64_t step, const CommitDecision& commit);

  // Reads the weights [begin, end) at step `step` as `dtype`, one piece per
  // chunk it touches, in order, calling emit(offset, payload) with no lock
  // held; stops early and returns CANCELLED when emit returns false.
  // OUT_OF_RANGE unless shard begin <= begin <= end <= shard end.
  //
  // Every piece is at the one step: `step`, or with 0 the shard's completed
  // step when the read starts (what completed_step() and GetJob report).
  // A step does not cross the shard at once: while it waits for a worker,
  // the chunks every worker has sent are already updated. A chunk at the
  // step is read from its master weights (fp32: exactly); a chunk one step
  // ahead from the weights its update before the last produced (kept for
  // this; server/shard_pull.cc), which exist only in the job's weight dtype:
  // another dtype is FAILED_PRECONDITION unless the weight dtype is fp32.
  // FAILED_PRECONDITION also when a chunk is not yet at the step, or two or
  // more steps past it (the message says where the shard is).
  absl::Status ReadWeights(
      uint64_t begin, uint64_t end, DType dtype, uint64_t step,
      const std::function<bool(uint64_t offset, std::string payload)>& emit)
      const;

  // What gRPC may receive on one Step stream of this job ahead of its
  // reader: while a read is pending, HTTP/2 flow control lets the whole
  // message being read in, whatever the stream's window. That is at most
  // the largest message a worker sends: a whole chunk of fp32 values (a
  // gradient in the grad dtype is at most that, a weights override is fp32)
  // and its framing. The Step reader reserves it in the server's budget for
  // as long as it reads the stream (docs/protocol.md, "Bounds and memory").
  uint64_t StepReceiveBytes() const;
  static constexpr uint64_t kStepMessageFramingBytes = 64;

  // Bytes of payloads (and two-phase sums) the shard holds for steps in
  // flight, charged to the budget.
  uint64_t inflight_bytes() const {
    return held_bytes_.load(std::memory_order_relaxed);
  }

  // The last step applied to every chunk of the shard (0 before the first).
  uint64_t completed_step() const;
  // The newest step applied to some chunk of the shard: completed_step() + 1
  // while a step is half applied. Reads each chunk's step under its lock.
  uint64_t newest_step() const;

  // Rolling back (the RollBack RPC; server/shard_rollback.cc). Between
  // BeginRollBack and EndRollBack, BeginStep, OverrideWeights, Contribute
  // and Commit are UNAVAILABLE ("the job is being rolled back"), and
  // BeginRollBack waits for those already running to return, so that
  // nothing new arrives while DropInFlight empties the shard.
  void BeginRollBack() ABSL_EXCLUSIVE_LOCK_FUNCTION(rollback_mu_);
  void EndRollBack() ABSL_UNLOCK_FUNCTION(rollback_mu_);
  // Drops every contribution in flight: waits for the sums and updates that
  // run, gives the payloads back, and forgets the headers of the steps after
  // the completed one. Returns the number of (chunk, worker) contributions
  // dropped. The streams that sent them are not told: the caller fails
  // them. REQUIRES: inside BeginRollBack / EndRollBack.
  uint64_t DropInFlight();

  // The oldest step that has contributions waiting on some chunk, and which
  // workers it waits for (server/pending_step_report.cc). Reads each chunk's
  // bookkeeping under its lock, one at a time: a snapshot that may be a
  // moment old, for status and diagnostics only.
  PendingStepReport OldestPendingStep() const;

  // A hash of the master weights, the slots (as stored: bf16 slots are hashed
  // as their 2-byte values) and the per-chunk optimizer step counts, chunk by
  // chunk in index order (master, slot 0, slot 1, optimizer steps). Equal state
  // gives an equal checksum on any server; a skipped step changes none of it.
  uint64_t Checksum() const;

  // Copies each chunk of the shard, in index order, once no update runs on
  // it, and calls emit with no lock held; CANCELLED when emit returns false.
  // Chunks are copied one at a time: call it while no step is in flight to
  // get one consistent state. ABORTED: the job was deleted.
  absl::Status ExportChunks(
      const std::function<bool(ChunkSnapshot)>& emit) const;
  // Only the chunks `only` lists, in that order (empty: every chunk).
  // OUT_OF_RANGE: a chunk outside the shard; INVALID_ARGUMENT: one listed
  // twice (nothing emitted).
  absl::Status ExportChunks(
      const std::vector<uint64_t>& only,
      const std::function<bool(ChunkSnapshot)>& emit) const;

  // Replaces the whole shard's state by `chunks` (server/shard_snapshot.cc).
  // All is checked before anything changes; on error the state is untouched.
  // INVALID_ARGUMENT: a chunk listed twice or missing, wrong master or slot
  // sizes or slot count, chunks at different applied steps, an optimizer step
  // above the applied step. OUT_OF_RANGE: a chunk outside the shard.
  // FAILED_PRECONDITION: a chunk has pending contributions or an update
  // running. ABORTED: the job was deleted.
  absl::Status ImportChunks(std::vector<ChunkSnapshot> chunks);
  // Replaces the state of the chunks sent only, each at most once, at the
  // step every chunk of the shard is at (the ImportState patch,
  // docs/protocol.md "Patching a part of the state"). The step, the
  // completed step, the captures and the weights kept for pulls stay. All is
  // checked before anything changes. Errors as ImportChunks, but for a
  // missing chunk; FAILED_PRECONDITION also: a chunk of the patch at another
  // step than the shard's, or the shard's chunks at different steps.
  absl::Status PatchChunks(std::vector<ChunkSnapshot> chunks);
  // The workers' state of the sum-only tensors at step `step`, into the
  // periodic capture of that step, which waits for it (the ImportState
  // patch with capture_step; docs/checkpoints.md, "The state the workers
  // keep"): of each chunk sent, only the elements of the step's sum-only
  // tensors and their step counts are taken. The capture goes to
  // on_captured once every chunk it waits for has come. All is checked
  // before anything changes. FAILED_PRECONDITION: no capture of `step`
  // waits (written without it, dropped, or never taken). INVALID_ARGUMENT:
  // a chunk the capture does not wait for (none of the step's sum-only
  // tensors in it, or sent already), at another step, or sent twice; the
  // sizes and counts as ImportChunks. OUT_OF_RANGE: a chunk outside the
  // shard. ABORTED: the job was deleted.
  absl::Status PatchCapture(uint64_t step, std::vector<ChunkSnapshot> chunks);

  // Checkpoint captures (server/shard_capture.cc). From now on, at every
  // step t that is a multiple of hooks.every_steps, each chunk is copied as
  // its update of step t ends (on the update thread, while the chunk's next
  // step cannot start), so the copy is the shard's state exactly at the
  // boundary of t whatever later steps do meanwhile; the whole copy goes to
  // hooks.on_captured once every chunk has applied t. A shard holds at most
  // one copy (the state's size in bytes, reused from one capture to the
  // next): while the last one has not come back through ReleaseCapture, or
  // an earlier step is still being copied, a capture step is skipped.
  // A step whose workers fill the captures (SumOnlyTensors::fills_captures)
  // is handed on only once PatchCapture has brought the state of every
  // chunk that holds sum-only tensors; if the next capture step comes
  // first, it is handed on without that state (its chunks marked
  // lacks_worker_state) and the new step is skipped.
  // REQUIRES: called before any step runs (the job is not yet visible).
  void EnableCaptures(CaptureHooks hooks);
  // Gives a capture back once written; its buffers serve the next one.
  // Opens the gate of MayFinishStep.
  void ReleaseCapture(std::unique_ptr<ShardCheckpoint> capture);
  // Whether a Step stream of `step` may finish now (CaptureHooks::
  // max_lag_steps): false while a periodic capture of a step t with
  // t + max_lag_steps < `step` is out; `on_open` is then called once it is
  // given back (from the thread that gives it back, with no lock held).
  // So with max_lag_steps = 0 no worker sees a step after a checkpoint step
  // complete before that checkpoint is durable on this server, and a kill
  // loses at most the checkpoint interval (docs/checkpoints.md).
  bool MayFinishStep(uint64_t step, std::function<void()> on_open);
  // An on-demand capture (the Checkpoint RPC): the whole shard now, at its
  // completed step, which must be a step boundary. Give it back with
  // ReleaseCapture. FAILED_PRECONDITION: a step is in flight (a chunk holds
  // contributions, or the chunks are at different steps); UNAVAILABLE
  // (retryable): a capture of this job is being taken or written; ABORTED:
  // the job was deleted. A periodic capture that only waits for the
  // workers' state (PatchCapture) is dropped: this one, of a later or the
  // same step, takes its place.
  absl::StatusOr<std::unique_ptr<ShardCheckpoint>> CaptureNow();

  // Marks the job deleted: later InitChunk, BeginStep and Contribute calls fail
  // with ABORTED. Updates already queued still run.
  void MarkDeleted();
  bool deleted() const { return deleted_.load(std::memory_order_acquire); }

 private:
  struct PendingStep;
  struct KeptWeights;
  struct ChunkState;
  // What this server knows of one step across the chunks of its shard.
  struct StepProgress {
    // Fixed by the step's first header, sorted by param group.
    std::vector<GroupHyperParams> group_hparams;
    // Each worker's no_grad_tensors bitmap, from its first header (empty:
    // every tensor has a gradient, or no header yet).
    std::vector<std::string> no_grad;
    // The step's sum_only_tensors bitmap (empty: none), whether its
    // GradSums leave out the sums (StepHeader.omit_sums), and whether its
    // workers fill the captures (StepHeader.fills_captures).
    std::string sum_only;
    bool omit_sums = false;
    bool fills_captures = false;
    // Each worker's NodeShape, from its first header.
    std::vector<NodeShape> node_shapes;
    std::vector<bool> header_seen;
    StepNumerics numerics;
    std::shared_ptr<TwoPhaseStep> two_phase;  // set in a two-phase step
    uint64_t chunks_applied = 0;
    bool started = false;
    std::chrono::steady_clock::time_point first_contribution;
  };

  ShardState(uint64_t job_id, JobShape shape, AlignedBuffer state,
             ThreadPool* pool, std::shared_ptr<PayloadPool> payloads,
             ServerMetrics* metrics, bool noop_update,
             std::shared_ptr<MemoryBudget> budget);

  // The budget's share of payloads held (held_bytes_): TryHold refuses what
  // does not fit, Hold does not; Unhold gives bytes back.
  bool TryHold(uint64_t bytes);
  // The gradient payloads held (payload_bytes_).
  uint64_t HeldPayloadBytes() const;
  // Whether holding `bytes` more keeps the shard within MaxHeldBytes
  // (checked before TryHold; concurrent callers may pass it together, by at
  // most a payload each); else HeldLimitError's RESOURCE_EXHAUSTED, naming
  // `what`.
  bool WithinHeldLimit(uint64_t bytes) const;
  absl::Status HeldLimitError(uint64_t bytes, absl::string_view what) const;
  void Hold(uint64_t bytes);
  void Unhold(uint64_t bytes);
  // The sizes of `payloads`, summed.
  static uint64_t TotalBytes(const std::vector<std::string>& payloads);

  // The GradSum of chunk `range` (depot.proto): the sums from its one-phase
  // `payloads` (absent workers' parts already zeroed), or from the
  // two-phase sum `summed` (RunSum's), the sum-only tensors no worker has a
  // gradient for (`absent`: CountAbsentWorkers of `segments`), and the
  // decision the update applies (`commit`); null
  // when the chunk holds no sum-only tensor. Its bytes are held (Hold) until
  // the last reference to it is gone.
  std::shared_ptr<const GradSumReply> SumOnlyGradients(
      const StepProgress& settings, const CommitDecision& commit,
      const ChunkRange& range, const std::vector<Segment>& segments,
      const std::vector<uint32_t>& absent,
      const std::vector<std::string>& payloads, const std::string& summed);

  // Writes the initial state of chunk `chunk_index` (see Create).
  void InitChunkState(uint64_t chunk_index);

  absl::Status CheckNotDeleted() const;
  // Held shared by BeginStep, OverrideWeights, Contribute and Commit for
  // their length (UNAVAILABLE instead of waiting while a rollback holds it).
  class Accepting;
  // INVALID_ARGUMENT unless `bitmap` is a valid no_grad_tensors (BeginStep).
  // A bitmap over the layout's tensors (no_grad_tensors, sum_only_tensors:
  // `field` names it in the error).
  absl::Status ValidateTensorBitmap(const std::string& bitmap,
                                    absl::string_view field) const;
  // OUT_OF_RANGE unless the chunk is in the shard; INVALID_ARGUMENT unless
  // payload_bytes == chunk elements * dtype_size.
  absl::Status CheckChunkPayload(uint64_t chunk_index, size_t payload_bytes,
                                 size_t dtype_size) const;
  ChunkState& chunk_state(uint64_t chunk_index) const;
  // The chunk's master weights.
  float* master(const ChunkRange& chunk) const;
  // Element `index` (a flat index in the shard) of state slot k, in the slot's
  // dtype. REQUIRES: k < shape_.slots().
  void* slot(int k, uint64_t index) const;
  // Master weights [begin, end) as `dtype`. REQUIRES: no update runs on them.
  std::string EncodeMaster(uint64_t begin, uint64_t end, DType dtype) const;
  // The same into out, which holds (end - begin) elements of `dtype`.
  void EncodeMasterInto(uint64_t begin, uint64_t end, DType dtype,
                        void* out) const;

  // Runs `task` (a sum or an update) on the pool, counted in tasks_running_
  // until it has returned.
  void ScheduleTask(std::function<void()> task);

  void NoteContributionStart(uint64_t step);
  // Two-phase steps: runs on the pool once every worker has contributed
  // `chunk_index` for `step`; sums, keeps the sum and reports its statistics.
  void RunSum(uint64_t chunk_index, uint64_t step);
  // Runs on the pool once every worker has contributed `chunk_index` for
  // `step` (one phase) or once the step is committed (two phases).
  void RunUpdate(uint64_t chunk_index, uint64_t step);
  // Zeroes, in each worker's payload (grad dtype, the chunk `range`), the
  // segments that worker has no gradient for while another worker has one.
  void ZeroAbsentParts(const StepProgress& settings, const ChunkRange& range,
                       const std::vector<Segment>& segments,
                       const std::vector<uint32_t>& absent_workers,
                       std::vector<std::string>& payloads) const;
  // Writes the workers' weights overrides into the chunk's master weights,
  // the lowest rank last (so it wins), padding kept zero.
  void ApplyOverrides(const ChunkRange& range,
                      std::vector<std::vector<WeightsPiece>>& overrides);
  // Returns the payloads' buffers to the payload pool and empties the vector.
  void GiveBack(std::vector<std::string>& payloads);
  // A copy of what this server knows of the step: what its first header
  // fixed, and its progress (defaults if no header was seen).
  StepProgress ProgressOf(uint64_t step) const;
  // The step's TwoPhaseStep; null in a one-phase (or unknown) step.
  std::shared_ptr<TwoPhaseStep> TwoPhaseOf(uint64_t step) const;
  void NoteChunkApplied(uint64_t step);
  // The weights of chunk `index`'s elements [begin, end) at step `at`, as
  // `dtype` (ReadWeights states the rules). REQUIRES: the chunk's mu held,
  // no update running on it.
  absl::StatusOr<std::string> EncodeWeightsAt(uint64_t index, uint64_t begin,
                                              uint64_t end, DType dtype,
                                              uint64_t at) const;
  // Copies chunk `chunk_index`, which has just applied `step` with the
  // optimizer counts `tensor_steps`, into the step's capture if it is a
  // capture step; `lacks_worker_state` is the chunk's flag after the step.
  // With `waits` (the step's workers fill captures and this chunk holds
  // some of its sum-only tensors, `sum_only`) the capture waits for the
  // chunk's workers' state (PatchCapture). Returns whether it does: the
  // chunk's answer to worker 0 then asks for it (GradSum.capture_wanted).
  // REQUIRES: the caller owns the chunk's arrays.
  bool CaptureChunk(uint64_t chunk_index, uint64_t step,
                    const std::vector<uint64_t>& tensor_steps,
                    bool lacks_worker_state, bool waits,
                    const std::string& sum_only);
  // Hands the capture being filled on (on_captured) once every chunk is
  // copied and none waits for the workers' state; returns the hook to call
  // with it, with no lock held (null: not yet).
  std::function<void()> HandOnIfWhole()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(capture_mu_);
  // Drops a capture still being filled (the state was replaced by an import).
  void DropCapture(uint64_t imported_step);
  // ImportChunks' and PatchChunks' checks of each chunk sent (sizes, slot
  // count, step counts; an empty tensor_steps filled from optimizer_step).
  absl::Status CheckSnapshot(ChunkSnapshot& snapshot) const;
  // CheckSnapshot of every chunk, then `staged`: one pointer per chunk of
  // the shard, null for a chunk not sent. INVALID_ARGUMENT: one sent twice.
  absl::Status StageSnapshots(std::vector<ChunkSnapshot>& chunks,
                              std::vector<ChunkSnapshot*>& staged) const;
  // Runs `body` with every chunk of the shard locked (in index order), once
  // none has pending contributions: FAILED_PRECONDITION naming `verb`
  // ("import", "patch") otherwise, and `body` does not run. Returns body's.
  absl::Status WithEveryChunkIdle(absl::string_view verb,
                                  const std::function<absl::Status()>& body);
  // The reverse of CopyChunk: `snapshot`'s master, slots and step counts
  // into its chunk. REQUIRES: the chunk's lock held, the chunk idle.
  void WriteChunk(const ChunkSnapshot& snapshot);
  // Copies chunk `index`'s state into `out`, reusing its buffers, and sets
  // its payload_crc in the same pass.
  // REQUIRES: no update runs on it (its lock held and idle, or its update
  // task calling).
  void CopyChunk(uint64_t index, uint64_t applied_step,
                 const std::vector<uint64_t>& tensor_steps,
                 ChunkSnapshot& out) const;

  const uint64_t job_id_;
  const JobShape shape_;
  AlignedBuffer state_;
  // Where each slot's array starts in state_, and its element size.
  unsigned char* slot_begin_[3] = {nullptr, nullptr, nullptr};
  size_t slot_elem_bytes_[3] = {0, 0, 0};
  const GroupKernels kernels_;
  ThreadPool* const pool_;
  const std::shared_ptr<PayloadPool> payloads_;
  ServerMetrics* const metrics_;
  const bool noop_update_;
  const std::shared_ptr<MemoryBudget> budget_;
  std::atomic<uint64_t> held_bytes_{0};
  // The part of held_bytes_ that is gradient payloads (MaxHeldBytes bounds
  // it; two-phase sums, GradSum sums and weights overrides are bounded
  // apart). Its own counter, not held_bytes_ less the others: two counters
  // moved one after the other read in between as a sum charged twice (a
  // chunk's fp32 sum before its payloads left), and a contribution was
  // refused under a limit it did not pass.
  std::atomic<uint64_t> payload_bytes_{0};
  const uint64_t max_held_bytes_;  // MaxHeldBytes(shape_)
  std::unique_ptr<ChunkState[]> chunks_;
  std::atomic<bool> deleted_{false};

  std::atomic<uint64_t> capture_every_{0};
  absl::Mutex capture_mu_;
  CaptureHooks capture_hooks_ ABSL_GUARDED_BY(capture_mu_);
  // The capture being filled (null when none) and how many chunks it holds.
  std::unique_ptr<ShardCheckpoint> capture_ ABSL_GUARDED_BY(capture_mu_);
  uint64_t captured_chunks_ ABSL_GUARDED_BY(capture_mu_) = 0;
  // The capture's chunks (by shard position) that wait for the workers'
  // state, how many do, and the capture step's sum_only_tensors bitmap.
  std::vector<bool> capture_waits_ ABSL_GUARDED_BY(capture_mu_);
  uint64_t capture_waiting_ ABSL_GUARDED_BY(capture_mu_) = 0;
  std::string capture_sum_only_ ABSL_GUARDED_BY(capture_mu_);
  // The last capture step decided on (captured or skipped).
  uint64_t capture_decided_step_ ABSL_GUARDED_BY(capture_mu_) = 0;
  // A complete capture is out (on_captured) and not yet released.
  bool capture_out_ ABSL_GUARDED_BY(capture_mu_) = false;
  // The step of the periodic capture that is out, while one is and
  // max_lag_steps is set; the streams waiting for it to come back.
  std::optional<uint64_t> gate_step_ ABSL_GUARDED_BY(capture_mu_);
  std::vector<std::function<void()>> gate_waiters_
      ABSL_GUARDED_BY(capture_mu_);
  // A released capture, whose buffers the next one reuses.
  std::unique_ptr<ShardCheckpoint> capture_spare_ ABSL_GUARDED_BY(capture_mu_);

  // Held by a rollback, shared by the calls that add to the shard (Accepting).
  absl::Mutex rollback_mu_;
  // Sums and updates scheduled and not yet returned (a rollback waits for
  // them: an update's last bookkeeping runs after it let go of its chunk).
  absl::Mutex tasks_mu_;
  int tasks_running_ ABSL_GUARDED_BY(tasks_mu_) = 0;

  mutable absl::Mutex steps_mu_;
  // Steps from completed_step_ on that a header has been seen for.
  std::map<uint64_t, StepProgress> steps_ ABSL_GUARDED_BY(steps_mu_);
  uint64_t completed_step_ ABSL_GUARDED_BY(steps_mu_) = 0;
};

}  // namespace depot

#endif  // DEPOT_SERVER_SHARD_STATE_H_
