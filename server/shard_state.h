// ShardState: the state of one job on this server — the fp32 master weights and
// optimizer slots of the server's shard, each chunk's last applied step, and
// the gradient contributions waiting for the rest of the workers — and the
// rules that change it (see docs/protocol.md):
//
// - A contribution for step s to a chunk whose last applied step is a is stored
//   when s == a + 1, replayed (the chunk's current weights are sent back,
//   nothing is applied) when s == a, and ABORTED otherwise.
// - Once all W workers have contributed a chunk, an update task on the thread
// pool
//   sums the contributions in worker-rank order, runs the optimizer kernel on
//   each tensor segment, and delivers the new weights to every subscribed sink.
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
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/aligned_buffer.h"
#include "server/job_shape.h"
#include "server/metrics.h"
#include "server/optimizer/optimizer_kernel.h"
#include "server/thread_pool.h"
#include "server/weights_sink.h"

namespace depot {

// One worker's gradient for one chunk of one step.
struct Contribution {
  uint64_t step = 0;
  uint32_t worker_rank = 0;
  uint64_t chunk_index = 0;
  // grad dtype, chunk elements * dtype size bytes; kept as received (moved in).
  std::string payload;
  // Receives the chunk's weights once updated (or at once for a replay).
  std::shared_ptr<WeightsSink> sink;
};

class ShardState : public std::enable_shared_from_this<ShardState> {
 public:
  // Allocates zeroed state for `shape`'s shard. Update tasks run on `pool`,
  // which, like `metrics`, must outlive every task (destroy the pool first).
  // RESOURCE_EXHAUSTED when the memory cannot be allocated.
  static absl::StatusOr<std::shared_ptr<ShardState>> Create(
      uint64_t job_id, JobShape shape, ThreadPool* pool,
      ServerMetrics* metrics);

  ShardState(const ShardState&) = delete;
  ShardState& operator=(const ShardState&) = delete;
  ~ShardState();

  uint64_t job_id() const { return job_id_; }
  const JobShape& shape() const { return shape_; }

  // Sets the master weights of chunk `chunk_index` from `payload` (`dtype`,
  // upcast to fp32; padding elements are stored as 0).
  // OUT_OF_RANGE: chunk outside the shard. INVALID_ARGUMENT: wrong payload
  // size. FAILED_PRECONDITION: the chunk has applied a step or has pending
  // contributions. ABORTED: the job was deleted.
  absl::Status InitChunk(uint64_t chunk_index, DType dtype,
                         std::string_view payload);

  // Checks a Step stream's header and fixes the step's group hyperparameters on
  // this server if it is the first header for that step.
  // INVALID_ARGUMENT: worker_rank >= num_workers, step 0, a param group not in
  // the layout or listed twice, lr or weight_decay negative or not finite.
  // FAILED_PRECONDITION: an earlier header of the same step sent other
  // hyperparameters. ABORTED: the job was deleted.
  absl::Status BeginStep(uint64_t step, uint32_t worker_rank,
                         std::vector<GroupHyperParams> group_hparams);

  // Accepts one contribution (see the class comment). REQUIRES: BeginStep(step,
  // worker_rank, ...) succeeded. OUT_OF_RANGE: chunk outside the shard.
  // INVALID_ARGUMENT: wrong payload size. ALREADY_EXISTS: this worker already
  // contributed the chunk for this step from a stream that is still open.
  // ABORTED: step out of order for the chunk, or the job was deleted.
  absl::Status Contribute(Contribution contribution);

  // Reads master weights [begin, end) as `dtype`, one piece per chunk it
  // touches, in order, calling emit(offset, payload) with no lock held; stops
  // early and returns CANCELLED when emit returns false. OUT_OF_RANGE unless
  // shard begin <= begin <= end <= shard end.
  absl::Status ReadWeights(
      uint64_t begin, uint64_t end, DType dtype,
      const std::function<bool(uint64_t offset, std::string payload)>& emit)
      const;

  // The last step applied to every chunk of the shard (0 before the first).
  uint64_t completed_step() const;

  // A hash of the master weights, the slots and the per-chunk applied steps,
  // chunk by chunk in index order (master, slot 0, slot 1, applied step). Equal
  // state gives an equal checksum on any server.
  uint64_t Checksum() const;

  // Marks the job deleted: later InitChunk, BeginStep and Contribute calls fail
  // with ABORTED. Updates already queued still run.
  void MarkDeleted();

 private:
  struct PendingStep;
  struct ChunkState;
  // What this server knows of one step across the chunks of its shard.
  struct StepProgress {
    // Fixed by the step's first header, sorted by param group.
    std::vector<GroupHyperParams> group_hparams;
    uint64_t chunks_applied = 0;
    bool started = false;
    std::chrono::steady_clock::time_point first_contribution;
  };

  ShardState(uint64_t job_id, JobShape shape, AlignedBuffer state,
             ThreadPool* pool, ServerMetrics* metrics);

  absl::Status CheckNotDeleted() const;
  // OUT_OF_RANGE unless the chunk is in the shard; INVALID_ARGUMENT unless
  // payload_bytes == chunk elements * dtype_size.
  absl::Status CheckChunkPayload(uint64_t chunk_index, size_t payload_bytes,
                                 size_t dtype_size) const;
  ChunkState& chunk_state(uint64_t chunk_index) const;
  // The chunk's arrays. slot(k) for k < shape_.slots().
  float* master(const ChunkRange& chunk) const;
  float* slot(int k, const ChunkRange& chunk) const;
  // The chunk's master weights as `dtype`. REQUIRES: no update runs on it.
  std::string EncodeMaster(uint64_t begin, uint64_t end, DType dtype) const;

  void NoteContributionStart(uint64_t step);
  // Runs on the pool once every worker has contributed `chunk_index` for
  // `step`.
  void RunUpdate(uint64_t chunk_index, uint64_t step);
  std::vector<GroupHyperParams> StepGroupHyperParams(uint64_t step) const;
  void NoteChunkApplied(uint64_t step);

  const uint64_t job_id_;
  const JobShape shape_;
  AlignedBuffer state_;
  size_t slot_stride_;  // floats between the starts of consecutive arrays
  std::unique_ptr<OptimizerKernel> kernel_;
  ThreadPool* const pool_;
  ServerMetrics* const metrics_;
  std::unique_ptr<ChunkState[]> chunks_;
  std::atomic<bool> deleted_{false};

  mutable absl::Mutex steps_mu_;
  // Steps from completed_step_ on that a header has been seen for.
  std::map<uint64_t, StepProgress> steps_ ABSL_GUARDED_BY(steps_mu_);
  uint64_t completed_step_ ABSL_GUARDED_BY(steps_mu_) = 0;
};

}  // namespace depot

#endif  // DEPOT_SERVER_SHARD_STATE_H_
