// SGD kernels against the double-precision reference (optimizer_reference.h
// states the tolerance and why).
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

OptimizerConfig Sgd(double momentum, double dampening, bool nesterov) {
  OptimizerConfig config;
  config.kind = OptimizerKind::kSgd;
  config.sgd_momentum = momentum;
  config.sgd_dampening = dampening;
  config.sgd_nesterov = nesterov;
  return config;
}

TEST(SgdKernelTest, PlainTracksReference) {
  ExpectKernelTracksReference(Sgd(0, 0, false),
                              VaryingLrSteps(kSteps, kLr, 0.0));
}

TEST(SgdKernelTest, PlainWithWeightDecayTracksReference) {
  ExpectKernelTracksReference(Sgd(0, 0, false),
                              VaryingLrSteps(kSteps, kLr, kWeightDecay));
}

TEST(SgdKernelTest, MomentumTracksReference) {
  ExpectKernelTracksReference(Sgd(0.9, 0, false),
                              VaryingLrSteps(kSteps, kLr, 0.0));
}

TEST(SgdKernelTest, MomentumWithDampeningTracksReference) {
  ExpectKernelTracksReference(Sgd(0.9, 0.3, false),
                              VaryingLrSteps(kSteps, kLr, 0.0));
}

TEST(SgdKernelTest, NesterovTracksReference) {
  ExpectKernelTracksReference(Sgd(0.8, 0, true),
                              VaryingLrSteps(kSteps, kLr, 0.0));
}

TEST(SgdKernelTest, NesterovWithWeightDecayTracksReference) {
  ExpectKernelTracksReference(Sgd(0.8, 0, true),
                              VaryingLrSteps(kSteps, kLr, kWeightDecay));
}

TEST(SgdKernelTest, MomentumWithDampeningAndWeightDecayTracksReference) {
  ExpectKernelTracksReference(Sgd(0.5, 0.5, false),
                              VaryingLrSteps(kSteps, kLr, kWeightDecay));
}

TEST(SgdKernelTest,
     MaximizeWithMomentumDampeningAndWeightDecayTracksReference) {
  OptimizerConfig config = Sgd(0.5, 0.5, false);
  config.maximize = true;
  ExpectKernelTracksReference(config,
                              VaryingLrSteps(kSteps, kLr, kWeightDecay));
}

TEST(SgdKernelTest, MaximizeNesterovWithWeightDecayTracksReference) {
  OptimizerConfig config = Sgd(0.8, 0, true);
  config.maximize = true;
  ExpectKernelTracksReference(config,
                              VaryingLrSteps(kSteps, kLr, kWeightDecay));
}

// torch negates the gradient before the weight decay joins it: d = -0.5 +
// 0.5 * 1 = 0 leaves the weight alone. (Without maximize d = 1, and with the
// negation after the decay d = -1.)
TEST(SgdKernelTest, MaximizeNegatesTheGradientBeforeTheWeightDecay) {
  OptimizerConfig config = Sgd(0, 0, false);
  config.maximize = true;
  std::vector<float> master = {1.0f, 1.0f};
  const std::vector<float> grad = {0.5f, -0.5f};
  MakeOptimizerKernel(config)->Update(grad.data(), {master.data(), {}, 2},
                                      {0.5, 0.5, 1});
  // Second weight: d = 0.5 + 0.5 = 1, p = 1 - 0.5.
  EXPECT_EQ(master, (std::vector<float>{1.0f, 0.5f}));
}

// torch.optim.SGD starts the buffer as a copy of the gradient, without
// dampening: a stored buffer from before step 1 is ignored.
TEST(SgdKernelTest, FirstStepCopiesTheGradientIntoTheBuffer) {
  std::vector<float> master = {1.0f, 2.0f};
  const std::vector<float> grad = {0.25f, -0.5f};
  std::vector<float> buffer = {123.0f, -7.0f};
  MakeOptimizerKernel(Sgd(0.9, 0.5, false))
      ->Update(grad.data(), {master.data(), {buffer.data(), nullptr}, 2},
               {0.5, 0.0, 1});
  EXPECT_EQ(buffer, grad);
  EXPECT_EQ(master[0], 1.0f - 0.5f * 0.25f);
  EXPECT_EQ(master[1], 2.0f + 0.5f * 0.5f);
}

TEST(SgdKernelTest, WithoutMomentumNeedsNoStateArrays) {
  std::vector<float> master = {1.0f};
  const std::vector<float> grad = {0.5f};
  MakeOptimizerKernel(Sgd(0, 0, false))
      ->Update(grad.data(), {master.data(), {nullptr, nullptr}, 1},
               {0.5, 0.0, 3});
  EXPECT_EQ(master[0], 0.75f);
}

}  // namespace
}  // namespace depot
