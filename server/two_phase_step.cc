#include "server/two_phase_step.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace depot {

TwoPhaseStep::TwoPhaseStep(uint64_t step, uint64_t num_chunks)
    : step_(step), chunks_(num_chunks) {
  // An empty shard has nothing to sum: its statistics are ready at once.
  if (num_chunks == 0) totals_ = GradStats();
}

void TwoPhaseStep::Subscribe(const std::shared_ptr<StepReplySink>& sink) {
  GradStats totals;
  {
    absl::MutexLock lock(&mu_);
    if (!totals_.has_value()) {
      subscribers_.push_back(sink);
      return;
    }
    totals = *totals_;
  }
  sink->DeliverGradStats(totals);
}

void TwoPhaseStep::AddChunk(uint64_t chunk_offset, const GradStats& stats) {
  GradStats totals;
  std::vector<std::weak_ptr<StepReplySink>> subscribers;
  {
    absl::MutexLock lock(&mu_);
    chunks_[chunk_offset] = stats;
    if (++summed_ < chunks_.size()) return;
    totals = GradStats();
    for (const std::optional<GradStats>& chunk : chunks_) {
      AccumulateGradStats(*chunk, totals);
    }
    totals_ = totals;
    subscribers = std::move(subscribers_);
    subscribers_.clear();
  }
  for (const std::weak_ptr<StepReplySink>& weak : subscribers) {
    if (std::shared_ptr<StepReplySink> sink = weak.lock()) {
      sink->DeliverGradStats(totals);
    }
  }
}

absl::StatusOr<bool> TwoPhaseStep::Commit(const CommitDecision& commit) {
  if (absl::Status s = ValidateCommitDecision(commit); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (!totals_.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "commit of step ", step_,
        " before every chunk of the shard was "
        "summed (",
        summed_, " of ", chunks_.size(),
        "): a worker commits only after every server has sent its GradStats"));
  }
  if (commit_.has_value()) {
    if (!SameCommitDecision(*commit_, commit)) {
      return absl::FailedPreconditionError(
          absl::StrCat("commit of step ", step_, " {clip_coef ",
                       commit.clip_coef, ", skip ", commit.skip,
                       "} differs from the step's first commit "
                       "{clip_coef ",
                       commit_->clip_coef, ", skip ", commit_->skip,
                       "}: every worker must commit the same decision"));
    }
    return false;
  }
  if (!commit.skip && totals_->non_finite) {
    return absl::FailedPreconditionError(
        absl::StrCat("commit of step ", step_,
                     " does not skip it, but this shard's "
                     "gradients are not finite (GradStats.non_finite)"));
  }
  commit_ = commit;
  return true;
}

CommitDecision TwoPhaseStep::commit() const {
  absl::MutexLock lock(&mu_);
  return *commit_;
}

}  // namespace depot
