// fp32 -> bf16 / fp16 rounding checked against an independent reference: the
// reference decodes every narrow value with ldexp (no bit tricks), finds the
// two representable neighbours of the input in double arithmetic, and picks the
// nearer, ties to the one with an even mantissa.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "depot/dtype.h"
#include "gtest/gtest.h"

namespace depot {
namespace {

struct NarrowFormat {
  int exponent_bits;
  int mantissa_bits;
  uint16_t (*convert)(float);
};

constexpr NarrowFormat kBFloat16 = {8, 7, FloatToBFloat16};
constexpr NarrowFormat kHalf = {5, 10, FloatToHalf};

class RoundingReference {
 public:
  explicit RoundingReference(const NarrowFormat& format)
      : inf_bits_(((1u << format.exponent_bits) - 1) << format.mantissa_bits) {
    const int bias = (1 << (format.exponent_bits - 1)) - 1;
    const uint32_t mantissa_mask = (1u << format.mantissa_bits) - 1;
    // Patterns 0 .. inf_bits_ in order are increasing values. The last one, the
    // Inf pattern, decodes as 2^(emax + 1): the value the largest finite number
    // would round up to with an unbounded exponent, which IEEE turns into Inf.
    for (uint32_t bits = 0; bits <= inf_bits_; ++bits) {
      const int exponent = static_cast<int>(bits >> format.mantissa_bits);
      const uint32_t mantissa = bits & mantissa_mask;
      const int scale = 1 - bias - format.mantissa_bits;
      values_.push_back(
          exponent == 0 ? std::ldexp(static_cast<double>(mantissa), scale)
                        : std::ldexp(static_cast<double>(
                                         mantissa +
                                         (uint32_t{1} << format.mantissa_bits)),
                                     exponent + scale - 1));
    }
  }

  // The expected bits for a non-NaN input.
  uint16_t Round(float input) const {
    const uint32_t sign = std::signbit(input) ? 0x8000u : 0;
    const double magnitude = std::fabs(static_cast<double>(input));
    // The first value above the input; the one before it is at or below it.
    const auto above =
        std::upper_bound(values_.begin(), values_.end(), magnitude);
    if (above == values_.end()) return static_cast<uint16_t>(sign | inf_bits_);
    const uint32_t high = static_cast<uint32_t>(above - values_.begin());
    const uint32_t low = high - 1;
    // Both differences are exact: the operands are close and have few bits.
    const double below_distance = magnitude - values_[low];
    const double above_distance = values_[high] - magnitude;
    uint32_t nearer;
    if (below_distance != above_distance) {
      nearer = below_distance < above_distance ? low : high;
    } else {
      nearer = (low % 2 == 0) ? low : high;
    }
    return static_cast<uint16_t>(sign | nearer);
  }

  // Midpoints between neighbouring values (the ties), and the floats just
  // beside them, wherever they are exactly representable as floats.
  std::vector<float> TieNeighbourhoods() const {
    std::vector<float> out;
    for (size_t i = 0; i + 1 < values_.size(); ++i) {
      const double mid = (values_[i] + values_[i + 1]) / 2;
      const float tie = static_cast<float>(mid);
      if (static_cast<double>(tie) != mid) continue;
      for (float x : {tie, std::nextafter(tie, 0.0f),
                      std::nextafter(tie, std::numeric_limits<float>::max())}) {
        out.push_back(x);
        out.push_back(-x);
      }
    }
    return out;
  }

 private:
  uint32_t inf_bits_;
  std::vector<double> values_;
};

// Every non-NaN float class: random bit patterns (all exponents equally),
// values spread evenly and logarithmically over the fp16 range, and fixed edge
// cases.
std::vector<float> RandomAndEdgeInputs() {
  std::mt19937 rng(20240601);
  std::vector<float> out;
  std::uniform_int_distribution<uint32_t> any_bits;
  while (out.size() < (1u << 20)) {
    const float x = std::bit_cast<float>(any_bits(rng));
    if (!std::isnan(x)) out.push_back(x);
  }
  std::uniform_real_distribution<float> linear(-70000.0f, 70000.0f);
  std::uniform_real_distribution<float> log2_magnitude(-26.0f, 17.0f);
  for (int i = 0; i < (1 << 18); ++i) {
    out.push_back(linear(rng));
    const float x = std::exp2(log2_magnitude(rng));
    out.push_back(i % 2 == 0 ? x : -x);
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::denorm_min(), 65504.0f, 65520.0f,
                  0x1p-24f, 0x1p-25f, 0x1p-14f}) {
    out.push_back(x);
    out.push_back(-x);
  }
  return out;
}

void ExpectMatchesReference(const NarrowFormat& format) {
  const RoundingReference reference(format);
  std::vector<float> inputs = RandomAndEdgeInputs();
  const std::vector<float> ties = reference.TieNeighbourhoods();
  inputs.insert(inputs.end(), ties.begin(), ties.end());
  int failures = 0;
  for (float x : inputs) {
    const uint16_t expected = reference.Round(x);
    const uint16_t actual = format.convert(x);
    if (actual != expected && ++failures <= 10) {
      ADD_FAILURE() << std::hexfloat << x << " (0x" << std::hex
                    << std::bit_cast<uint32_t>(x) << "): expected 0x"
                    << expected << ", got 0x" << actual;
    }
  }
  EXPECT_EQ(failures, 0) << "of " << inputs.size() << " inputs";
}

TEST(RoundingReferenceTest, BFloat16MatchesTheDoubleArithmeticReference) {
  ExpectMatchesReference(kBFloat16);
}

TEST(RoundingReferenceTest, HalfMatchesTheDoubleArithmeticReference) {
  ExpectMatchesReference(kHalf);
}

}  // namespace
}  // namespace depot
