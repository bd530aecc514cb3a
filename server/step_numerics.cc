#include "server/step_numerics.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace depot {

absl::Status ValidateCommitDecision(const CommitDecision& commit) {
  if (commit.skip) return absl::OkStatus();
  // Written so that NaN fails too.
  if (!(commit.clip_coef > 0.0 && commit.clip_coef <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "clip_coef must be in (0, 1] (1 = no clipping) unless the step is "
        "skipped, got ",
        commit.clip_coef));
  }
  return absl::OkStatus();
}

absl::Status ValidateStepNumerics(const StepNumerics& numerics) {
  if (!std::isfinite(numerics.loss_scale) || numerics.loss_scale <= 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss_scale must be finite and > 0 (1 = no scaling), got ",
                     numerics.loss_scale));
  }
  if (numerics.two_phase) return absl::OkStatus();
  return ValidateCommitDecision(numerics.commit);
}

bool SameCommitDecision(const CommitDecision& a, const CommitDecision& b) {
  return a.skip == b.skip && (a.skip || a.clip_coef == b.clip_coef);
}

bool SameStepNumerics(const StepNumerics& a, const StepNumerics& b) {
  return a.loss_scale == b.loss_scale && a.two_phase == b.two_phase &&
         (a.two_phase || SameCommitDecision(a.commit, b.commit));
}

float UnscaleFactor(double loss_scale) {
  return static_cast<float>(1.0 / loss_scale);
}

}  // namespace depot
