// The vector-ops type of the AVX2 + F16C instruction set: 8 fp32 lanes. No FMA:
// every multiply and add rounds on its own, as in the scalar reference.
// Conversions round exactly like depot/dtype.h (checked against it in
// server/tests/fused_update_test.cc).
//
// Include only from fused_update_avx2.cc, which is compiled with -mavx2
// -mf16c (server/optimizer/CMakeLists.txt).
#ifndef DEPOT_SERVER_OPTIMIZER_VEC_OPS_AVX2_H_
#define DEPOT_SERVER_OPTIMIZER_VEC_OPS_AVX2_H_

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace depot::fused::avx2_isa {

struct Avx2Ops {
  using F = __m256;
  using Mask = __m256;
  static constexpr size_t kLanes = 8;

  static F Set(float x) { return _mm256_set1_ps(x); }
  // Add and Mul pin their operand order (see vec_ops_scalar.h).
  static F Add(F a, F b) {
    F r;
    asm("vaddps %2, %1, %0" : "=x"(r) : "x"(a), "xm"(b));
    return r;
  }
  static F Mul(F a, F b) {
    F r;
    asm("vmulps %2, %1, %0" : "=x"(r) : "x"(a), "xm"(b));
    return r;
  }
  static F Sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F Div(F a, F b) { return _mm256_div_ps(a, b); }
  static F Sqrt(F a) { return _mm256_sqrt_ps(a); }
  // Neg and Max as vec_ops_scalar.h defines them.
  static F Neg(F a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }
  static F Max(F a, F b) {
    // vmaxps gives a > b ? a : b: b when either is NaN. Its operand order is
    // pinned as Add's is; then a NaN a replaces the result.
    F larger;
    asm("vmaxps %2, %1, %0" : "=x"(larger) : "x"(a), "xm"(b));
    return _mm256_blendv_ps(larger, a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  // Ordered, non-signalling: false when either operand is NaN.
  static Mask Greater(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
  static Mask Less(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static F Select(Mask m, F if_true, F if_false) {
    return _mm256_blendv_ps(if_false, if_true, m);
  }

  static F LoadF32(const float* p) { return _mm256_loadu_ps(p); }
  static void StoreF32(float* p, F x) { _mm256_storeu_ps(p, x); }

  // Exact: every bf16 value is an fp32 value.
  static F LoadBF16(const uint16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }

  // FloatToBFloat16 in integer arithmetic: round to nearest, ties to even, by
  // adding 0x7fff plus the kept half's lowest bit; a NaN keeps its sign and
  // the top of its payload, with the quiet bit set.
  static void StoreBF16(uint16_t* p, F x) {
    const __m256i bits = _mm256_castps_si256(x);
    const __m256i lsb =
        _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)),
                         lsb),
        16);
    const __m256i quiet_nan =
        _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x0040));
    const __m256i is_nan = _mm256_cmpgt_epi32(
        _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)),
        _mm256_set1_epi32(0x7f800000));
    const __m256i result = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
    // Every lane is below 0x10000, so the saturating pack is exact.
    const __m128i packed = _mm_packus_epi32(
        _mm256_castsi256_si128(result), _mm256_extracti128_si256(result, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }

  // vcvtph2ps is exact, but quiets a signalling NaN, which HalfToFloat keeps
  // signalling: such lanes (rare) get the quiet bit cleared again.
  static F LoadF16(const uint16_t* p) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const F wide = _mm256_cvtph_ps(half);
    const __m128i abs = _mm_and_si128(half, _mm_set1_epi16(0x7fff));
    const __m128i signalling =
        _mm_and_si128(_mm_cmpgt_epi16(abs, _mm_set1_epi16(0x7c00)),
                      _mm_cmplt_epi16(abs, _mm_set1_epi16(0x7e00)));
    if (_mm_testz_si128(signalling, signalling)) return wide;
    const __m256i quiet_bit = _mm256_and_si256(
        _mm256_cvtepi16_epi32(signalling), _mm256_set1_epi32(0x00400000));
    return _mm256_castsi256_ps(
        _mm256_andnot_si256(quiet_bit, _mm256_castps_si256(wide)));
  }

  // vcvtps2ph rounds to nearest even (the immediate, not MXCSR), produces fp16
  // subnormals exactly, overflows to Inf and keeps NaNs as FloatToHalf does.
  static void StoreF16(uint16_t* p, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
};

}  // namespace depot::fused::avx2_isa

#endif  // DEPOT_SERVER_OPTIMIZER_VEC_OPS_AVX2_H_
