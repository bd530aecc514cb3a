#include "step_commit.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace depot::client_internal {
namespace {

// Megatron's epsilon in clip_grad / (total_norm + 1e-6).
constexpr double kClipEpsilon = 1.0e-6;

}  // namespace

GradDecision DecideStep(const OptimizerConfig& config,
                        const std::vector<v1::GradStats>& shards) {
  double sum_squares = 0.0;
  double max_abs = 0.0;
  bool nan = false;
  GradDecision decision;
  for (const v1::GradStats& shard : shards) {
    sum_squares += shard.sum_squares();
    nan = nan || std::isnan(shard.max_abs());
    max_abs = std::max(max_abs, shard.max_abs());
    decision.zero_count += shard.zero_count();
    decision.found_inf = decision.found_inf || shard.non_finite();
  }
  if (config.clip_grad_norm_type == GradNormType::kInf) {
    decision.grad_norm = nan ? std::nan("") : max_abs;
  } else {
    decision.grad_norm = std::sqrt(sum_squares);
  }
  const double threshold = config.grad_norm_skip_threshold;
  // Written so that a NaN norm skips too.
  const bool norm_too_large =
      threshold > 0.0 && !(decision.grad_norm <= threshold);
  if (decision.found_inf || norm_too_large) {
    decision.commit.skip = true;
    return decision;
  }
  if (config.clip_grad > 0.0) {
    const double coef = config.clip_grad / (decision.grad_norm + kClipEpsilon);
    if (coef < 1.0) decision.commit.clip_coef = coef;
  }
  return decision;
}

CommitBarrier::CommitBarrier(const OptimizerConfig& config,
                             std::vector<uint32_t> servers)
    : config_(config), servers_(std::move(servers)), stats_(servers_.size()) {}

absl::StatusOr<StepCommit> CommitBarrier::Report(uint32_t server,
                                                 const v1::GradStats& stats,
                                                 absl::Time deadline) {
  const auto it = std::find(servers_.begin(), servers_.end(), server);
  absl::MutexLock lock(&mu_);
  if (it == servers_.end() || stats_[it - servers_.begin()].has_value()) {
    return absl::InternalError(absl::StrCat(
        "server ", server, " reported GradStats it was not asked for"));
  }
  stats_[it - servers_.begin()] = stats;
  if (++reported_ == servers_.size()) {
    std::vector<v1::GradStats> in_order;
    for (const std::optional<v1::GradStats>& s : stats_) in_order.push_back(*s);
    decision_ = DecideStep(config_, in_order);
  }
  if (!mu_.AwaitWithDeadline(
          absl::Condition(this, &CommitBarrier::DoneOrAborted), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "step timed out waiting for the GradStats of every server (", reported_,
        " of ", servers_.size(), " arrived)"));
  }
  if (!aborted_.ok()) return aborted_;
  return decision_->commit;
}

void CommitBarrier::Abort(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (aborted_.ok()) aborted_ = std::move(status);
}

std::optional<GradDecision> CommitBarrier::decision() const {
  absl::MutexLock lock(&mu_);
  return decision_;
}

bool CommitBarrier::DoneOrAborted() const {
  return decision_.has_value() || !aborted_.ok();
}

}  // namespace depot::client_internal
