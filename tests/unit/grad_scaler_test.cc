#include "depot/grad_scaler.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "tests/unit/grad_scaler_golden.h"

namespace depot {
namespace {

// The scale is fp32 and every update is one IEEE fp32 multiplication (or a
// max), as in Megatron's fp32 tensor, so the golden scales are compared
// exactly.

DynamicGradScaler CreateOrDie(const golden::ScalerSequence& sequence) {
  absl::StatusOr<DynamicGradScaler> scaler =
      DynamicGradScaler::Create({.initial_scale = sequence.initial_scale,
                                 .min_scale = sequence.min_scale,
                                 .growth_factor = sequence.growth_factor,
                                 .backoff_factor = sequence.backoff_factor,
                                 .growth_interval = sequence.growth_interval,
                                 .hysteresis = sequence.hysteresis});
  EXPECT_TRUE(scaler.ok()) << scaler.status();
  return *std::move(scaler);
}

// Applies golden runs [begin, end) of `sequence` to `scaler`, checking the
// state after each.
void ApplyRuns(const golden::ScalerSequence& sequence, size_t begin, size_t end,
               DynamicGradScaler& scaler) {
  for (size_t i = begin; i < end; ++i) {
    const golden::ScalerRun& run = sequence.runs[i];
    for (int r = 0; r < run.repeat; ++r) scaler.Update(run.found_inf);
    SCOPED_TRACE(testing::Message() << "after run " << i);
    EXPECT_EQ(scaler.scale(), run.scale);
    EXPECT_EQ(scaler.growth_tracker(), run.growth_tracker);
    EXPECT_EQ(scaler.hysteresis_tracker(), run.hysteresis_tracker);
  }
}

class GoldenScalerTest : public testing::TestWithParam<golden::ScalerSequence> {
};

TEST_P(GoldenScalerTest, MatchesMegatronAfterEveryRun) {
  DynamicGradScaler scaler = CreateOrDie(GetParam());
  ApplyRuns(GetParam(), 0, GetParam().runs.size(), scaler);
}

TEST_P(GoldenScalerTest, ResumesFromItsStateHalfWay) {
  const golden::ScalerSequence& sequence = GetParam();
  const size_t half = sequence.runs.size() / 2;
  DynamicGradScaler first = CreateOrDie(sequence);
  ApplyRuns(sequence, 0, half, first);

  DynamicGradScaler resumed = CreateOrDie(sequence);
  ASSERT_TRUE(resumed.LoadStateDict(first.StateDict()).ok());
  ApplyRuns(sequence, half, sequence.runs.size(), resumed);
}

INSTANTIATE_TEST_SUITE_P(
    Megatron, GoldenScalerTest, testing::ValuesIn(golden::ScalerSequences()),
    [](const testing::TestParamInfo<golden::ScalerSequence>& info) {
      return std::string(info.param.name);
    });

// ---- DynamicGradScaler ------------------------------------------------------

TEST(DynamicGradScalerTest, DefaultsAreMegatrons) {
  const DynamicGradScalerOptions defaults;
  EXPECT_EQ(defaults.initial_scale, 4294967296.0);
  EXPECT_EQ(defaults.min_scale, 1.0);
  EXPECT_EQ(defaults.growth_factor, 2.0);
  EXPECT_EQ(defaults.backoff_factor, 0.5);
  EXPECT_EQ(defaults.growth_interval, 1000);
  EXPECT_EQ(defaults.hysteresis, 2);

  absl::StatusOr<DynamicGradScaler> scaler = DynamicGradScaler::Create({});
  ASSERT_TRUE(scaler.ok());
  EXPECT_EQ(scaler->scale(), 4294967296.0f);
  EXPECT_EQ(scaler->growth_tracker(), 0);
  EXPECT_EQ(scaler->hysteresis_tracker(), 2);
}

TEST(DynamicGradScalerTest, InvScaleIsTheDoubleReciprocalRoundedToFloat) {
  absl::StatusOr<DynamicGradScaler> scaler =
      DynamicGradScaler::Create({.initial_scale = 1000.1});
  ASSERT_TRUE(scaler.ok());
  EXPECT_EQ(scaler->inv_scale(),
            static_cast<float>(1.0 / static_cast<double>(1000.1f)));
  EXPECT_EQ(DynamicGradScaler::Create({})->inv_scale(), 0x1p-32f);
}

// Applies `mutate` to the defaults and expects INVALID_ARGUMENT naming `field`.
void ExpectOptionsRejected(
    const std::function<void(DynamicGradScalerOptions&)>& mutate,
    const std::string& field) {
  DynamicGradScalerOptions options;
  mutate(options);
  const absl::Status status = DynamicGradScaler::Create(options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
  EXPECT_EQ(status.message().substr(0, field.size() + 1), field + ":")
      << status.message();
}

using DynamicOptions = DynamicGradScalerOptions;

TEST(DynamicGradScalerTest, RejectsScalesThatAreNotPositiveFiniteFloats) {
  ExpectOptionsRejected([](DynamicOptions& o) { o.initial_scale = 0; },
                        "initial_scale");
  ExpectOptionsRejected([](DynamicOptions& o) { o.initial_scale = 1e39; },
                        "initial_scale");
  ExpectOptionsRejected([](DynamicOptions& o) { o.min_scale = 1e-50; },
                        "min_scale");
  ExpectOptionsRejected(
      [](DynamicOptions& o) {
        o.min_scale = std::numeric_limits<double>::quiet_NaN();
      },
      "min_scale");
}

TEST(DynamicGradScalerTest, RejectsMinScaleAboveInitialScale) {
  ExpectOptionsRejected([](DynamicOptions& o) { o.min_scale = 0x1p33; },
                        "min_scale");
}

TEST(DynamicGradScalerTest, RejectsFactorsThatDoNotGrowOrShrink) {
  ExpectOptionsRejected([](DynamicOptions& o) { o.growth_factor = 1.0; },
                        "growth_factor");
  ExpectOptionsRejected([](DynamicOptions& o) { o.backoff_factor = 1.0; },
                        "backoff_factor");
  ExpectOptionsRejected([](DynamicOptions& o) { o.backoff_factor = 0.0; },
                        "backoff_factor");
}

TEST(DynamicGradScalerTest, RejectsAnIntervalOrHysteresisBelowOne) {
  ExpectOptionsRejected([](DynamicOptions& o) { o.growth_interval = 0; },
                        "growth_interval");
  ExpectOptionsRejected([](DynamicOptions& o) { o.hysteresis = 0; },
                        "hysteresis");
}

TEST(DynamicGradScalerTest, LoadRejectsStateThatDoesNotFitUnchanged) {
  absl::StatusOr<DynamicGradScaler> scaler = DynamicGradScaler::Create({});
  ASSERT_TRUE(scaler.ok());
  scaler->Update(true);
  const GradScalerState before = scaler->StateDict();
  for (const auto& [state, field] :
       {std::pair<GradScalerState, std::string>{{0.0f, 0, 1}, "scale"},
        {{std::numeric_limits<float>::infinity(), 0, 1}, "scale"},
        {{1024.0f, 1000, 1}, "growth_tracker"},
        {{1024.0f, -1, 1}, "growth_tracker"},
        {{1024.0f, 0, 3}, "hysteresis_tracker"}}) {
    const absl::Status status = scaler->LoadStateDict(state);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_EQ(status.message().substr(0, field.size() + 1), field + ":")
        << status.message();
  }
  EXPECT_EQ(scaler->scale(), before.scale);
  EXPECT_EQ(scaler->growth_tracker(), before.growth_tracker);
  EXPECT_EQ(scaler->hysteresis_tracker(), before.hysteresis_tracker);
}

TEST(DynamicGradScalerTest, LoadAcceptsAnExhaustedHysteresisTracker) {
  absl::StatusOr<DynamicGradScaler> scaler = DynamicGradScaler::Create({});
  ASSERT_TRUE(scaler.ok());
  ASSERT_TRUE(scaler->LoadStateDict({1024.0f, 7, -5}).ok());
  scaler->Update(true);
  EXPECT_EQ(scaler->scale(), 512.0f);
  EXPECT_EQ(scaler->hysteresis_tracker(), -6);
}

// ---- ConstantGradScaler
// -------------------------------------------------------

TEST(ConstantGradScalerTest, NeverChangesItsScale) {
  absl::StatusOr<ConstantGradScaler> scaler = ConstantGradScaler::Create(128.0);
  ASSERT_TRUE(scaler.ok());
  for (bool found_inf : {true, true, true, false, false}) {
    scaler->Update(found_inf);
  }
  EXPECT_EQ(scaler->scale(), 128.0f);
  EXPECT_EQ(scaler->inv_scale(), 1.0f / 128);
}

TEST(ConstantGradScalerTest, ItsScaleIsConfigurationNotState) {
  absl::StatusOr<ConstantGradScaler> scaler = ConstantGradScaler::Create(128.0);
  ASSERT_TRUE(scaler.ok());
  EXPECT_EQ(scaler->StateDict().scale, 128.0f);
  EXPECT_TRUE(scaler->LoadStateDict({4.0f, 0, 0}).ok());
  EXPECT_EQ(scaler->scale(), 128.0f);
}

TEST(ConstantGradScalerTest, RejectsANonPositiveScale) {
  for (double scale : {0.0, -1.0, std::numeric_limits<double>::infinity()}) {
    const absl::Status status = ConstantGradScaler::Create(scale).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << scale;
    EXPECT_EQ(status.message().substr(0, 6), "scale:") << status.message();
  }
}

// ---- MakeGradScaler
// ------------------------------------------------------------

JobConfig ConfigWith(DType grad_dtype) {
  JobConfig config;
  config.grad_dtype = grad_dtype;
  return config;
}

TEST(MakeGradScalerTest, PositiveLossScaleGivesAConstantScaler) {
  JobConfig config = ConfigWith(DType::kFloat16);
  config.optimizer.loss_scale = 1024.0;
  absl::StatusOr<std::unique_ptr<GradScaler>> scaler = MakeGradScaler(config);
  ASSERT_TRUE(scaler.ok()) << scaler.status();
  EXPECT_NE(dynamic_cast<ConstantGradScaler*>(scaler->get()), nullptr);
  EXPECT_EQ((*scaler)->scale(), 1024.0f);
}

TEST(MakeGradScalerTest, Fp16GradientsGetADynamicScalerFromTheConfig) {
  JobConfig config = ConfigWith(DType::kFloat16);
  config.optimizer.initial_loss_scale = 65536.0;
  config.optimizer.min_loss_scale = 4.0;
  config.optimizer.loss_scale_window = 200;
  config.optimizer.hysteresis = 3;
  absl::StatusOr<std::unique_ptr<GradScaler>> scaler = MakeGradScaler(config);
  ASSERT_TRUE(scaler.ok()) << scaler.status();
  const auto* dynamic = dynamic_cast<DynamicGradScaler*>(scaler->get());
  ASSERT_NE(dynamic, nullptr);
  EXPECT_EQ(dynamic->scale(), 65536.0f);
  EXPECT_EQ(dynamic->options().min_scale, 4.0);
  EXPECT_EQ(dynamic->options().growth_interval, 200);
  EXPECT_EQ(dynamic->options().hysteresis, 3);
  EXPECT_EQ(dynamic->options().growth_factor, 2.0);
  EXPECT_EQ(dynamic->options().backoff_factor, 0.5);
}

TEST(MakeGradScalerTest, Fp16WithConfigDefaultsStartsAtTwoToThe32) {
  absl::StatusOr<std::unique_ptr<GradScaler>> scaler =
      MakeGradScaler(ConfigWith(DType::kFloat16));
  ASSERT_TRUE(scaler.ok()) << scaler.status();
  EXPECT_EQ((*scaler)->scale(), 0x1p32f);
}

TEST(MakeGradScalerTest, OtherGradientsGetAScaleOfOne) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    absl::StatusOr<std::unique_ptr<GradScaler>> scaler =
        MakeGradScaler(ConfigWith(dtype));
    ASSERT_TRUE(scaler.ok()) << scaler.status();
    EXPECT_NE(dynamic_cast<ConstantGradScaler*>(scaler->get()), nullptr);
    EXPECT_EQ((*scaler)->scale(), 1.0f);
  }
}

// Applies `mutate` to an fp16 job's config and expects INVALID_ARGUMENT naming
// `field`.
void ExpectConfigRejected(const std::function<void(OptimizerConfig&)>& mutate,
                          const std::string& field) {
  JobConfig config = ConfigWith(DType::kFloat16);
  mutate(config.optimizer);
  const absl::Status status = MakeGradScaler(config).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
  EXPECT_EQ(status.message().substr(0, field.size() + 1), field + ":")
      << status.message();
}

TEST(MakeGradScalerTest, RejectsInvalidFieldsNamingTheConfigField) {
  ExpectConfigRejected([](OptimizerConfig& o) { o.loss_scale = -2.0; },
                       "optimizer.loss_scale");
  ExpectConfigRejected(
      [](OptimizerConfig& o) { o.loss_scale_window = 0.5e3 + 0.5; },
      "optimizer.loss_scale_window");
  ExpectConfigRejected([](OptimizerConfig& o) { o.loss_scale_window = 0; },
                       "optimizer.loss_scale_window");
  ExpectConfigRejected([](OptimizerConfig& o) { o.min_loss_scale = 0x1p40; },
                       "optimizer.min_loss_scale");
  ExpectConfigRejected([](OptimizerConfig& o) { o.initial_loss_scale = 0; },
                       "optimizer.initial_loss_scale");
  ExpectConfigRejected([](OptimizerConfig& o) { o.hysteresis = 0; },
                       "optimizer.hysteresis");
}

}  // namespace
}  // namespace depot
