// The vector-ops type of the AVX-512 instruction sets (F, BW, VL, DQ): 16 fp32
// lanes. No FMA: every multiply and add rounds on its own, as in the scalar
// reference. Conversions round exactly like depot/dtype.h (checked against it
// in server/tests/fused_update_test.cc).
//
// kNativeBf16 selects AVX512-BF16's vcvtneps2bf16 for fp32 -> bf16. That
// instruction treats fp32 subnormal inputs as zero, where FloatToBFloat16
// rounds them to bf16 subnormals, so blocks that hold one (rare) take the
// integer rounding for those lanes.
//
// Include only from fused_update_avx512.cc (kNativeBf16 false, compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512dq) and fused_update_avx512bf16.cc
// (kNativeBf16 true, -mavx512bf16 as well). Everything here is a member of the
// class template, so the two translation units share no function.
#ifndef DEPOT_SERVER_OPTIMIZER_VEC_OPS_AVX512_H_
#define DEPOT_SERVER_OPTIMIZER_VEC_OPS_AVX512_H_

// GCC 12's AVX-512 intrinsics seed their results with a deliberately
// uninitialised _mm512_undefined_*() value and then warn about it once
// inlined (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstddef>
#include <cstdint>

namespace depot::fused::avx512_isa {

template <bool kNativeBf16>
struct Avx512Ops {
  using F = __m512;
  using Mask = __mmask16;
  static constexpr size_t kLanes = 16;

  static F Set(float x) { return _mm512_set1_ps(x); }
  // Add and Mul pin their operand order (see vec_ops_scalar.h).
  static F Add(F a, F b) {
    F r;
    asm("vaddps %2, %1, %0" : "=v"(r) : "v"(a), "vm"(b));
    return r;
  }
  static F Mul(F a, F b) {
    F r;
    asm("vmulps %2, %1, %0" : "=v"(r) : "v"(a), "vm"(b));
    return r;
  }
  static F Sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F Div(F a, F b) { return _mm512_div_ps(a, b); }
  static F Sqrt(F a) { return _mm512_sqrt_ps(a); }
  // Neg and Max as vec_ops_scalar.h defines them.
  static F Neg(F a) { return _mm512_xor_ps(a, _mm512_set1_ps(-0.0f)); }
  static F Max(F a, F b) {
    // vmaxps gives a > b ? a : b: b when either is NaN. Its operand order is
    // pinned as Add's is; then a NaN a replaces the result.
    F larger;
    asm("vmaxps %2, %1, %0" : "=v"(larger) : "v"(a), "vm"(b));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), larger,
                                a);
  }
  // Ordered, non-signalling: false when either operand is NaN.
  static Mask Greater(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static Mask Less(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static F Select(Mask m, F if_true, F if_false) {
    return _mm512_mask_blend_ps(m, if_false, if_true);
  }

  static F LoadF32(const float* p) { return _mm512_loadu_ps(p); }
  static void StoreF32(float* p, F x) { _mm512_storeu_ps(p, x); }

  // Exact: every bf16 value is an fp32 value.
  static F LoadBF16(const uint16_t* p) {
    const __m512i wide = _mm512_cvtepu16_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }

  static void StoreBF16(uint16_t* p, F x) {
    __m256i result;
    if constexpr (kNativeBf16) {
      result = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x));
      // Subnormal inputs (fpclass category 0x20).
      const __mmask16 subnormal = _mm512_fpclass_ps_mask(x, 0x20);
      if (subnormal != 0) {
        result = _mm256_mask_blend_epi16(subnormal, result, RoundToBF16(x));
      }
    } else {
      result = RoundToBF16(x);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), result);
  }

  // vcvtph2ps is exact, but quiets a signalling NaN, which HalfToFloat keeps
  // signalling: such lanes (rare) get the quiet bit cleared again.
  static F LoadF16(const uint16_t* p) {
    const __m256i half =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const F wide = _mm512_cvtph_ps(half);
    const __m256i abs = _mm256_and_si256(half, _mm256_set1_epi16(0x7fff));
    const __mmask16 signalling =
        _mm256_cmpgt_epi16_mask(abs, _mm256_set1_epi16(0x7c00)) &
        _mm256_cmplt_epi16_mask(abs, _mm256_set1_epi16(0x7e00));
    if (signalling == 0) return wide;
    return _mm512_castsi512_ps(_mm512_mask_andnot_epi32(
        _mm512_castps_si512(wide), signalling, _mm512_set1_epi32(0x00400000),
        _mm512_castps_si512(wide)));
  }

  // vcvtps2ph rounds to nearest even (the immediate, not MXCSR), produces fp16
  // subnormals exactly, overflows to Inf and keeps NaNs as FloatToHalf does.
  static void StoreF16(uint16_t* p, F x) {
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(p),
        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }

 private:
  // FloatToBFloat16 in integer arithmetic: round to nearest, ties to even, by
  // adding 0x7fff plus the kept half's lowest bit; a NaN keeps its sign and
  // the top of its payload, with the quiet bit set.
  static __m256i RoundToBF16(F x) {
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i lsb =
        _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)),
                         lsb),
        16);
    const __m512i quiet_nan =
        _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x0040));
    const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)),
        _mm512_set1_epi32(0x7f800000));
    return _mm512_cvtepi32_epi16(
        _mm512_mask_blend_epi32(is_nan, rounded, quiet_nan));
  }
};

}  // namespace depot::fused::avx512_isa

#endif  // DEPOT_SERVER_OPTIMIZER_VEC_OPS_AVX512_H_
