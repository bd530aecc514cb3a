// Dtype names and the scalar and array conversions at their edge cases. The
// broad check against an independent rounding reference is
// dtype_rounding_test.cc.
#include "depot/dtype.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace depot {
namespace {

float FloatFromBits(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t BitsOf(float value) { return std::bit_cast<uint32_t>(value); }

bool IsBFloat16NaN(uint16_t bits) { return (bits & 0x7fff) > 0x7f80; }
bool IsHalfNaN(uint16_t bits) { return (bits & 0x7fff) > 0x7c00; }

// Quiet and signalling NaNs of both signs, including payloads whose surviving
// high bits are all zero (the case that would turn into Inf if not quieted).
const uint32_t kNaNInputs[] = {
    0x7fc00000u,  // +quiet
    0xffc00000u,  // -quiet
    0x7f800001u,  // +signalling, payload only in the lowest bit
    0xff800001u,  // -signalling, payload only in the lowest bit
    0x7fa00000u,  // +signalling, payload in the high bits
    0xffbfffffu,  // -signalling, full payload
};

TEST(DTypeTest, SizesAndNamesMatchTheWireTypes) {
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2u);
  EXPECT_EQ(DTypeName(DType::kFloat32), "fp32");
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bf16");
  EXPECT_EQ(DTypeName(DType::kFloat16), "fp16");
}

TEST(DTypeTest, ParseAcceptsShortAndLongNames) {
  EXPECT_EQ(ParseDType("fp32").value(), DType::kFloat32);
  EXPECT_EQ(ParseDType("float32").value(), DType::kFloat32);
  EXPECT_EQ(ParseDType("bf16").value(), DType::kBFloat16);
  EXPECT_EQ(ParseDType("bfloat16").value(), DType::kBFloat16);
  EXPECT_EQ(ParseDType("fp16").value(), DType::kFloat16);
  EXPECT_EQ(ParseDType("float16").value(), DType::kFloat16);
}

TEST(DTypeTest, ParseRejectsUnknownNames) {
  const absl::StatusOr<DType> parsed = ParseDType("fp8");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("fp8"), absl::string_view::npos);
}

TEST(DTypeTest, FromWireAcceptsOnlyTheThreeEnumValues) {
  EXPECT_EQ(DTypeFromWire(1).value(), DType::kFloat32);
  EXPECT_EQ(DTypeFromWire(2).value(), DType::kBFloat16);
  EXPECT_EQ(DTypeFromWire(3).value(), DType::kFloat16);
  for (int bad : {0, 4, -1, 255}) {
    EXPECT_EQ(DTypeFromWire(bad).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(BFloat16Test, TiesRoundToEven) {
  // 1 + 2^-8 lies halfway between 1 (0x3f80, even) and 1 + 2^-7 (0x3f81): down.
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x3f808000u)), 0x3f80);
  // 1 + 3 * 2^-8 lies halfway between 0x3f81 (odd) and 0x3f82 (even): up.
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x3f818000u)), 0x3f82);
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0xbf808000u)), 0xbf80);
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0xbf818000u)), 0xbf82);
}

TEST(BFloat16Test, NonTiesRoundToNearest) {
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x3f807fffu)), 0x3f80);
}

TEST(BFloat16Test, NaNStaysNaNWithItsSign) {
  for (uint32_t bits : kNaNInputs) {
    const uint16_t out = FloatToBFloat16(FloatFromBits(bits));
    EXPECT_TRUE(IsBFloat16NaN(out)) << std::hex << bits << " -> " << out;
    EXPECT_EQ(out & 0x8000, (bits >> 16) & 0x8000) << std::hex << bits;
    EXPECT_NE(out & 0x0040, 0) << "not quiet: " << std::hex << out;
  }
}

TEST(BFloat16Test, InfinitiesStayInfinite) {
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(-std::numeric_limits<float>::infinity()), 0xff80);
}

TEST(BFloat16Test, LargestFloatsOverflowToInfinity) {
  // FLT_MAX is past the midpoint between the largest bf16 (0x7f7f) and 2^128.
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x7f7f7fffu)), 0x7f7f);
}

TEST(HalfTest, TiesRoundToEven) {
  // 1 + 2^-11 lies halfway between 1 (0x3c00, even) and 1 + 2^-10: down.
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3c00);
  // 1 + 3 * 2^-11 lies halfway between 0x3c01 (odd) and 0x3c02 (even): up.
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(FloatToHalf(-(1.0f + 0x1p-11f)), 0xbc00);
  EXPECT_EQ(FloatToHalf(-(1.0f + 3 * 0x1p-11f)), 0xbc02);
}

TEST(HalfTest, NaNStaysNaNWithItsSign) {
  for (uint32_t bits : kNaNInputs) {
    const uint16_t out = FloatToHalf(FloatFromBits(bits));
    EXPECT_TRUE(IsHalfNaN(out)) << std::hex << bits << " -> " << out;
    EXPECT_EQ(out & 0x8000, (bits >> 16) & 0x8000) << std::hex << bits;
    EXPECT_NE(out & 0x0200, 0) << "not quiet: " << std::hex << out;
  }
}

TEST(HalfTest, NaNKeepsTheHighPayloadBits) {
  // Payload 0x155 in the top ten mantissa bits, quiet bit added.
  EXPECT_EQ(FloatToHalf(FloatFromBits(0x7f800000u | (0x155u << 13))),
            0x7c00 | 0x0200 | 0x155);
}

TEST(HalfTest, InfinitiesStayInfinite) {
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
}

TEST(HalfTest, OverflowRoundsToInfinityFromTheMidpointUp) {
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);  // the largest half
  // Just below 65520, the midpoint to 2^16: rounds down to 65504.
  EXPECT_EQ(FloatToHalf(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  // The midpoint itself: 65504's mantissa is odd, so the tie goes to Inf.
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-65520.0f), 0xfc00);
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::max()), 0x7c00);
}

TEST(HalfTest, SubnormalsAreProducedExactly) {
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);         // smallest
  EXPECT_EQ(FloatToHalf(1023 * 0x1p-24f), 0x03ff);  // largest
  EXPECT_EQ(FloatToHalf(-0x1p-24f), 0x8001);
  EXPECT_EQ(FloatToHalf(0x1p-14f), 0x0400);  // smallest normal
}

TEST(HalfTest, SubnormalsRoundToNearestEven) {
  // 2^-25 is halfway between 0 and the smallest subnormal: to zero (even).
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0x1p-25f), 0x8000);
  EXPECT_EQ(FloatToHalf(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  // 1.5 units is halfway between 1 (odd) and 2 (even): up.
  EXPECT_EQ(FloatToHalf(1.5f * 0x1p-24f), 0x0002);
  // 2.5 units: halfway between 2 (even) and 3: down.
  EXPECT_EQ(FloatToHalf(2.5f * 0x1p-24f), 0x0002);
  EXPECT_EQ(FloatToHalf(1e-30f), 0x0000);
}

TEST(HalfTest, LargestSubnormalRoundsUpIntoTheNormalRange) {
  // 1023.5 units is halfway between 0x03ff (odd) and 0x0400, the smallest
  // normal (even).
  EXPECT_EQ(FloatToHalf(1023.5f * 0x1p-24f), 0x0400);
  EXPECT_EQ(FloatToHalf(std::nextafter(1023.5f * 0x1p-24f, 0.0f)), 0x03ff);
}

TEST(HalfTest, SubnormalsWidenExactly) {
  EXPECT_EQ(HalfToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x03ff), 1023 * 0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x0200), 0x1p-15f);
  EXPECT_EQ(HalfToFloat(0x8001), -0x1p-24f);
  EXPECT_EQ(BitsOf(HalfToFloat(0x8000)), 0x80000000u);  // -0 keeps its sign
}

// Every bit pattern, widened to fp32 and narrowed back, is itself; NaNs come
// back as NaN (quieted, so the bits may differ).
template <typename Widen, typename Narrow, typename IsNaN>
void ExpectEveryPatternRoundTrips(Widen widen, Narrow narrow, IsNaN is_nan) {
  int failures = 0;
  for (uint32_t bits = 0; bits <= 0xffff && failures < 10; ++bits) {
    const uint16_t in = static_cast<uint16_t>(bits);
    const float wide = widen(in);
    const uint16_t out = narrow(wide);
    if (is_nan(in)) {
      if (!std::isnan(wide) || !is_nan(out)) {
        ++failures;
        ADD_FAILURE() << "NaN 0x" << std::hex << bits << " came back as 0x"
                      << out;
      }
    } else if (out != in) {
      ++failures;
      ADD_FAILURE() << "0x" << std::hex << bits << " came back as 0x" << out;
    }
  }
}

TEST(BFloat16Test, EveryBitPatternRoundTrips) {
  ExpectEveryPatternRoundTrips(BFloat16ToFloat, FloatToBFloat16, IsBFloat16NaN);
}

TEST(HalfTest, EveryBitPatternRoundTrips) {
  ExpectEveryPatternRoundTrips(HalfToFloat, FloatToHalf, IsHalfNaN);
}

// Values that exercise rounding in both narrow types.
std::vector<float> ArrayTestValues() {
  std::vector<float> values;
  for (int i = 0; i < 37; ++i) {
    values.push_back(static_cast<float>(i - 18) * 0.3711f + 0x1p-20f * i);
  }
  values.push_back(std::numeric_limits<float>::infinity());
  values.push_back(70000.0f);
  values.push_back(0x1p-24f);
  return values;
}

// The packed little-endian bytes of `values` in `dtype`, one scalar at a time.
std::vector<unsigned char> EncodeOneByOne(const std::vector<float>& values,
                                          DType dtype) {
  std::vector<unsigned char> bytes(values.size() * DTypeSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    unsigned char* at = bytes.data() + i * DTypeSize(dtype);
    if (dtype == DType::kFloat32) {
      std::memcpy(at, &values[i], sizeof(float));
      continue;
    }
    const uint16_t narrow = dtype == DType::kBFloat16
                                ? FloatToBFloat16(values[i])
                                : FloatToHalf(values[i]);
    std::memcpy(at, &narrow, sizeof(narrow));
  }
  return bytes;
}

constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kBFloat16,
                                DType::kFloat16};

// Arrays are written and read at an odd byte offset, so that the 2- and 4-byte
// elements are all misaligned.
TEST(ConvertArrayTest, FromFloatMatchesScalarAtUnalignedDestination) {
  const std::vector<float> values = ArrayTestValues();
  for (DType dtype : kAllDTypes) {
    const std::vector<unsigned char> expected = EncodeOneByOne(values, dtype);
    std::vector<unsigned char> buffer(expected.size() + 1);
    ConvertFromFloat(values.data(), dtype, buffer.data() + 1, values.size());
    EXPECT_EQ(std::vector<unsigned char>(buffer.begin() + 1, buffer.end()),
              expected)
        << DTypeName(dtype);
  }
}

TEST(ConvertArrayTest, ToFloatMatchesScalarFromUnalignedSource) {
  const std::vector<float> values = ArrayTestValues();
  for (DType dtype : kAllDTypes) {
    const std::vector<unsigned char> encoded = EncodeOneByOne(values, dtype);
    std::vector<unsigned char> buffer(encoded.size() + 1);
    std::memcpy(buffer.data() + 1, encoded.data(), encoded.size());
    std::vector<float> out(values.size());
    ConvertToFloat(dtype, buffer.data() + 1, out.data(), values.size());
    for (size_t i = 0; i < values.size(); ++i) {
      const float expected = dtype == DType::kFloat32 ? values[i]
                             : dtype == DType::kBFloat16
                                 ? BFloat16ToFloat(FloatToBFloat16(values[i]))
                                 : HalfToFloat(FloatToHalf(values[i]));
      EXPECT_EQ(BitsOf(out[i]), BitsOf(expected))
          << DTypeName(dtype) << " element " << i;
    }
  }
}

TEST(ConvertArrayTest, ZeroElementsTouchNothing) {
  unsigned char sentinel[4] = {0xab, 0xab, 0xab, 0xab};
  const float src = 1.0f;
  ConvertFromFloat(&src, DType::kFloat16, sentinel + 1, 0);
  for (unsigned char byte : sentinel) EXPECT_EQ(byte, 0xab);
}

}  // namespace
}  // namespace depot
