// The vector-ops type of the scalar instruction set: one lane, plain C++. It is
// the reference the other instruction sets must match bit for bit. See
// optimizer_math.h for what a vector-ops type provides.
//
// NaN operands: an x86 operation on two NaNs returns the first source operand
// (quieted). A compiler may swap the operands of an add or a multiply (they
// commute for every other value), which would make the NaN an update stores
// depend on how each instruction set's loop was compiled. So on x86-64 every
// vec_ops type computes Add and Mul with inline assembly that fixes the
// operand order to the source's; subtraction, division and square root cannot
// be reordered and stay plain.
//
// Neg and Max are not IEEE arithmetic and are defined by their bits, the same
// in every vec_ops type:
//  - Neg(a) flips the sign bit, of zeros, infinities and NaNs too (a NaN keeps
//    its payload and stays signalling if it was): torch's `-grad`. (0 - a
//    gives +0 for +0, where torch gives -0; a * -1 keeps a NaN's sign.)
//  - Max(a, b) is torch.maximum(a, b) as torch's portable vector kernel
//    computes it: a if a is NaN, else (a > b ? a : b), which is b if b is NaN
//    and b for equal values (+0 and -0 alike). So any NaN input gives a NaN,
//    and that NaN is an input's, bits unchanged. (torch's scalar loop, which
//    takes the tail of a tensor, returns the default quiet NaN instead, and
//    its AVX2 kernel an all-ones NaN: only "NaN in, NaN out" is torch's
//    contract, and Depot keeps one choice everywhere.)
//
// Include only from fused_update_scalar.cc: like every vec_ops header, its
// code must be compiled with its own instruction-set flags only.
#ifndef DEPOT_SERVER_OPTIMIZER_VEC_OPS_SCALAR_H_
#define DEPOT_SERVER_OPTIMIZER_VEC_OPS_SCALAR_H_

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "depot/dtype.h"
#include "server/optimizer/slot_storage.h"

namespace depot::fused::scalar_isa {

struct ScalarOps {
  using F = float;
  using Mask = bool;
  static constexpr size_t kLanes = 1;

  static F Set(float x) { return x; }
#if defined(__x86_64__)
  static F Add(F a, F b) {
    asm("addss %1, %0" : "+x"(a) : "xm"(b));
    return a;
  }
  static F Mul(F a, F b) {
    asm("mulss %1, %0" : "+x"(a) : "xm"(b));
    return a;
  }
#else
  static F Add(F a, F b) { return a + b; }
  static F Mul(F a, F b) { return a * b; }
#endif
  static F Sub(F a, F b) { return a - b; }
  static F Div(F a, F b) { return a / b; }
  static F Sqrt(F a) { return std::sqrt(a); }
  static F Neg(F a) {
    return std::bit_cast<F>(std::bit_cast<uint32_t>(a) ^ 0x80000000u);
  }
  static F Max(F a, F b) { return a != a ? a : (a > b ? a : b); }
  static Mask Greater(F a, F b) { return a > b; }
  static Mask Less(F a, F b) { return a < b; }
  static F Select(Mask m, F if_true, F if_false) {
    return m ? if_true : if_false;
  }

  static F LoadF32(const float* p) { return *p; }
  static void StoreF32(float* p, F x) { *p = x; }
  static F LoadBF16(const uint16_t* p) { return LoadSlot(*p); }
  static void StoreBF16(uint16_t* p, F x) { StoreSlot(*p, x); }
  static F LoadF16(const uint16_t* p) { return HalfToFloat(*p); }
  static void StoreF16(uint16_t* p, F x) { *p = FloatToHalf(x); }
};

}  // namespace depot::fused::scalar_isa

#endif  // DEPOT_SERVER_OPTIMIZER_VEC_OPS_SCALAR_H_
