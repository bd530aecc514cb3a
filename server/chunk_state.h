// ShardState's per-chunk bookkeeping, shared by the files that implement
// ShardState (shard_contribute.cc: contributions; shard_update.cc: the sum
// and update tasks; the readers and the rest). Not for use outside
// ShardState.
#ifndef DEPOT_SERVER_CHUNK_STATE_H_
#define DEPOT_SERVER_CHUNK_STATE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/chunk_phase.h"
#include "server/shard_state.h"
#include "server/step_reply_sink.h"

namespace depot {

// Writes zeros to the elements of [range.begin, range.end) that belong to no
// tensor. `data` holds the range's elements.
void ZeroPadding(const Layout& layout, const ChunkRange& range, float* data);

// The contributions to a chunk's next step (applied step + 1), one slot per
// worker. It exists in every phase but kIdle (server/chunk_phase.h).
struct ShardState::PendingStep {
  explicit PendingStep(uint32_t workers)
      : payloads(workers),
        sinks(workers),
        present(workers, false),
        overrides(workers) {}

  std::vector<std::string> payloads;  // moved out by the sum or the update
  std::vector<std::weak_ptr<StepReplySink>> sinks;
  std::vector<bool> present;
  // New master weights some workers sent for this step (WeightsOverride),
  // by worker rank; applied by the update before anything else.
  std::vector<std::vector<WeightsPiece>> overrides;
  uint32_t count = 0;
  // Two-phase steps: the summed, unscaled gradient of the chunk (fp32, in a
  // PayloadPool buffer), kept from kSummed until the update takes it.
  std::string summed;
};

// One update's outgoing weights of a chunk and the step they belong to.
struct ShardState::KeptWeights {
  uint64_t step = 0;
  std::shared_ptr<const std::string> weights;  // null: none kept
};

struct ShardState::ChunkState {
  ChunkPhase phase() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return phase_; }
  // The next step's contributions; null in kIdle.
  PendingStep* pending() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return pending_.get();
  }
  // No update task owns the chunk's master weights and slots (not
  // kUpdating): readers of the arrays wait for this.
  bool ArraysFree() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return phase_ != ChunkPhase::kUpdating;
  }
  // No task owns any of the chunk's bookkeeping (kIdle, kCollecting or
  // kSummed): what a rollback waits for before it drops the step.
  bool NoTaskOwnsIt() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return phase_ != ChunkPhase::kUpdating && phase_ != ChunkPhase::kSumming;
  }

  // The transitions of server/chunk_phase.h; each aborts on a move its
  // diagram does not have.
  //
  // The next step's PendingStep, made (kIdle -> kCollecting) if there is
  // none yet. `*created` says whether it was.
  PendingStep& Collect(uint32_t workers, bool* created)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    *created = pending_ == nullptr;
    if (*created) {
      MoveChunkPhase(phase_, ChunkPhase::kCollecting);
      pending_ = std::make_unique<PendingStep>(workers);
    }
    return *pending_;
  }
  // Forgets the PendingStep Collect just made for a piece that was then
  // refused (kCollecting -> kIdle): it must hold nothing.
  void ForgetNew() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    MoveChunkPhase(phase_, ChunkPhase::kIdle);
    pending_.reset();
  }
  // Every worker has contributed: the update (one phase) or the sum (two
  // phases) now owns the contributions, and the caller schedules it.
  void Complete(bool two_phase) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    MoveChunkPhase(phase_,
                   two_phase ? ChunkPhase::kSumming : ChunkPhase::kUpdating);
  }
  // The sum task keeps the chunk's sum until the commit (kSumming ->
  // kSummed).
  void KeepSum(std::string sum) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    MoveChunkPhase(phase_, ChunkPhase::kSummed);
    pending_->summed = std::move(sum);
  }
  // The commit hands the kept sum to the update (kSummed -> kUpdating).
  void StartUpdate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    MoveChunkPhase(phase_, ChunkPhase::kUpdating);
  }
  // The update task is done with the chunk, which has applied `step`
  // (kUpdating -> kIdle). Returns the step's contributions.
  std::unique_ptr<PendingStep> FinishUpdate(uint64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    MoveChunkPhase(phase_, ChunkPhase::kIdle);
    applied_step = step;
    return std::move(pending_);
  }
  // A rollback drops the step in flight (kCollecting or kSummed -> kIdle;
  // nothing to drop in kIdle). Returns what it held, null if nothing.
  // REQUIRES: NoTaskOwnsIt().
  std::unique_ptr<PendingStep> Drop() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (phase_ != ChunkPhase::kIdle) MoveChunkPhase(phase_, ChunkPhase::kIdle);
    return std::move(pending_);
  }

  mutable absl::Mutex mu;
  // The last training step applied (skipped steps included).
  uint64_t applied_step ABSL_GUARDED_BY(mu) = 0;
  // The optimizer's step count of each tensor segment of the chunk
  // (Layout::SegmentsIn order): the steps that updated that tensor, i.e. were
  // not skipped and had a gradient for it, as torch's per-parameter
  // state["step"]. Bias correction and SGD's first momentum step use it.
  std::vector<uint64_t> tensor_steps ABSL_GUARDED_BY(mu);
  // The weights (weight dtype) the chunk's last update produced, at
  // applied_step, and those of the update before, at applied_step - 1: the
  // buffers its answers were sent from, shared, not copied. A pull at a step
  // serves a chunk one step ahead of it from `before` (server/
  // shard_pull.cc). Empty until the chunk's first update (after an import:
  // the history it replaced is dropped); none kept with noop_update.
  KeptWeights last ABSL_GUARDED_BY(mu);
  KeptWeights before ABSL_GUARDED_BY(mu);
  // ChunkSnapshot::lacks_worker_state: set by an update of a step with
  // sum-only tensors in the chunk, cleared by a patch, taken from what an
  // import or a restore brings.
  bool lacks_worker_state ABSL_GUARDED_BY(mu) = false;

 private:
  ChunkPhase phase_ ABSL_GUARDED_BY(mu) = ChunkPhase::kIdle;
  std::unique_ptr<PendingStep> pending_ ABSL_GUARDED_BY(mu);
};

// BeginStep, OverrideWeights, Contribute and Commit hold one for their length:
// a rollback (BeginRollBack) waits for them, and they fail at once while it
// runs.
class ShardState::Accepting {
 public:
  explicit Accepting(ShardState& shard)
      : shard_(shard), held_(shard.rollback_mu_.ReaderTryLock()) {}
  ~Accepting() {
    if (held_) shard_.rollback_mu_.ReaderUnlock();
  }
  Accepting(const Accepting&) = delete;
  Accepting& operator=(const Accepting&) = delete;

  absl::Status status() const {
    if (held_) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat(
        "job ", shard_.job_id_,
        " is being rolled back on this server: retry once it is done"));
  }

 private:
  ShardState& shard_;
  const bool held_;
};

}  // namespace depot

#endif  // DEPOT_SERVER_CHUNK_STATE_H_
