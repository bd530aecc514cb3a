// The fused update's loops, written once as templates over a vector-ops type V
// and instantiated by each fused_update_<isa>.cc. Every template here depends
// on V, and each instruction set's V lives in its own namespace, so the
// instantiations of different instruction sets never share a symbol (a
// shared inline function could be compiled with one set's flags and run on a
// CPU that lacks them).
//
// A run is processed in blocks of kBlock elements, each in three stages whose
// intermediate data stays in L1: the gradient (sum, unscale, clip, and the
// negation of maximize) into a staging array; the optimizer's element math over
// the gradient, the master weights and the slots; the master weights converted
// into the weights out. The last n % V::kLanes elements go through the same
// vector code on padded copies, so every element is computed by the same
// instructions.
#ifndef DEPOT_SERVER_OPTIMIZER_FUSED_LOOPS_H_
#define DEPOT_SERVER_OPTIMIZER_FUSED_LOOPS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "server/optimizer/fused_update.h"
#include "server/optimizer/optimizer_math.h"

namespace depot::fused {

template <class V>
struct FusedLoops {
  using F = typename V::F;
  static constexpr size_t kLanes = V::kLanes;
  // Elements per block: the staged gradient (2 KiB) and the block's slice of
  // every stream stay in L1.
  static constexpr size_t kBlock = 512;
  static_assert(kBlock % kLanes == 0);

  // A slot's storage: float for fp32, uint16_t (the bit pattern) for bf16.
  static F LoadSlot(const float* p) { return V::LoadF32(p); }
  static F LoadSlot(const uint16_t* p) { return V::LoadBF16(p); }
  static void StoreSlot(float* p, F x) { V::StoreF32(p, x); }
  static void StoreSlot(uint16_t* p, F x) { V::StoreBF16(p, x); }

  // Element type of a gradient or weight dtype: the 2-byte ones as their bits.
  template <DType kDType>
  using Elem = std::conditional_t<kDType == DType::kFloat32, float, uint16_t>;

  template <DType kDType>
  static F Load(const Elem<kDType>* p) {
    if constexpr (kDType == DType::kFloat32) {
      return V::LoadF32(p);
    } else if constexpr (kDType == DType::kBFloat16) {
      return V::LoadBF16(p);
    } else {
      return V::LoadF16(p);
    }
  }

  template <DType kDType>
  static void Store(Elem<kDType>* p, F x) {
    if constexpr (kDType == DType::kFloat32) {
      V::StoreF32(p, x);
    } else if constexpr (kDType == DType::kBFloat16) {
      V::StoreBF16(p, x);
    } else {
      V::StoreF16(p, x);
    }
  }

  // Calls f(std::integral_constant<DType, dtype>{}).
  template <class Fn>
  static void WithDType(DType dtype, Fn&& f) {
    switch (dtype) {
      case DType::kFloat32:
        f(std::integral_constant<DType, DType::kFloat32>{});
        return;
      case DType::kBFloat16:
        f(std::integral_constant<DType, DType::kBFloat16>{});
        return;
      case DType::kFloat16:
        f(std::integral_constant<DType, DType::kFloat16>{});
        return;
    }
  }

  template <DType kDType>
  static const Elem<kDType>* Part(const GradientInput& grad, size_t w) {
    return static_cast<const Elem<kDType>*>(grad.parts[w]) + grad.offset;
  }

  // The final gradient of one vector from its W loaded parts (load(w)):
  // their sum, unscaled, clipped and, with kNegate (maximize), negated.
  template <bool kNegate, class LoadPart>
  static F Gradient(const GradientInput& grad, const F& unscale, const F& clip,
                    LoadPart&& load) {
    F g = load(0);
    for (size_t w = 1; w < grad.num_parts; ++w) g = V::Add(g, load(w));
    if (grad.unscale) g = V::Mul(g, unscale);
    if (grad.clip) g = V::Mul(g, clip);
    if constexpr (kNegate) g = V::Neg(g);
    return g;
  }

  // out[0, n) = the gradient of elements [begin, begin + n).
  // REQUIRES: n % kLanes == 0.
  template <DType kDType, bool kNegate>
  static void SumVectors(const GradientInput& grad, size_t begin, size_t n,
                         float* out) {
    const F unscale = V::Set(grad.unscale_factor);
    const F clip = V::Set(grad.clip_coef);
    for (size_t i = 0; i < n; i += kLanes) {
      V::StoreF32(out + i,
                  Gradient<kNegate>(grad, unscale, clip, [&](size_t w) {
                    return Load<kDType>(Part<kDType>(grad, w) + begin + i);
                  }));
    }
  }

  // As SumVectors for the last n < kLanes elements; out must hold kLanes
  // floats (the padding lanes get the gradient of zeros).
  template <DType kDType, bool kNegate>
  static void SumTail(const GradientInput& grad, size_t begin, size_t n,
                      float* out) {
    const F unscale = V::Set(grad.unscale_factor);
    const F clip = V::Set(grad.clip_coef);
    V::StoreF32(out, Gradient<kNegate>(grad, unscale, clip, [&](size_t w) {
                  Elem<kDType> padded[kLanes] = {};
                  std::memcpy(padded, Part<kDType>(grad, w) + begin,
                              n * sizeof(padded[0]));
                  return Load<kDType>(padded);
                }));
  }

  // The gradient stage alone, never negated: the sum the step's statistics
  // (norms, non-finite checks) and a two-phase step's update start from.
  static void Sum(const GradientInput& grad, size_t begin, size_t n,
                  float* out) {
    WithDType(grad.dtype, [&](auto dtype) {
      const size_t full = n / kLanes * kLanes;
      SumVectors<dtype(), /*kNegate=*/false>(grad, begin, full, out);
      if (full < n) {
        alignas(64) float tail[kLanes];
        SumTail<dtype(), /*kNegate=*/false>(grad, begin + full, n - full, tail);
        std::memcpy(out + full, tail, (n - full) * sizeof(float));
      }
    });
  }

  // The optimizer stage over n elements (n % kLanes == 0). Slots the math
  // does not use are never loaded or stored: their code is compiled out.
  template <class Math, class Slot0, class Slot1, class Slot2>
  static void UpdateVectors(const Math& math, const float* grad, float* master,
                            Slot0* s0, Slot1* s1, Slot2* s2, size_t n) {
    for (size_t i = 0; i < n; i += kLanes) {
      F p = V::LoadF32(master + i);
      F a = V::Set(0.0f);
      F b = V::Set(0.0f);
      F c = V::Set(0.0f);
      if constexpr (Math::kSlots > 0) a = LoadSlot(s0 + i);
      if constexpr (Math::kSlots > 1) b = LoadSlot(s1 + i);
      if constexpr (Math::kSlots > 2) c = LoadSlot(s2 + i);
      math(V::LoadF32(grad + i), p, a, b, c);
      V::StoreF32(master + i, p);
      if constexpr (Math::kSlots > 0) StoreSlot(s0 + i, a);
      if constexpr (Math::kSlots > 1) StoreSlot(s1 + i, b);
      if constexpr (Math::kSlots > 2) StoreSlot(s2 + i, c);
    }
  }

  // weights[0, n) = master[0, n) as kDType (n % kLanes == 0).
  template <DType kDType>
  static void ConvertVectors(const float* master, Elem<kDType>* weights,
                             size_t n) {
    for (size_t i = 0; i < n; i += kLanes) {
      Store<kDType>(weights + i, V::LoadF32(master + i));
    }
  }

  // out[begin, begin + n) = master[0, n) as `dtype`.
  static void ConvertOut(DType weight_dtype, void* weights, const float* master,
                         size_t begin, size_t n) {
    WithDType(weight_dtype, [&](auto dtype) {
      using E = Elem<dtype()>;
      E* out = static_cast<E*>(weights) + begin;
      const size_t full = n / kLanes * kLanes;
      ConvertVectors<dtype()>(master, out, full);
      if (full < n) {
        alignas(64) float padded[kLanes] = {};
        E converted[kLanes];
        std::memcpy(padded, master + full, (n - full) * sizeof(float));
        ConvertVectors<dtype()>(padded, converted, kLanes);
        std::memcpy(out + full, converted, (n - full) * sizeof(E));
      }
    });
  }

  // Calls f(dtype, negate) with the gradient's dtype and the update's
  // maximize flag as compile-time constants (WithDType, WithBool).
  template <class Fn>
  static void WithGradientType(const FusedCall& call, Fn&& f) {
    WithDType(call.grad.dtype, [&](auto dtype) {
      WithBool(call.step.maximize, [&](auto negate) { f(dtype, negate); });
    });
  }

  template <class Slot>
  static Slot* SlotAt(void* slot, size_t index) {
    return slot == nullptr ? nullptr : static_cast<Slot*>(slot) + index;
  }

  // The whole fused pass over call.n elements with `math`; Slot0, Slot1 and
  // Slot2 are the slots' element types.
  template <class Slot0, class Slot1, class Slot2, class Math>
  static void Pass(const FusedCall& call, const Math& math) {
    alignas(64) float grad[kBlock];
    const size_t full = call.n / kLanes * kLanes;
    for (size_t begin = 0; begin < full; begin += kBlock) {
      const size_t n = full - begin < kBlock ? full - begin : kBlock;
      WithGradientType(call, [&](auto dtype, auto negate) {
        SumVectors<dtype(), negate()>(call.grad, begin, n, grad);
      });
      UpdateVectors(math, grad, call.master + begin,
                    SlotAt<Slot0>(call.slots[0], begin),
                    SlotAt<Slot1>(call.slots[1], begin),
                    SlotAt<Slot2>(call.slots[2], begin), n);
      if (call.weights != nullptr) {
        ConvertOut(call.weight_dtype, call.weights, call.master + begin, begin,
                   n);
      }
    }
    if (full == call.n) return;
    // The tail, on padded copies of every stream.
    const size_t n = call.n - full;
    WithGradientType(call, [&](auto dtype, auto negate) {
      SumTail<dtype(), negate()>(call.grad, full, n, grad);
    });
    alignas(64) float master[kLanes] = {};
    Slot0 s0[kLanes] = {};
    Slot1 s1[kLanes] = {};
    Slot2 s2[kLanes] = {};
    // Copies the tail of slot k, if the math uses it, into `padded`, or back
    // from it into the run.
    const auto copy_slot = [&](auto* padded, int k, bool into_run) {
      using Slot = std::remove_pointer_t<decltype(padded)>;
      if (k >= Math::kSlots) return;
      Slot* at = SlotAt<Slot>(call.slots[k], full);
      if (into_run) {
        std::memcpy(at, padded, n * sizeof(Slot));
      } else {
        std::memcpy(padded, at, n * sizeof(Slot));
      }
    };
    std::memcpy(master, call.master + full, n * sizeof(float));
    copy_slot(s0, 0, false);
    copy_slot(s1, 1, false);
    copy_slot(s2, 2, false);
    UpdateVectors(math, grad, master, s0, s1, s2, kLanes);
    std::memcpy(call.master + full, master, n * sizeof(float));
    copy_slot(s0, 0, true);
    copy_slot(s1, 1, true);
    copy_slot(s2, 2, true);
    if (call.weights != nullptr) {
      ConvertOut(call.weight_dtype, call.weights, master, full, n);
    }
  }

  // Calls f(static_cast<T*>(nullptr)) with T the element type of a slot's
  // storage dtype: float for fp32, uint16_t for bf16.
  template <class Fn>
  static void WithSlotType(DType dtype, Fn&& f) {
    if (dtype == DType::kBFloat16) {
      f(static_cast<uint16_t*>(nullptr));
    } else {
      f(static_cast<float*>(nullptr));
    }
  }

  // Runs the pass with the slots' element types, resolving one slot per
  // level: Slots holds the types of the slots resolved so far. A slot the
  // math does not use is typed float (and never touched).
  template <class Math, class... Slots>
  static void WithSlots(const FusedCall& call, const Math& math) {
    constexpr size_t k = sizeof...(Slots);
    if constexpr (k == std::extent_v<decltype(FusedCall::slots)>) {
      Pass<Slots...>(call, math);
    } else if constexpr (k >= static_cast<size_t>(Math::kSlots)) {
      WithSlots<Math, Slots..., float>(call, math);
    } else {
      WithSlotType(call.step.slot_dtypes[k], [&](auto* slot) {
        WithSlots<Math, Slots..., std::remove_pointer_t<decltype(slot)>>(call,
                                                                         math);
      });
    }
  }

  template <class Fn>
  static void WithBool(bool value, Fn&& f) {
    if (value) {
      f(std::true_type{});
    } else {
      f(std::false_type{});
    }
  }

  // Picks the loop for call.step's kind, flags and slot dtypes.
  static void Update(const FusedCall& call) {
    const OptimizerStep& step = call.step;
    WithBool(step.has_weight_decay, [&](auto wd) {
      switch (step.kind) {
        case OptimizerKind::kAdam:
        case OptimizerKind::kAdamW:
          WithBool(step.decoupled, [&](auto decoupled) {
            WithBool(step.amsgrad, [&](auto amsgrad) {
              WithSlots(call,
                        AdamMath<V, decoupled(), wd(), amsgrad()>(step.adam));
            });
          });
          return;
        case OptimizerKind::kSgd:
          if (!step.momentum) {
            WithSlots(call, SgdMath<V, wd(), false, false, false>(step.sgd));
            return;
          }
          WithBool(step.first_step, [&](auto first) {
            WithBool(step.nesterov, [&](auto nesterov) {
              WithSlots(call,
                        SgdMath<V, wd(), true, first(), nesterov()>(step.sgd));
            });
          });
          return;
        case OptimizerKind::kAdagrad:
          WithSlots(call, AdagradMath<V, wd()>(step.adagrad));
          return;
        case OptimizerKind::kLion:
          WithSlots(call, LionMath<V, wd()>(step.lion));
          return;
      }
    });
  }

  static void SumOnly(const GradientInput& grad, float* out, size_t n) {
    Sum(grad, 0, n, out);
  }

  static void Encode(const float* master, DType dtype, void* out, size_t n) {
    ConvertOut(dtype, out, master, 0, n);
  }
};

}  // namespace depot::fused

#endif  // DEPOT_SERVER_OPTIMIZER_FUSED_LOOPS_H_
