// StepNumerics: how a step treats its summed gradient before the optimizer
// runs, as its Step headers state it (docs/protocol.md, "Numerics of a step"):
// the loss scale to divide out, whether the step runs in two phases, and, in a
// one-phase step, the clip coefficient and skip flag the worker already knows.
// The order of operations is Megatron's: sum in rank order (fp32), multiply by
// float(1 / loss_scale), check for non-finite values and take the norm, then
// multiply by float(clip_coef) when it is < 1. The fused update kernel
// (OptimizerKernel::FusedUpdate's GradientInput) applies them.
#ifndef DEPOT_SERVER_STEP_NUMERICS_H_
#define DEPOT_SERVER_STEP_NUMERICS_H_

#include "absl/status/status.h"

namespace depot {

// The global decision on a step's gradients: skip the step, or multiply the
// unscaled gradients by clip_coef (in (0, 1]) and update.
struct CommitDecision {
  double clip_coef = 1.0;
  bool skip = false;
};

struct StepNumerics {
  // The gradients arrive multiplied by this; 1 means none.
  double loss_scale = 1.0;
  // The server reports the shard's gradient statistics and waits for a
  // StepCommit message before updating.
  bool two_phase = false;
  // One phase: the decision every chunk applies (the default: no clipping, no
  // skip). Unused in two phases.
  CommitDecision commit;
};

// INVALID_ARGUMENT unless clip_coef is in (0, 1] (it may be anything when skip
// is set).
absl::Status ValidateCommitDecision(const CommitDecision& commit);

// INVALID_ARGUMENT unless loss_scale is finite and > 0 and the one-phase commit
// is valid.
absl::Status ValidateStepNumerics(const StepNumerics& numerics);

// Exact equality (a skipped commit's clip_coef is ignored): every worker of a
// step must send the same values.
bool SameCommitDecision(const CommitDecision& a, const CommitDecision& b);
bool SameStepNumerics(const StepNumerics& a, const StepNumerics& b);

// The fp32 factor that undoes `loss_scale`: float(1 / loss_scale), the
// reciprocal taken in double and rounded once, as Megatron's grad scaler's
// inv_scale.
float UnscaleFactor(double loss_scale);

}  // namespace depot

#endif  // DEPOT_SERVER_STEP_NUMERICS_H_
