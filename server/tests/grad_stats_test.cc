#include "server/grad_stats.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace depot {
namespace {

// Tensor "a" is [0, 5), padding [5, 8), tensor "b" is [8, 14), padding
// [14, 16); the test's chunk covers [0, 16).
Layout TwoTensorLayout() {
  return *Layout::Create({{"a", 5, 0}, {"b", 6, 1}}, /*alignment_elems=*/4);
}

constexpr ChunkRange kWholeRange = {/*index=*/0, /*begin=*/0, /*end=*/16};

TEST(GradStatsTest, PaddingIsExcluded) {
  std::vector<float> grad(16, 0.0f);
  for (int i : {5, 6, 7, 14, 15}) grad[i] = std::nanf("");
  grad[0] = 3.0f;
  grad[9] = -4.0f;
  const GradStats stats =
      ComputeGradStats(TwoTensorLayout(), kWholeRange, grad.data());
  EXPECT_FALSE(stats.non_finite);
  EXPECT_EQ(stats.sum_squares, 25.0);
  EXPECT_EQ(stats.max_abs, 4.0);
  EXPECT_EQ(stats.zero_count, 9u);  // 11 tensor elements, 2 non-zero
}

TEST(GradStatsTest, CountsExactZerosOnly) {
  std::vector<float> grad(16, 1e-30f);
  grad[1] = 0.0f;
  grad[2] = -0.0f;
  const GradStats stats =
      ComputeGradStats(TwoTensorLayout(), kWholeRange, grad.data());
  EXPECT_EQ(stats.zero_count, 2u);
}

TEST(GradStatsTest, SquaresAreSummedInDouble) {
  // In fp32, 1 + (1e-4)^2 * 10 rounds back to 1; in double it does not.
  std::vector<float> grad(16, 1e-4f);
  grad[0] = 1.0f;
  const GradStats stats =
      ComputeGradStats(TwoTensorLayout(), kWholeRange, grad.data());
  const double small = static_cast<double>(1e-4f) * static_cast<double>(1e-4f);
  EXPECT_NEAR(stats.sum_squares, 1.0 + 10 * small, 1e-15);
  EXPECT_GT(stats.sum_squares, 1.0);
}

TEST(GradStatsTest, SumOfSquaresHasOneOrderWhateverTheSegments) {
  // Unaligned tensors of 3, 13 and 7 elements in a chunk [0, 23): element i
  // goes to accumulator i % 8 and the eight are added in order; magnitudes
  // from 1e-9 to 1e3, so the order shows in the last bits (adding the squares
  // in reverse order, for one, gives another value).
  const Layout layout =
      *Layout::Create({{"a", 3, 0}, {"b", 13, 0}, {"c", 7, 1}}, 1);
  std::vector<float> grad(23);
  for (size_t i = 0; i < grad.size(); ++i) {
    grad[i] =
        static_cast<float>(std::pow(10.0, static_cast<double>(i % 13) - 9.0) *
                           (i % 2 == 0 ? 1.0 : -1.5));
  }
  double lanes[8] = {};
  for (size_t i = 0; i < grad.size(); ++i) {
    lanes[i % 8] += static_cast<double>(grad[i]) * grad[i];
  }
  double expected = 0.0;
  for (double lane : lanes) expected += lane;
  const GradStats stats = ComputeGradStats(
      layout, {/*index=*/0, /*begin=*/0, /*end=*/23}, grad.data());
  EXPECT_EQ(stats.sum_squares, expected);
}

TEST(GradStatsTest, InfinityIsNonFiniteAndTheMax) {
  std::vector<float> grad(16, 1.0f);
  grad[3] = -std::numeric_limits<float>::infinity();
  const GradStats stats =
      ComputeGradStats(TwoTensorLayout(), kWholeRange, grad.data());
  EXPECT_TRUE(stats.non_finite);
  EXPECT_TRUE(std::isinf(stats.max_abs));
  EXPECT_TRUE(std::isinf(stats.sum_squares));
}

TEST(GradStatsTest, NanIsNonFiniteAndMakesTheMaxNan) {
  std::vector<float> grad(16, 1.0f);
  grad[10] = std::nanf("");
  const GradStats stats =
      ComputeGradStats(TwoTensorLayout(), kWholeRange, grad.data());
  EXPECT_TRUE(stats.non_finite);
  EXPECT_TRUE(std::isnan(stats.max_abs));
  EXPECT_TRUE(std::isnan(stats.sum_squares));
}

TEST(GradStatsTest, AccumulateAddsAndKeepsNan) {
  GradStats total;
  AccumulateGradStats({4.0, 2.0, false, 3}, total);
  AccumulateGradStats({1.0, 5.0, false, 1}, total);
  EXPECT_EQ(total.sum_squares, 5.0);
  EXPECT_EQ(total.max_abs, 5.0);
  EXPECT_EQ(total.zero_count, 4u);
  EXPECT_FALSE(total.non_finite);
  AccumulateGradStats({1.0, std::nan(""), true, 0}, total);
  AccumulateGradStats({1.0, 7.0, false, 0}, total);
  EXPECT_TRUE(total.non_finite);
  EXPECT_TRUE(std::isnan(total.max_abs));
}

}  // namespace
}  // namespace depot
