// Adam and AdamW kernels against the double-precision reference
// (optimizer_reference.h states the tolerance and why).
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "server/optimizer/optimizer_kernel.h"
#include "tests/unit/optimizer_reference.h"

namespace depot {
namespace {

using ::depot::testing::ExpectKernelTracksReference;
using ::depot::testing::VaryingLrSteps;

// lr and weight decay large enough that every term of the update (decay order,
// L2 versus decoupled decay, bias correction) moves the weights by much more
// than the tolerance.
constexpr double kLr = 0.05;
constexpr double kWeightDecay = 0.1;
constexpr int kSteps = 12;

OptimizerConfig Adam(OptimizerKind kind) {
  OptimizerConfig config;
  config.kind = kind;
  return config;
}

TEST(AdamWKernelTest, TracksReferenceWithWeightDecay) {
  ExpectKernelTracksReference(Adam(OptimizerKind::kAdamW),
                              VaryingLrSteps(kSteps, kLr, kWeightDecay));
}

TEST(AdamWKernelTest, TracksReferenceWithoutWeightDecay) {
  ExpectKernelTracksReference(Adam(OptimizerKind::kAdamW),
                              VaryingLrSteps(kSteps, kLr, 0.0));
}

TEST(AdamWKernelTest, TracksReferenceWithOtherBetasAndEps) {
  OptimizerConfig config = Adam(OptimizerKind::kAdamW);
  config.adam_beta1 = 0.5;
  config.adam_beta2 = 0.95;
  config.adam_eps = 1e-3;
  ExpectKernelTracksReference(config,
                              VaryingLrSteps(kSteps, kLr, kWeightDecay));
}

TEST(AdamKernelTest, TracksReferenceWithL2WeightDecay) {
  ExpectKernelTracksReference(Adam(OptimizerKind::kAdam),
                              VaryingLrSteps(kSteps, kLr, kWeightDecay));
}

TEST(AdamKernelTest, TracksReferenceWithoutWeightDecay) {
  ExpectKernelTracksReference(Adam(OptimizerKind::kAdam),
                              VaryingLrSteps(kSteps, kLr, 0.0));
}

// With bias correction, the first step's m_hat / sqrt(v_hat) is g / |g|, so
// every weight moves by lr against its gradient's sign (eps aside); without it,
// the move would be lr * (1 - b1) / sqrt(1 - b2), about 3.2 lr.
TEST(AdamKernelTest, FirstStepMovesEveryWeightByLr) {
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
    const float lr = 1e-2f;
    std::vector<float> master = {1.0f, -2.0f, 0.5f};
    const std::vector<float> grad = {0.3f, -1e-3f, -7.0f};
    std::vector<float> exp_avg(3, 0.0f);
    std::vector<float> exp_avg_sq(3, 0.0f);
    MakeOptimizerKernel(Adam(kind))
        ->Update(grad.data(),
                 {master.data(), {exp_avg.data(), exp_avg_sq.data()}, 3},
                 {lr, 0.0, 1});
    EXPECT_NEAR(master[0], 1.0f - lr, 1e-6f);
    EXPECT_NEAR(master[1], -2.0f + lr, 1e-5f);  // eps is 1e-5 of this |g|
    EXPECT_NEAR(master[2], 0.5f + lr, 1e-6f);
  }
}

// With a zero gradient the moments stay zero and the Adam term is 0 / eps, so
// AdamW's decoupled decay is all that happens, exactly.
TEST(AdamWKernelTest, ZeroGradientOnlyDecaysTheWeights) {
  const double lr = 0.1;
  const double weight_decay = 0.2;
  std::vector<float> master = {1.0f, -3.0f};
  const std::vector<float> grad = {0.0f, 0.0f};
  std::vector<float> exp_avg(2, 0.0f);
  std::vector<float> exp_avg_sq(2, 0.0f);
  MakeOptimizerKernel(Adam(OptimizerKind::kAdamW))
      ->Update(grad.data(),
               {master.data(), {exp_avg.data(), exp_avg_sq.data()}, 2},
               {lr, weight_decay, 1});
  const float decay = static_cast<float>(1 - lr * weight_decay);
  EXPECT_EQ(master[0], 1.0f * decay);
  EXPECT_EQ(master[1], -3.0f * decay);
  EXPECT_EQ(exp_avg[0], 0.0f);
  EXPECT_EQ(exp_avg_sq[1], 0.0f);
}

}  // namespace
}  // namespace depot
