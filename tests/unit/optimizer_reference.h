// A double-precision reference for the optimizer kernels, written from the
// torch.optim formulas (docs/optimizers.md), and the tolerance they are held
// to.
//
// The tolerance. Every fp32 operation rounds its result with relative error at
// most u = 2^-24, and so does every scalar the kernel rounds to float. A value
// computed from terms t_1..t_k therefore carries an error of a few u times
// sum |t_i|, not times |value|: where terms cancel (a momentum of gradients of
// alternating sign, a weight crossing zero) the value's own relative error is
// unbounded. So the reference tracks that sum, the value's *magnitude*, next to
// each value. Errors from earlier steps are carried forward by the same
// coefficients as the magnitudes, so the bound grows linearly with the step
// count: after k steps a kernel value must lie within kUlpsPerStep * k * u *
// magnitude of the reference. A first-order count of the roundings along the
// longest path of one step gives at most 18.5 u: Adam with L2 decay into the
// weight (decayed gradient 3, squared 6, moment second term 3 more, sum 1,
// sqrt halves then adds 1, bias correction 2, eps 1, quotient with the first
// moment's 6 plus 1, step size 2, subtraction 1). We allow 20. The worst seen
// in these tests is about 5.5 u per step. A wrong formula, operand order of
// decay, or bias correction computed in fp32 moves values by 100 u and more.
// Adagrad's longest path is shorter than Adam's (no bias corrections, one
// moment). Lion's weight takes lr * sign(c): where c lies within its tolerance
// of zero the kernel may rightly take either sign, and the reference widens
// that weight's tolerance to cover both (SignWithinTolerance in the .cc).
#ifndef DEPOT_TESTS_UNIT_OPTIMIZER_REFERENCE_H_
#define DEPOT_TESTS_UNIT_OPTIMIZER_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "depot/job_config.h"
#include "server/optimizer/optimizer_kernel.h"

namespace depot::testing {

// A double value and the sum of the magnitudes of the terms it was made from.
struct Tracked {
  double value = 0;
  double magnitude = 0;
};

inline Tracked Exact(double x) { return {x, std::fabs(x)}; }
inline Tracked operator+(Tracked a, Tracked b) {
  return {a.value + b.value, a.magnitude + b.magnitude};
}
inline Tracked operator-(Tracked a, Tracked b) {
  return {a.value - b.value, a.magnitude + b.magnitude};
}
inline Tracked operator*(double c, Tracked a) {
  return {c * a.value, std::fabs(c) * a.magnitude};
}
inline Tracked operator*(Tracked a, Tracked b) {
  return {a.value * b.value, a.magnitude * b.magnitude};
}
// REQUIRES: the divisor is made of terms of one sign (no cancellation), as the
// Adam denominator is; its relative error is then a few u and the quotient's
// magnitude is the dividend's scaled by it.
inline Tracked operator/(Tracked a, Tracked b) {
  return {a.value / b.value, a.magnitude / std::fabs(b.value)};
}
// REQUIRES: a.value >= 0 made of non-negative terms.
inline Tracked Sqrt(Tracked a) {
  return {std::sqrt(a.value), std::sqrt(a.magnitude)};
}
// The larger value. A kernel's operands are within their tolerances of a and
// b, so its maximum is within the larger of the two tolerances of this one,
// whichever operand it picks.
inline Tracked Max(Tracked a, Tracked b) {
  return {std::max(a.value, b.value), std::max(a.magnitude, b.magnitude)};
}

inline constexpr double kUlpsPerStep = 20;

// True when `actual` is within the accumulated tolerance of `expected` after
// `steps` steps.
inline bool WithinTolerance(float actual, const Tracked& expected, int steps) {
  const double unit_roundoff = std::ldexp(1.0, -24);
  return std::fabs(static_cast<double>(actual) - expected.value) <=
         kUlpsPerStep * steps * unit_roundoff * expected.magnitude;
}

// The state of a run of parameters in the reference: master and up to
// kMaxStateSlots slots.
struct ReferenceState {
  std::vector<Tracked> master;
  std::vector<Tracked> slots[kMaxStateSlots];
};

// One torch.optim step of `config.kind` on every element of `state`, with its
// amsgrad and maximize flags.
void ReferenceStep(const OptimizerConfig& config,
                   const UpdateHyperParams& hparams,
                   const std::vector<float>& grad, ReferenceState& state);

// Runs MakeOptimizerKernel(config) and the reference side by side over `steps`
// (hparams.step must count 1, 2, ...), from the same random weights and
// gradients and the slots' initial values (InitOptimizerSlots), and adds a
// test failure for every value outside the tolerance after any step.
// REQUIRES: every slot of `config` is fp32 (bf16 slots are tested against the
// fp32 kernel with rounded moments, in bf16_moments_test.cc).
void ExpectKernelTracksReference(const OptimizerConfig& config,
                                 const std::vector<UpdateHyperParams>& steps);

// `count` steps numbered from 1 with lr varying around `base_lr` (as a schedule
// would) and a fixed weight decay.
std::vector<UpdateHyperParams> VaryingLrSteps(int count, double base_lr,
                                              double weight_decay);

}  // namespace depot::testing

#endif  // DEPOT_TESTS_UNIT_OPTIMIZER_REFERENCE_H_
