// The GPU kernels' work on one element (kernels.h), written once as templates
// over a one-lane vector-ops type V and DEPOT_HOST_DEVICE: the kernels
// (kernels_*.cu) run them with CudaOps (device_ops.h); the host test
// (tests/unit/gpu_element_update_test.cc) runs the same source with a host
// type of the same IEEE operations and compares it bit for bit with the
// server's OptimizerKernel.
//
// The order of the operations is the server's fused update's
// (server/optimizer/fused_update.h, fused_loops.h), element by element:
//   g = part_0[i] + part_1[i] + ...        (each widened to fp32, rank order)
//   if unscale: g = g * unscale_factor;  if clip: g = g * clip_coef
//   if maximize: g = -g                    (V::Neg, the sign bit)
//   the optimizer's math (server/optimizer/optimizer_math.h, the same template)
//   master[i], the slots (rounded to their dtype) and weights[i] stored.
// V provides what server/optimizer/vec_ops_scalar.h does: Set, Add, Mul, Sub,
// Div, Sqrt, Neg, Max, Greater, Less, Select, and loads and stores of fp32,
// bf16 and fp16.
#ifndef DEPOT_CLIENT_SRC_GPU_ELEMENT_UPDATE_H_
#define DEPOT_CLIENT_SRC_GPU_ELEMENT_UPDATE_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "depot/dtype.h"
#include "depot/job_config.h"
#include "server/optimizer/fused_update.h"
#include "server/optimizer/host_device.h"
#include "server/optimizer/optimizer_math.h"

namespace depot::gpu {

// The most gradient parts a fused update sums (the workers' or ranks'
// contributions; one after a reduce-scatter).
inline constexpr int kMaxGradientParts = 8;

// A gradient as the fused update reads it: plain data, passed to a kernel by
// value. parts[w] points at element 0 of the range (the offset applied).
struct GradientArgs {
  DType dtype = DType::kFloat32;
  const void* parts[kMaxGradientParts] = {};
  int num_parts = 0;
  bool unscale = false;
  float unscale_factor = 1.0f;
  bool clip = false;
  float clip_coef = 1.0f;
  bool negate = false;  // maximize
};

// Everything one fused update reads and writes, as device (or, in the host
// test, host) pointers. slots[k] holds elements of slot_dtypes[k] (fp32 or
// bf16); weights, when not null, elements of weight_dtype.
struct UpdateArgs {
  GradientArgs grad;
  float* master = nullptr;
  void* slots[3] = {nullptr, nullptr, nullptr};
  DType slot_dtypes[3] = {DType::kFloat32, DType::kFloat32, DType::kFloat32};
  void* weights = nullptr;
  DType weight_dtype = DType::kFloat32;
};

template <class V>
struct ElementFunctions {
  using F = typename V::F;

  // Element i of `data`, n elements of `dtype`, widened to fp32 (exact).
  DEPOT_HOST_DEVICE static F Load(DType dtype, const void* data, size_t i) {
    switch (dtype) {
      case DType::kBFloat16:
        return V::LoadBF16(static_cast<const uint16_t*>(data) + i);
      case DType::kFloat16:
        return V::LoadF16(static_cast<const uint16_t*>(data) + i);
      case DType::kFloat32:
        break;
    }
    return V::LoadF32(static_cast<const float*>(data) + i);
  }

  // Stores x as element i of `data`, rounded to `dtype` (to nearest, ties to
  // even, as depot/dtype.h's ConvertFromFloat).
  DEPOT_HOST_DEVICE static void Store(DType dtype, void* data, size_t i, F x) {
    switch (dtype) {
      case DType::kBFloat16:
        V::StoreBF16(static_cast<uint16_t*>(data) + i, x);
        return;
      case DType::kFloat16:
        V::StoreF16(static_cast<uint16_t*>(data) + i, x);
        return;
      case DType::kFloat32:
        break;
    }
    V::StoreF32(static_cast<float*>(data) + i, x);
  }

  // The final gradient of element i: fused_loops.h's Gradient, one lane.
  DEPOT_HOST_DEVICE static F Gradient(const GradientArgs& grad, size_t i) {
    F g = Load(grad.dtype, grad.parts[0], i);
    for (int w = 1; w < grad.num_parts; ++w) {
      g = V::Add(g, Load(grad.dtype, grad.parts[w], i));
    }
    if (grad.unscale) g = V::Mul(g, V::Set(grad.unscale_factor));
    if (grad.clip) g = V::Mul(g, V::Set(grad.clip_coef));
    if (grad.negate) g = V::Neg(g);
    return g;
  }

  // The fused update of element i with `math` (an optimizer_math.h type over
  // V). Slots the math does not use are neither read nor written.
  template <class Math>
  DEPOT_HOST_DEVICE static void Update(const Math& math, const UpdateArgs& args,
                                       size_t i) {
    const F g = Gradient(args.grad, i);
    F p = V::LoadF32(args.master + i);
    F s[3] = {V::Set(0.0f), V::Set(0.0f), V::Set(0.0f)};
    for (int k = 0; k < Math::kSlots; ++k) {
      s[k] = Load(args.slot_dtypes[k], args.slots[k], i);
    }
    math(g, p, s[0], s[1], s[2]);
    V::StoreF32(args.master + i, p);
    for (int k = 0; k < Math::kSlots; ++k) {
      Store(args.slot_dtypes[k], args.slots[k], i, s[k]);
    }
    if (args.weights != nullptr) Store(args.weight_dtype, args.weights, i, p);
  }
};

// Returns f(std::true_type{}) or f(std::false_type{}), as an R.
template <class R, class Fn>
R WithBool(bool value, Fn&& f) {
  if (value) return f(std::true_type{});
  return f(std::false_type{});
}

// Returns f(math), an R, with `math` the optimizer_math.h type over V that
// runs `step` (OptimizerKernel::PrepareStep): the variant that the server's
// fused_loops.h picks for the same step, made from the same scalars. Host
// code: the kernels launch f's kernel, the host test runs it in a loop.
template <class V, class R, class Fn>
R WithOptimizerMath(const fused::OptimizerStep& step, Fn&& f) {
  using fused::AdagradMath;
  using fused::AdamMath;
  using fused::LionMath;
  using fused::SgdMath;
  return WithBool<R>(step.has_weight_decay, [&](auto wd) -> R {
    switch (step.kind) {
      case OptimizerKind::kAdam:
      case OptimizerKind::kAdamW:
        return WithBool<R>(step.decoupled, [&](auto decoupled) -> R {
          return WithBool<R>(step.amsgrad, [&](auto amsgrad) -> R {
            return f(AdamMath<V, decoupled(), wd(), amsgrad()>(step.adam));
          });
        });
      case OptimizerKind::kSgd:
        if (!step.momentum) {
          return f(SgdMath<V, wd(), false, false, false>(step.sgd));
        }
        return WithBool<R>(step.first_step, [&](auto first) -> R {
          return WithBool<R>(step.nesterov, [&](auto nesterov) -> R {
            return f(SgdMath<V, wd(), true, first(), nesterov()>(step.sgd));
          });
        });
      case OptimizerKind::kAdagrad:
        return f(AdagradMath<V, wd()>(step.adagrad));
      case OptimizerKind::kLion:
        return f(LionMath<V, wd()>(step.lion));
    }
    return R();  // unreachable for a step PrepareStep made
  });
}

}  // namespace depot::gpu

#endif  // DEPOT_CLIENT_SRC_GPU_ELEMENT_UPDATE_H_
