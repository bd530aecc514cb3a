#include "server/step_numerics.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace depot {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(StepNumericsTest, DefaultsAreValid) {
  EXPECT_TRUE(ValidateStepNumerics(StepNumerics()).ok());
}

TEST(StepNumericsTest, LossScaleMustBeFiniteAndPositive) {
  for (double scale : {0.0, -1.0, kInf, std::nan("")}) {
    StepNumerics numerics;
    numerics.loss_scale = scale;
    absl::Status s = ValidateStepNumerics(numerics);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << scale;
    EXPECT_NE(s.message().find("loss_scale"), std::string::npos) << s;
  }
}

TEST(StepNumericsTest, ClipCoefMustBeInZeroToOne) {
  for (double coef : {0.0, -0.5, 1.5, kInf, std::nan("")}) {
    absl::Status s = ValidateCommitDecision({coef, false});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << coef;
  }
  EXPECT_TRUE(ValidateCommitDecision({1.0, false}).ok());
  EXPECT_TRUE(ValidateCommitDecision({1e-30, false}).ok());
}

TEST(StepNumericsTest, SkippedCommitIgnoresItsCoefficient) {
  EXPECT_TRUE(ValidateCommitDecision({0.0, true}).ok());
  EXPECT_TRUE(SameCommitDecision({0.0, true}, {1.0, true}));
  EXPECT_FALSE(SameCommitDecision({0.5, false}, {0.5, true}));
  EXPECT_FALSE(SameCommitDecision({0.5, false}, {0.25, false}));
}

TEST(StepNumericsTest, TwoPhaseStepIgnoresTheHeaderCommit) {
  StepNumerics a;
  a.two_phase = true;
  a.commit = {0.0, false};  // would be invalid in one phase
  EXPECT_TRUE(ValidateStepNumerics(a).ok());
  StepNumerics b = a;
  b.commit = {0.5, false};
  EXPECT_TRUE(SameStepNumerics(a, b));
  b.loss_scale = 2.0;
  EXPECT_FALSE(SameStepNumerics(a, b));
}

TEST(StepNumericsTest, UnscaleFactorIsTheReciprocalRoundedOnceToFloat) {
  EXPECT_EQ(UnscaleFactor(1024.0), 1.0f / 1024.0f);
  // 1/3 rounded once from double; float(1) / float(3) happens to agree, but
  // 1 / float(0.1) does not equal float(1 / 0.1).
  EXPECT_EQ(UnscaleFactor(0.1), static_cast<float>(1.0 / 0.1));
  EXPECT_EQ(UnscaleFactor(65536.0), 1.52587890625e-05f);
}

}  // namespace
}  // namespace depot
