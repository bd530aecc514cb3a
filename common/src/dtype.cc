#include "depot/dtype.h"

#include <bit>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace depot {
namespace {

// Payloads are little-endian on the wire and are copied as host integers below.
static_assert(std::endian::native == std::endian::little,
              "depot assumes a little-endian host");

constexpr uint32_t kFloatSignMask = 0x80000000u;
constexpr uint32_t kFloatAbsMask = 0x7fffffffu;
constexpr uint32_t kFloatInfBits = 0x7f800000u;
constexpr uint32_t kFloatImplicitBit = 0x00800000u;
constexpr uint32_t kFloatMantissaMask = 0x007fffffu;

constexpr uint16_t kHalfInfBits = 0x7c00u;
constexpr uint16_t kHalfQuietBit = 0x0200u;
constexpr uint16_t kBFloat16QuietBit = 0x0040u;

// Shift between the fp32 and fp16 exponent biases (127 - 15), and between their
// mantissa widths (23 - 10).
constexpr uint32_t kHalfRebias = 112;
constexpr int kHalfMantissaShift = 13;

// |x| at and above this (65520, halfway between the largest half 65504 and
// 2^16) rounds to Inf: 65504 has an odd mantissa, so the tie goes up.
constexpr uint32_t kHalfOverflowBits = 0x477ff000u;
// |x| below this (2^-14) is subnormal or zero in fp16.
constexpr uint32_t kHalfMinNormalBits = 0x38800000u;
// fp32 biased exponent of 2^-25, half the smallest fp16 subnormal; anything
// below it rounds to zero.
constexpr uint32_t kHalfUnderflowExponent = 102;

bool IsFloatNaN(uint32_t bits) {
  return (bits & kFloatAbsMask) > kFloatInfBits;
}

// Drops the low `shift` bits of `value`, rounding to nearest, ties to even.
// REQUIRES: 0 < shift < 32.
uint32_t ShiftRightRoundEven(uint32_t value, int shift) {
  const uint32_t kept = value >> shift;
  const uint32_t dropped = value & ((uint32_t{1} << shift) - 1);
  const uint32_t half = uint32_t{1} << (shift - 1);
  const bool round_up = dropped > half || (dropped == half && (kept & 1) != 0);
  return kept + (round_up ? 1 : 0);
}

inline uint16_t FloatBitsToBFloat16(uint32_t bits) {
  if (IsFloatNaN(bits)) {
    // Keep sign and the top of the payload; the quiet bit keeps it a NaN even
    // when the payload's surviving bits are all zero.
    return static_cast<uint16_t>((bits >> 16) | kBFloat16QuietBit);
  }
  // Inf and the largest finite values carry into the exponent correctly: the
  // rounding increment overflows the mantissa into the exponent field.
  return static_cast<uint16_t>(ShiftRightRoundEven(bits, 16));
}

inline uint16_t FloatBitsToHalf(uint32_t bits) {
  const uint16_t sign = static_cast<uint16_t>((bits & kFloatSignMask) >> 16);
  const uint32_t abs = bits & kFloatAbsMask;
  if (abs > kFloatInfBits) {
    const uint32_t payload = (abs & kFloatMantissaMask) >> kHalfMantissaShift;
    return static_cast<uint16_t>(sign | kHalfInfBits | kHalfQuietBit | payload);
  }
  if (abs >= kHalfOverflowBits) return sign | kHalfInfBits;  // Inf included
  if (abs >= kHalfMinNormalBits) {
    // Rebias the exponent in place; a mantissa that rounds up carries into the
    // exponent, which is the correct next value (up to 65504, see above).
    const uint32_t rebiased = abs - (kHalfRebias << 23);
    return static_cast<uint16_t>(
        sign | ShiftRightRoundEven(rebiased, kHalfMantissaShift));
  }
  const uint32_t exponent = abs >> 23;
  if (exponent < kHalfUnderflowExponent) return sign;  // rounds to signed zero
  // Subnormal result: the value is mantissa * 2^(exponent - 150) and the result
  // counts units of 2^-24, so drop (126 - exponent) bits. A result that rounds
  // up to 0x400 is the smallest normal, which is the right encoding.
  const uint32_t mantissa = (abs & kFloatMantissaMask) | kFloatImplicitBit;
  const int shift = static_cast<int>(126 - exponent);
  return static_cast<uint16_t>(sign | ShiftRightRoundEven(mantissa, shift));
}

inline uint32_t HalfToFloatBits(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  const uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0x1f) {
    // Inf or NaN: the payload is kept as is (exact, so signalling stays so).
    return sign | kFloatInfBits | (mantissa << kHalfMantissaShift);
  }
  if (exponent != 0) {
    return sign | ((exponent + kHalfRebias) << 23) |
           (mantissa << kHalfMantissaShift);
  }
  if (mantissa == 0) return sign;
  // Subnormal half, normal float: value = mantissa * 2^-24. With the mantissa's
  // leading one at bit `top`, that is 2^(top - 24) * 1.xxx, so the float's
  // biased exponent is top - 24 + 127 and the bits below the leading one move
  // up to the top of the float mantissa.
  const int top = 31 - std::countl_zero(mantissa);
  const uint32_t float_exponent = static_cast<uint32_t>(top + 103);
  const uint32_t float_mantissa = (mantissa << (23 - top)) & kFloatMantissaMask;
  return sign | (float_exponent << 23) | float_mantissa;
}

// The 2-byte dtypes, element by element through memcpy since `dst` / `src` may
// be misaligned.
template <uint16_t (*kFromFloat)(float)>
void NarrowArray(const float* src, void* dst, size_t n) {
  auto* out = static_cast<unsigned char*>(dst);
  for (size_t i = 0; i < n; ++i) {
    const uint16_t value = kFromFloat(src[i]);
    std::memcpy(out + i * sizeof(value), &value, sizeof(value));
  }
}

template <float (*kToFloat)(uint16_t)>
void WidenArray(const void* src, float* dst, size_t n) {
  const auto* in = static_cast<const unsigned char*>(src);
  for (size_t i = 0; i < n; ++i) {
    uint16_t value;
    std::memcpy(&value, in + i * sizeof(value), sizeof(value));
    dst[i] = kToFloat(value);
  }
}

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat16:
      return "fp16";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(std::string_view name) {
  if (name == "fp32" || name == "float32") return DType::kFloat32;
  if (name == "bf16" || name == "bfloat16") return DType::kBFloat16;
  if (name == "fp16" || name == "float16") return DType::kFloat16;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dtype \"", absl::string_view(name.data(), name.size()),
      "\" (expected fp32, bf16 or fp16)"));
}

absl::StatusOr<DType> DTypeFromWire(int value) {
  switch (value) {
    case static_cast<int>(DType::kFloat32):
      return DType::kFloat32;
    case static_cast<int>(DType::kBFloat16):
      return DType::kBFloat16;
    case static_cast<int>(DType::kFloat16):
      return DType::kFloat16;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype value ", value,
                   " (expected 1 = fp32, 2 = bf16, 3 = fp16)"));
}

uint16_t FloatToBFloat16(float value) {
  return FloatBitsToBFloat16(std::bit_cast<uint32_t>(value));
}

float BFloat16ToFloat(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

uint16_t FloatToHalf(float value) {
  return FloatBitsToHalf(std::bit_cast<uint32_t>(value));
}

float HalfToFloat(uint16_t bits) {
  return std::bit_cast<float>(HalfToFloatBits(bits));
}

void ConvertToFloat(DType src_dtype, const void* src, float* dst, size_t n) {
  if (n == 0) return;  // the pointers may then be null, which memcpy forbids
  switch (src_dtype) {
    case DType::kFloat32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBFloat16:
      WidenArray<BFloat16ToFloat>(src, dst, n);
      return;
    case DType::kFloat16:
      WidenArray<HalfToFloat>(src, dst, n);
      return;
  }
}

void ConvertFromFloat(const float* src, DType dst_dtype, void* dst, size_t n) {
  if (n == 0) return;  // the pointers may then be null, which memcpy forbids
  switch (dst_dtype) {
    case DType::kFloat32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBFloat16:
      NarrowArray<FloatToBFloat16>(src, dst, n);
      return;
    case DType::kFloat16:
      NarrowArray<FloatToHalf>(src, dst, n);
      return;
  }
}

}  // namespace depot
