// Lion kernels against the double-precision reference written from the
// paper's formula (optimizer_reference.h states the tolerance and how it
// treats sign(c) near zero), and the update's defining properties, exactly.
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "server/optimizer/optimizer_kernel.h"
#include "tests/unit/optimizer_reference.h"

namespace depot {
namespace {

using ::depot::testing::ExpectKernelTracksReference;
using ::depot::testing::VaryingLrSteps;

constexpr double kLr = 0.01;
constexpr double kWeightDecay = 0.5;
constexpr int kSteps = 12;

OptimizerConfig Lion(double beta1, double beta2) {
  OptimizerConfig config;
  config.kind = OptimizerKind::kLion;
  config.lion_beta1 = beta1;
  config.lion_beta2 = beta2;
  return config;
}

TEST(LionKernelTest, TracksReference) {
  ExpectKernelTracksReference(Lion(0.9, 0.99),
                              VaryingLrSteps(kSteps, kLr, 0.0));
}

TEST(LionKernelTest, TracksReferenceWithWeightDecay) {
  ExpectKernelTracksReference(Lion(0.9, 0.99),
                              VaryingLrSteps(kSteps, kLr, kWeightDecay));
}

TEST(LionKernelTest, TracksReferenceWithOtherBetas) {
  ExpectKernelTracksReference(Lion(0.5, 0.8),
                              VaryingLrSteps(kSteps, kLr, kWeightDecay));
}

// Weights {1, 1, 1, 1} and exp_avg m = {1, -1, 0, 1}, updated with lr 0.125,
// betas 0.75 and 0.5, from the gradient {-2, 2, -0.5, -3}.
struct LionCase {
  std::vector<float> master = {1.0f, 1.0f, 1.0f, 1.0f};
  std::vector<float> exp_avg = {1.0f, -1.0f, 0.0f, 1.0f};

  explicit LionCase(bool maximize) {
    OptimizerConfig config = Lion(0.75, 0.5);
    config.maximize = maximize;
    const std::vector<float> grad = {-2.0f, 2.0f, -0.5f, -3.0f};
    MakeOptimizerKernel(config)->Update(
        grad.data(), {master.data(), {exp_avg.data(), nullptr}, 4},
        {0.125, 0.0, 7});
  }
};

// Each weight moves by exactly lr against sign(b1 * m + (1 - b1) * g), which
// here is the sign of m for the first two (the gradient disagrees but is
// outweighed) and of g for the third; a zero c leaves the weight alone.
TEST(LionKernelTest, MovesEachWeightByLrAgainstTheInterpolationsSign) {
  const LionCase state(/*maximize=*/false);
  // c = 0.75 m + 0.25 g = {0.25, -0.25, -0.125, 0}.
  EXPECT_EQ(state.master, (std::vector<float>{0.875f, 1.125f, 1.125f, 1.0f}));
  // m = 0.5 m + 0.5 g, with beta2, not beta1.
  EXPECT_EQ(state.exp_avg, (std::vector<float>{-0.5f, 0.5f, -0.25f, -1.0f}));
}

TEST(LionKernelTest, MaximizeTracksReferenceWithWeightDecay) {
  OptimizerConfig config = Lion(0.9, 0.99);
  config.maximize = true;
  ExpectKernelTracksReference(config,
                              VaryingLrSteps(kSteps, kLr, kWeightDecay));
}

// Depot's maximize for Lion means what torch's means for its optimizers: the
// update of the negated gradient. The case above with maximize: c = 0.75 m -
// 0.25 g = {1.25, -1.25, 0.125, 1.5}, and m = 0.5 m - 0.5 g.
TEST(LionKernelTest, MaximizeUsesTheNegatedGradientInBothInterpolations) {
  const LionCase state(/*maximize=*/true);
  EXPECT_EQ(state.master, (std::vector<float>{0.875f, 1.125f, 0.875f, 0.875f}));
  EXPECT_EQ(state.exp_avg, (std::vector<float>{1.5f, -1.5f, 0.25f, 2.0f}));
}

TEST(LionKernelTest, DecaysTheWeightBeforeTheSignStep) {
  const OptimizerConfig config = Lion(0.9, 0.99);
  std::vector<float> master = {2.0f, -4.0f};
  std::vector<float> exp_avg = {0.0f, 0.0f};
  const std::vector<float> grad = {1.0f, 1.0f};
  // (1 - lr * wd) = 0.5: p = p * 0.5 - 0.25.
  MakeOptimizerKernel(config)->Update(
      grad.data(), {master.data(), {exp_avg.data(), nullptr}, 2},
      {0.25, 2.0, 1});
  EXPECT_EQ(master, (std::vector<float>{0.75f, -2.25f}));
}

}  // namespace
}  // namespace depot
