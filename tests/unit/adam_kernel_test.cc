// Adam and AdamW kernels, with torch's amsgrad and maximize flags, against
// the double-precision reference (optimizer_reference.h states the tolerance
// and why), and the flags' defining properties, exactly.
#include <cmath>
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

OptimizerConfig WithFlags(OptimizerConfig config, bool amsgrad, bool maximize) {
  config.amsgrad = amsgrad;
  config.maximize = maximize;
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

TEST(AdamWKernelTest, AmsgradTracksReferenceWithWeightDecay) {
  ExpectKernelTracksReference(
      WithFlags(Adam(OptimizerKind::kAdamW), /*amsgrad=*/true, false),
      VaryingLrSteps(kSteps, kLr, kWeightDecay));
}

TEST(AdamWKernelTest, AmsgradTracksReferenceWithFastSecondMoment) {
  // beta2 0.9: exp_avg_sq falls below its maximum at many elements.
  OptimizerConfig config =
      WithFlags(Adam(OptimizerKind::kAdamW), /*amsgrad=*/true, false);
  config.adam_beta2 = 0.9;
  ExpectKernelTracksReference(config, VaryingLrSteps(kSteps, kLr, 0.0));
}

TEST(AdamKernelTest, AmsgradTracksReferenceWithL2WeightDecay) {
  ExpectKernelTracksReference(
      WithFlags(Adam(OptimizerKind::kAdam), /*amsgrad=*/true, false),
      VaryingLrSteps(kSteps, kLr, kWeightDecay));
}

TEST(AdamWKernelTest, MaximizeTracksReferenceWithWeightDecay) {
  ExpectKernelTracksReference(
      WithFlags(Adam(OptimizerKind::kAdamW), false, /*maximize=*/true),
      VaryingLrSteps(kSteps, kLr, kWeightDecay));
}

// The gradient is negated before the L2 decay joins it.
TEST(AdamKernelTest, MaximizeTracksReferenceWithL2WeightDecay) {
  ExpectKernelTracksReference(
      WithFlags(Adam(OptimizerKind::kAdam), false, /*maximize=*/true),
      VaryingLrSteps(kSteps, kLr, kWeightDecay));
}

TEST(AdamKernelTest, AmsgradAndMaximizeTrackReference) {
  OptimizerConfig config = WithFlags(Adam(OptimizerKind::kAdam), true, true);
  config.adam_beta2 = 0.9;
  ExpectKernelTracksReference(config,
                              VaryingLrSteps(kSteps, kLr, kWeightDecay));
}

// With betas 0.5 and 0.75, lr 0.25 and step 1, the step size is 0.5 and
// sqrt(1 - beta2) is 0.5, exactly. A zero gradient makes exp_avg 0.5 and
// exp_avg_sq 0.75 * 4 = 3. Where the kept maximum is 16, the denominator is
// sqrt(16) / 0.5 = 8 (eps vanishes in the rounding) and the weight moves by
// 0.5 * 0.5 / 8 = 1/32; where it is 1, the maximum becomes 3 and the step is
// the plain Adam step, bit for bit.
TEST(AdamKernelTest, AmsgradDividesByTheLargestSecondMomentSoFar) {
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
    OptimizerConfig config = Adam(kind);
    config.adam_beta1 = 0.5;
    config.adam_beta2 = 0.75;
    const UpdateHyperParams hparams{0.25, 0.0, 1};
    const std::vector<float> grad = {0.0f, 0.0f};
    std::vector<float> master = {1.0f, 1.0f};
    std::vector<float> exp_avg = {1.0f, 1.0f};
    std::vector<float> exp_avg_sq = {4.0f, 4.0f};
    std::vector<float> max_exp_avg_sq = {16.0f, 1.0f};
    std::vector<float> plain_master = master;
    std::vector<float> plain_exp_avg = exp_avg;
    std::vector<float> plain_exp_avg_sq = exp_avg_sq;
    MakeOptimizerKernel(WithFlags(config, /*amsgrad=*/true, false))
        ->Update(grad.data(),
                 {master.data(),
                  {exp_avg.data(), exp_avg_sq.data(), max_exp_avg_sq.data()},
                  2},
                 hparams);
    MakeOptimizerKernel(config)->Update(
        grad.data(),
        {plain_master.data(),
         {plain_exp_avg.data(), plain_exp_avg_sq.data()},
         2},
        hparams);
    EXPECT_EQ(master[0], 1.0f - 1.0f / 32);
    EXPECT_EQ(max_exp_avg_sq, (std::vector<float>{16.0f, 3.0f}));
    EXPECT_EQ(master[1], plain_master[1]);
    EXPECT_NE(master[0], plain_master[0]);
    // The moments are Adam's either way.
    EXPECT_EQ(exp_avg, plain_exp_avg);
    EXPECT_EQ(exp_avg_sq, plain_exp_avg_sq);
  }
}

// torch.maximum propagates NaN from either side, so a NaN second moment is
// never hidden behind a finite maximum, nor the other way round.
TEST(AdamKernelTest, AmsgradMaximumOfNaNIsNaN) {
  const float nan = std::nanf("");
  const std::vector<float> grad = {0.5f, 0.5f};
  std::vector<float> master = {1.0f, 1.0f};
  std::vector<float> exp_avg = {0.0f, 0.0f};
  std::vector<float> exp_avg_sq = {nan, 0.25f};  // v is NaN / finite
  std::vector<float> max_exp_avg_sq = {1.0f, nan};
  MakeOptimizerKernel(
      WithFlags(Adam(OptimizerKind::kAdamW), /*amsgrad=*/true, false))
      ->Update(grad.data(),
               {master.data(),
                {exp_avg.data(), exp_avg_sq.data(), max_exp_avg_sq.data()},
                2},
               {1e-2, 0.0, 3});
  EXPECT_TRUE(std::isnan(max_exp_avg_sq[0]));
  EXPECT_TRUE(std::isnan(max_exp_avg_sq[1]));
  EXPECT_TRUE(std::isnan(master[0]));
  EXPECT_TRUE(std::isnan(master[1]));
}

// With bias correction, the first step's m_hat / sqrt(v_hat) is g / |g|, so
// every weight moves by lr against its gradient's sign (eps aside); without it,
// the move would be lr * (1 - b1) / sqrt(1 - b2), about 3.2 lr. With maximize
// every weight moves by lr along its gradient's sign, and the first moment
// follows the negated gradient.
TEST(AdamKernelTest, FirstStepMovesEveryWeightByLr) {
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
    for (bool maximize : {false, true}) {
      const float lr = 1e-2f;
      const float descent = maximize ? -lr : lr;
      std::vector<float> master = {1.0f, -2.0f, 0.5f};
      const std::vector<float> grad = {0.3f, -1e-3f, -7.0f};
      std::vector<float> exp_avg(3, 0.0f);
      std::vector<float> exp_avg_sq(3, 0.0f);
      MakeOptimizerKernel(WithFlags(Adam(kind), false, maximize))
          ->Update(grad.data(),
                   {master.data(), {exp_avg.data(), exp_avg_sq.data()}, 3},
                   {lr, 0.0, 1});
      EXPECT_NEAR(master[0], 1.0f - descent, 1e-6f);
      EXPECT_NEAR(master[1], -2.0f + descent, 1e-5f);  // eps: 1e-5 of this |g|
      EXPECT_NEAR(master[2], 0.5f + descent, 1e-6f);
      EXPECT_EQ(exp_avg[0] > 0, !maximize);
    }
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
