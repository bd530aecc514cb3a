#include "server/gradient_sum.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/tests/test_util.h"

namespace depot {
namespace {

using ::depot::testing::Fp32Payload;

TEST(SumGradientsTest, AddsContributionsLeftToRightInRankOrder) {
  // (1e8 + 1) + -1e8 == 0 in fp32; any other grouping or order gives 1.
  std::vector<std::string> payloads = {
      Fp32Payload({1e8f, 2}), Fp32Payload({1, 3}), Fp32Payload({-1e8f, 4})};
  float sum[2];
  SumGradients(DType::kFloat32, payloads, sum, 2);
  EXPECT_EQ(sum[0], 0.0f);
  EXPECT_EQ(sum[1], 9.0f);
}

TEST(SumGradientsTest, ConvertsFromTheGradientDtype) {
  std::string bf16(2 * sizeof(uint16_t), '\0');
  const float values[2] = {1.5f, -2.0f};
  ConvertFromFloat(values, DType::kBFloat16, bf16.data(), 2);
  float sum[2];
  SumGradients(DType::kBFloat16, {bf16, bf16}, sum, 2);
  EXPECT_EQ(sum[0], 3.0f);
  EXPECT_EQ(sum[1], -4.0f);
}

TEST(SumGradientsTest, SumsAcrossBlockBoundaries) {
  const size_t n = 10000;  // more than one internal block
  std::vector<std::string> payloads = {
      Fp32Payload(std::vector<float>(n, 1.0f)),
      Fp32Payload(std::vector<float>(n, 2.0f))};
  std::vector<float> sum(n);
  SumGradients(DType::kFloat32, payloads, sum.data(), n);
  EXPECT_EQ(sum, std::vector<float>(n, 3.0f));
}

}  // namespace
}  // namespace depot
