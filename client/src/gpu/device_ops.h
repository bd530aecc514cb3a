// CudaOps: the vector-ops type (server/optimizer/vec_ops_scalar.h describes
// the interface) of the GPU kernels, one lane per thread. With it the
// server's element math (optimizer_math.h) and the kernels' element functions
// (element_update.h) compute on the device what the server computes on its
// CPUs, bit for bit for every result that is not a NaN:
// - Add, Mul, Sub, Div and Sqrt are the IEEE operations rounded to nearest,
//   each rounding once: the _rn intrinsics, which the compiler never fuses
//   into a multiply-add (and the .cu files are compiled with -fmad=false,
//   -prec-div=true, -prec-sqrt=true and -ftz=false besides);
// - Neg flips the sign bit and Max is a if a is NaN, else (a > b ? a : b),
//   as in every server vec_ops type;
// - bf16 is read and stored by the server's own code (slot_storage.h's
//   LoadSlot, StoreSlot); fp16 by the hardware conversions, which round to
//   nearest, ties to even, with subnormals and overflow to Inf as
//   depot/dtype.h does, and NaNs converted by their bits as dtype.cc does
//   (sign and top of the payload kept, quiet bit set; exact when widening).
// A NaN stays a NaN, but its bits may differ: GPU arithmetic returns the
// canonical NaN where an x86 CPU returns an operand's.
//
// Include only from .cu files.
#ifndef DEPOT_CLIENT_SRC_GPU_DEVICE_OPS_H_
#define DEPOT_CLIENT_SRC_GPU_DEVICE_OPS_H_

#if !defined(__CUDACC__)
#error "device_ops.h is for CUDA sources (nvcc) only"
#endif

#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "server/optimizer/slot_storage.h"

namespace depot::gpu {

struct CudaOps {
  using F = float;
  using Mask = bool;
  static constexpr size_t kLanes = 1;

  // Host and device: the math types' constructors run on the host.
  __host__ __device__ static F Set(float x) { return x; }
  __device__ static F Add(F a, F b) { return __fadd_rn(a, b); }
  __device__ static F Mul(F a, F b) { return __fmul_rn(a, b); }
  __device__ static F Sub(F a, F b) { return __fsub_rn(a, b); }
  __device__ static F Div(F a, F b) { return __fdiv_rn(a, b); }
  __device__ static F Sqrt(F a) { return __fsqrt_rn(a); }
  __device__ static F Neg(F a) {
    return __uint_as_float(__float_as_uint(a) ^ 0x80000000u);
  }
  __device__ static F Max(F a, F b) { return a != a ? a : (a > b ? a : b); }
  __device__ static Mask Greater(F a, F b) { return a > b; }
  __device__ static Mask Less(F a, F b) { return a < b; }
  __device__ static F Select(Mask m, F if_true, F if_false) {
    return m ? if_true : if_false;
  }

  __device__ static F LoadF32(const float* p) { return *p; }
  __device__ static void StoreF32(float* p, F x) { *p = x; }
  __device__ static F LoadBF16(const uint16_t* p) { return LoadSlot(*p); }
  __device__ static void StoreBF16(uint16_t* p, F x) { StoreSlot(*p, x); }

  __device__ static F LoadF16(const uint16_t* p) {
    const uint32_t half = *p;
    if ((half & 0x7c00u) == 0x7c00u && (half & 0x03ffu) != 0) {
      // NaN: the payload moves up unchanged (a signalling NaN stays one).
      return __uint_as_float(((half & 0x8000u) << 16) | 0x7f800000u |
                             ((half & 0x03ffu) << 13));
    }
    return __half2float(__ushort_as_half(static_cast<unsigned short>(half)));
  }

  __device__ static void StoreF16(uint16_t* p, F x) {
    const uint32_t bits = __float_as_uint(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
      // NaN: sign, the quiet bit and the top of the payload.
      *p = static_cast<uint16_t>(((bits >> 16) & 0x8000u) | 0x7c00u | 0x0200u |
                                 ((bits & 0x007fffffu) >> 13));
      return;
    }
    *p = __half_as_ushort(__float2half_rn(x));
  }
};

}  // namespace depot::gpu

#endif  // DEPOT_CLIENT_SRC_GPU_DEVICE_OPS_H_
