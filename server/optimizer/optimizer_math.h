// Each optimizer's element math, written once as a template over a vector-ops
// type V (vec_ops_scalar.h, vec_ops_avx2.h, vec_ops_avx512.h) and compiled once
// per instruction set. V::F holds V::kLanes fp32 values; every operation is
// lane-wise and rounds once (V has no fused multiply-add), so each lane
// computes exactly what the scalar instantiation computes.
//
// The expression shapes, operand order included, are the reference
// implementations' (torch.optim 1.13 single-tensor path; Lion: its paper) and
// must not change: the golden tests compare the bits.
//
// Each math type has kSlots (0 to 3) and an operator() that updates the
// param p and the used slots s0, s1, s2 (fp32 values, already widened from
// their storage dtype) in place from the final gradient g. With maximize, g
// arrives negated (the gradient stage, fused_loops.h, negates it), so the math
// is the same for both directions.
//
// The GPU kernels (client/src/gpu/kernels.h) run this same source on the
// device with a one-lane CUDA vector-ops type (client/src/gpu/device_ops.h):
// constructors, operator() and helpers are DEPOT_HOST_DEVICE, which is empty
// outside nvcc. So V's operations must be callable wherever the math runs.
#ifndef DEPOT_SERVER_OPTIMIZER_OPTIMIZER_MATH_H_
#define DEPOT_SERVER_OPTIMIZER_OPTIMIZER_MATH_H_

#include "server/optimizer/fused_update.h"
#include "server/optimizer/host_device.h"

namespace depot::fused {

// Adam / AdamW: mul_(b1).add_(g, alpha=1-b1); mul_(b2).addcmul_(g, g,
// value=1-b2); (sqrt(v) / bc2_sqrt).add_(eps); addcdiv_(m, denom,
// value=-step_size). With amsgrad, torch.maximum(max_exp_avg_sq, v) replaces v
// in the denominator and is kept (V::Max: a NaN in either gives a NaN). s0 =
// exp_avg, s1 = exp_avg_sq, s2 = max_exp_avg_sq. Like the moments, the kept
// maximum is rounded to its slot's dtype only when stored: the denominator
// uses the fp32 value, which is the maximum of the stored (widened) one and
// the unrounded v.
template <class V, bool kDecoupled, bool kHasWeightDecay, bool kAmsgrad>
class AdamMath {
 public:
  using F = typename V::F;
  static constexpr int kSlots = kAmsgrad ? 3 : 2;

  DEPOT_HOST_DEVICE explicit AdamMath(const AdamScalars& s)
      : beta1_(V::Set(s.beta1)),
        one_minus_beta1_(V::Set(s.one_minus_beta1)),
        beta2_(V::Set(s.beta2)),
        one_minus_beta2_(V::Set(s.one_minus_beta2)),
        weight_decay_(V::Set(s.weight_decay)),
        decay_factor_(V::Set(s.decay_factor)),
        step_size_(V::Set(s.step_size)),
        bias_correction2_sqrt_(V::Set(s.bias_correction2_sqrt)),
        eps_(V::Set(s.eps)) {}

  DEPOT_HOST_DEVICE void operator()(F g, F& p, F& exp_avg, F& exp_avg_sq,
                                    F& max_exp_avg_sq) const {
    if constexpr (kHasWeightDecay) {
      if constexpr (kDecoupled) {
        p = V::Mul(p, decay_factor_);
      } else {
        g = V::Add(g, V::Mul(weight_decay_, p));
      }
    }
    const F m = V::Add(V::Mul(exp_avg, beta1_), V::Mul(one_minus_beta1_, g));
    const F v = V::Add(V::Mul(exp_avg_sq, beta2_),
                       V::Mul(V::Mul(one_minus_beta2_, g), g));
    F second_moment = v;
    if constexpr (kAmsgrad) {
      second_moment = V::Max(max_exp_avg_sq, v);
      max_exp_avg_sq = second_moment;
    }
    const F denom =
        V::Add(V::Div(V::Sqrt(second_moment), bias_correction2_sqrt_), eps_);
    exp_avg = m;
    exp_avg_sq = v;
    p = V::Sub(p, V::Div(V::Mul(step_size_, m), denom));
  }

 private:
  F beta1_, one_minus_beta1_, beta2_, one_minus_beta2_, weight_decay_,
      decay_factor_, step_size_, bias_correction2_sqrt_, eps_;
};

// SGD: g.add(p, alpha=wd); buf.mul_(mu).add_(g, alpha=1-dampening) (on the
// first step the buffer is a copy of g); g.add(buf, alpha=mu) with Nesterov,
// else g = buf; p.add_(g, alpha=-lr). s0 = momentum_buffer.
template <class V, bool kHasWeightDecay, bool kMomentum, bool kFirstStep,
          bool kNesterov>
class SgdMath {
 public:
  using F = typename V::F;
  static constexpr int kSlots = kMomentum ? 1 : 0;

  DEPOT_HOST_DEVICE explicit SgdMath(const SgdScalars& s)
      : weight_decay_(V::Set(s.weight_decay)),
        momentum_(V::Set(s.momentum)),
        one_minus_dampening_(V::Set(s.one_minus_dampening)),
        neg_lr_(V::Set(s.neg_lr)) {}

  DEPOT_HOST_DEVICE void operator()(F g, F& p, F& momentum_buffer,
                                    F& /*unused*/, F& /*unused*/) const {
    if constexpr (kHasWeightDecay) g = V::Add(g, V::Mul(weight_decay_, p));
    if constexpr (kMomentum) {
      F buf;
      if constexpr (kFirstStep) {
        buf = g;
      } else {
        buf = V::Add(V::Mul(momentum_buffer, momentum_),
                     V::Mul(one_minus_dampening_, g));
      }
      momentum_buffer = buf;
      if constexpr (kNesterov) {
        g = V::Add(g, V::Mul(momentum_, buf));
      } else {
        g = buf;
      }
    }
    p = V::Add(p, V::Mul(neg_lr_, g));
  }

 private:
  F weight_decay_, momentum_, one_minus_dampening_, neg_lr_;
};

// Adagrad: g.add(p, alpha=wd); state_sum.addcmul_(g, g, value=1);
// std = state_sum.sqrt().add_(eps); p.addcdiv_(g, std, value=-clr), which
// computes p + (-clr * g) / std: the same bits as p - clr * g / std, since
// negation is exact. s0 = state_sum.
template <class V, bool kHasWeightDecay>
class AdagradMath {
 public:
  using F = typename V::F;
  static constexpr int kSlots = 1;

  DEPOT_HOST_DEVICE explicit AdagradMath(const AdagradScalars& s)
      : weight_decay_(V::Set(s.weight_decay)),
        clr_(V::Set(s.clr)),
        eps_(V::Set(s.eps)) {}

  DEPOT_HOST_DEVICE void operator()(F g, F& p, F& state_sum, F& /*unused*/,
                                    F& /*unused*/) const {
    if constexpr (kHasWeightDecay) g = V::Add(g, V::Mul(weight_decay_, p));
    const F sum = V::Add(state_sum, V::Mul(g, g));
    const F std_dev = V::Add(V::Sqrt(sum), eps_);
    state_sum = sum;
    p = V::Sub(p, V::Div(V::Mul(clr_, g), std_dev));
  }

 private:
  F weight_decay_, clr_, eps_;
};

// Lion: c = m * b1 + (1 - b1) * g; p = p * (1 - lr * wd);
// p = p - lr * sign(c); m = m * b2 + (1 - b2) * g. sign is -1, 0 or +1, and 0
// for zero of either sign and for NaN (torch.sign's values), so lr * sign(c)
// is exact and the weight sees two roundings: the decay and the subtraction.
// s0 = exp_avg.
template <class V, bool kHasWeightDecay>
class LionMath {
 public:
  using F = typename V::F;
  static constexpr int kSlots = 1;

  DEPOT_HOST_DEVICE explicit LionMath(const LionScalars& s)
      : beta1_(V::Set(s.beta1)),
        one_minus_beta1_(V::Set(s.one_minus_beta1)),
        beta2_(V::Set(s.beta2)),
        one_minus_beta2_(V::Set(s.one_minus_beta2)),
        decay_factor_(V::Set(s.decay_factor)),
        lr_(V::Set(s.lr)),
        zero_(V::Set(0.0f)),
        one_(V::Set(1.0f)),
        minus_one_(V::Set(-1.0f)) {}

  DEPOT_HOST_DEVICE void operator()(F g, F& p, F& exp_avg, F& /*unused*/,
                                    F& /*unused*/) const {
    const F m = exp_avg;
    const F c = V::Add(V::Mul(m, beta1_), V::Mul(one_minus_beta1_, g));
    if constexpr (kHasWeightDecay) p = V::Mul(p, decay_factor_);
    p = V::Sub(p, V::Mul(lr_, Sign(c)));
    exp_avg = V::Add(V::Mul(m, beta2_), V::Mul(one_minus_beta2_, g));
  }

 private:
  // Both compares are false for zero and for NaN.
  DEPOT_HOST_DEVICE F Sign(F x) const {
    return V::Select(V::Greater(x, zero_), one_,
                     V::Select(V::Less(x, zero_), minus_one_, zero_));
  }

  F beta1_, one_minus_beta1_, beta2_, one_minus_beta2_, decay_factor_, lr_,
      zero_, one_, minus_one_;
};

}  // namespace depot::fused

#endif  // DEPOT_SERVER_OPTIMIZER_OPTIMIZER_MATH_H_
