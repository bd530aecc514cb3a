// Adagrad kernels against the double-precision reference
// (optimizer_reference.h states the tolerance and why), and the torch.optim
// details a tolerance could hide: the accumulator's starting value and the lr
// decay's step count.
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "server/optimizer/optimizer_kernel.h"
#include "tests/unit/optimizer_reference.h"

namespace depot {
namespace {

using ::depot::testing::ExpectKernelTracksReference;
using ::depot::testing::VaryingLrSteps;

constexpr double kLr = 0.05;
constexpr double kWeightDecay = 0.1;
constexpr int kSteps = 12;

OptimizerConfig Adagrad(double lr_decay, double initial_accumulator,
                        double eps) {
  OptimizerConfig config;
  config.kind = OptimizerKind::kAdagrad;
  config.adagrad_lr_decay = lr_decay;
  config.adagrad_initial_accumulator_value = initial_accumulator;
  config.adagrad_eps = eps;
  return config;
}

TEST(AdagradKernelTest, TracksReference) {
  ExpectKernelTracksReference(Adagrad(0, 0, 1e-10),
                              VaryingLrSteps(kSteps, kLr, 0.0));
}

TEST(AdagradKernelTest, TracksReferenceWithL2WeightDecay) {
  ExpectKernelTracksReference(Adagrad(0, 0, 1e-10),
                              VaryingLrSteps(kSteps, kLr, kWeightDecay));
}

TEST(AdagradKernelTest, TracksReferenceWithLrDecay) {
  ExpectKernelTracksReference(Adagrad(0.3, 0, 1e-10),
                              VaryingLrSteps(kSteps, kLr, kWeightDecay));
}

TEST(AdagradKernelTest, TracksReferenceWithInitialAccumulatorAndLargeEps) {
  ExpectKernelTracksReference(Adagrad(0.1, 0.25, 1e-3),
                              VaryingLrSteps(kSteps, kLr, kWeightDecay));
}

TEST(AdagradKernelTest, MaximizeTracksReferenceWithL2WeightDecay) {
  OptimizerConfig config = Adagrad(0.1, 0.25, 1e-10);
  config.maximize = true;
  ExpectKernelTracksReference(config,
                              VaryingLrSteps(kSteps, kLr, kWeightDecay));
}

// Values chosen so that every operation is exact in fp32: the test states the
// formula, not a tolerance.
struct AdagradCase {
  std::vector<float> master = {1.0f, -2.0f};
  std::vector<float> state_sum = {0.0f, 0.0f};
};

void RunAdagrad(const OptimizerConfig& config, AdagradCase& state,
                const std::vector<float>& grad,
                const UpdateHyperParams& hparams) {
  MakeOptimizerKernel(config)->Update(
      grad.data(), {state.master.data(), {state.state_sum.data(), nullptr}, 2},
      hparams);
}

TEST(AdagradKernelTest, InitialAccumulatorJoinsTheFirstDenominator) {
  const OptimizerConfig config = Adagrad(0, 3.0, 1e-30);
  AdagradCase state;
  InitOptimizerSlots(
      config, {state.master.data(), {state.state_sum.data(), nullptr}, 2});
  EXPECT_EQ(state.state_sum, (std::vector<float>{3.0f, 3.0f}));
  // sum = 3 + 1 = 4, std = 2: each weight moves by lr * g / 2.
  RunAdagrad(config, state, {1.0f, -1.0f}, {1.0, 0.0, 1});
  EXPECT_EQ(state.state_sum, (std::vector<float>{4.0f, 4.0f}));
  EXPECT_EQ(state.master, (std::vector<float>{0.5f, -1.5f}));
}

TEST(AdagradKernelTest, LrDecayCountsStepsFromOne) {
  // clr = lr / (1 + (step - 1) * lr_decay) = 1 / (1 + 2 * 0.5) = 0.5 at step 3.
  const OptimizerConfig config = Adagrad(0.5, 0, 1e-30);
  AdagradCase state;
  RunAdagrad(config, state, {2.0f, -2.0f}, {1.0, 0.0, 3});
  // sum = 4, std = 2, g / std = +-1.
  EXPECT_EQ(state.master, (std::vector<float>{0.5f, -1.5f}));
}

TEST(AdagradKernelTest, WeightDecayJoinsTheGradientBeforeTheSum) {
  const OptimizerConfig config = Adagrad(0, 0, 1e-30);
  AdagradCase state;
  state.master = {1.0f, 2.0f};
  // g = 0 + 0.5 * p = {0.5, 1}; sum = g^2; g / sqrt(sum) = 1.
  RunAdagrad(config, state, {0.0f, 0.0f}, {0.25, 0.5, 1});
  EXPECT_EQ(state.state_sum, (std::vector<float>{0.25f, 1.0f}));
  EXPECT_EQ(state.master, (std::vector<float>{0.75f, 1.75f}));
}

// torch negates the gradient first, so the decay joins -g: here g = -1 +
// 0.5 * p = {-0.5, 0}; sum = g^2; g / sqrt(sum) = -1 where g is not 0.
// (Negating after the decay would give g = {-1.5, -2}.)
TEST(AdagradKernelTest, MaximizeNegatesTheGradientBeforeTheWeightDecay) {
  OptimizerConfig config = Adagrad(0, 0, 1e-30);
  config.maximize = true;
  AdagradCase state;
  state.master = {1.0f, 2.0f};
  RunAdagrad(config, state, {1.0f, 1.0f}, {0.25, 0.5, 1});
  EXPECT_EQ(state.state_sum, (std::vector<float>{0.25f, 0.0f}));
  EXPECT_EQ(state.master, (std::vector<float>{1.25f, 2.0f}));
}

}  // namespace
}  // namespace depot
