// ShardState's per-chunk bookkeeping, shared by the files that implement
// ShardState (shard_state.cc: contributions, reads; shard_update.cc: the sum
// and update tasks). Not for use outside ShardState.
#ifndef DEPOT_SERVER_CHUNK_STATE_H_
#define DEPOT_SERVER_CHUNK_STATE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/shard_state.h"
#include "server/step_reply_sink.h"

namespace depot {

// Writes zeros to the elements of [range.begin, range.end) that belong to no
// tensor. `data` holds the range's elements.
void ZeroPadding(const Layout& layout, const ChunkRange& range, float* data);

// The contributions to a chunk's next step (applied step + 1), one slot per
// worker.
struct ShardState::PendingStep {
  explicit PendingStep(uint32_t workers)
      : payloads(workers),
        sinks(workers),
        present(workers, false),
        overrides(workers) {}

  std::vector<std::string> payloads;  // moved out by the sum
  std::vector<std::weak_ptr<StepReplySink>> sinks;
  std::vector<bool> present;
  // New master weights some workers sent for this step (WeightsOverride),
  // by worker rank; applied by the update before anything else.
  std::vector<std::vector<WeightsPiece>> overrides;
  uint32_t count = 0;
  // Every worker has contributed: the sum (or update) task owns the payloads.
  bool complete = false;
  // Two-phase steps: the summed, unscaled gradient of the chunk (fp32, in a
  // PayloadPool buffer), kept from the sum until the update (summed_ready
  // says it is there).
  std::string summed;
  bool summed_ready = false;
};

// One update's outgoing weights of a chunk and the step they belong to.
struct ShardState::KeptWeights {
  uint64_t step = 0;
  std::shared_ptr<const std::string> weights;  // null: none kept
};

struct ShardState::ChunkState {
  // True while no update task owns the chunk's arrays.
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !updating; }

  mutable absl::Mutex mu;
  // The last training step applied (skipped steps included).
  uint64_t applied_step ABSL_GUARDED_BY(mu) = 0;
  // The optimizer's step count of each tensor segment of the chunk
  // (Layout::SegmentsIn order): the steps that updated that tensor, i.e. were
  // not skipped and had a gradient for it, as torch's per-parameter
  // state["step"]. Bias correction and SGD's first momentum step use it.
  std::vector<uint64_t> tensor_steps ABSL_GUARDED_BY(mu);
  // Set once the update is scheduled, until it is done. While set, only the
  // update task touches the chunk's master weights and slots.
  bool updating ABSL_GUARDED_BY(mu) = false;
  std::unique_ptr<PendingStep> pending ABSL_GUARDED_BY(mu);
  // The weights (weight dtype) the chunk's last update produced, at
  // applied_step, and those of the update before, at applied_step - 1: the
  // buffers its answers were sent from, shared, not copied. A pull at a step
  // serves a chunk one step ahead of it from `before` (server/
  // shard_pull.cc). Empty until the chunk's first update (after an import:
  // the history it replaced is dropped); none kept with noop_update.
  KeptWeights last ABSL_GUARDED_BY(mu);
  KeptWeights before ABSL_GUARDED_BY(mu);
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
