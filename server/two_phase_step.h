// TwoPhaseStep: what a server's shard shares across its chunks during a
// two-phase step (docs/protocol.md, "Two phases"). Each chunk reports its
// gradient statistics once summed; when the last one has, the shard's totals
// (combined in chunk-index order, so they do not depend on which chunk was
// summed first) go to every Step stream of the step. Then the workers' commits
// arrive: the first decides, the others must repeat it.
//
// Thread safety: all methods may be called concurrently.
#ifndef DEPOT_SERVER_TWO_PHASE_STEP_H_
#define DEPOT_SERVER_TWO_PHASE_STEP_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/grad_stats.h"
#include "server/step_numerics.h"
#include "server/step_reply_sink.h"

namespace depot {

class TwoPhaseStep {
 public:
  // The step `step` of a shard of `num_chunks` chunks.
  TwoPhaseStep(uint64_t step, uint64_t num_chunks);

  TwoPhaseStep(const TwoPhaseStep&) = delete;
  TwoPhaseStep& operator=(const TwoPhaseStep&) = delete;

  // Sends the shard's statistics to `sink` once every chunk is summed: at once
  // (from this call) if they already are. Subscribers are held weakly.
  void Subscribe(const std::shared_ptr<StepReplySink>& sink);

  // Records the statistics of chunk `chunk_offset` (its index minus the
  // shard's first chunk). The call that completes the shard delivers the
  // totals to the subscribers. REQUIRES: each offset < num_chunks is recorded
  // once.
  void AddChunk(uint64_t chunk_offset, const GradStats& stats);

  // A worker's commit. Returns true when it is the step's first (the caller
  // then starts the updates), false when it repeats the first.
  // INVALID_ARGUMENT: clip_coef outside (0, 1] without skip.
  // FAILED_PRECONDITION: not every chunk of the shard is summed yet; it differs
  // from the first commit; it does not skip although the shard's gradients are
  // not finite. A rejected commit changes nothing.
  absl::StatusOr<bool> Commit(const CommitDecision& commit);

  // The first commit. REQUIRES: Commit returned true once.
  CommitDecision commit() const;

 private:
  const uint64_t step_;
  mutable absl::Mutex mu_;
  std::vector<std::optional<GradStats>> chunks_ ABSL_GUARDED_BY(mu_);
  uint64_t summed_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<GradStats> totals_ ABSL_GUARDED_BY(mu_);
  std::vector<std::weak_ptr<StepReplySink>> subscribers_ ABSL_GUARDED_BY(mu_);
  std::optional<CommitDecision> commit_ ABSL_GUARDED_BY(mu_);
};

}  // namespace depot

#endif  // DEPOT_SERVER_TWO_PHASE_STEP_H_
