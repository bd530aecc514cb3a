// Global gradient clipping through real servers: 3 servers x W = 3 workers.
// The two modes of a step agree bit for bit, the reported norm is the norm of
// the summed, unscaled gradient, and a power-of-two loss scale changes no bit.
//
// Norm tolerance: each server sums the squares of its shard's fp32 gradient
// values in double (every square is exact in double) in a fixed order, and the
// client adds the three shard sums; the test adds the same squares in element
// order. Both are float64 sums of the same ~2.7K positive terms, each within a
// relative (n - 1) * 2^-53 < 3.1e-13 of the exact sum, so the two L2 norms
// (square roots) agree to 1e-12 relative. The inf norm is a max: exact.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "bitwise_compare.h"
#include "client_training.h"
#include "gtest/gtest.h"
#include "reference_optimizer.h"
#include "summed_gradient.h"
#include "three_servers.h"
#include "training_data.h"
#include "worker_steps.h"

namespace depot::testing {
namespace {

constexpr uint64_t kSeed = 11;
constexpr uint32_t kWorkers = 3;
constexpr double kNormTolerance = 1e-12;  // relative, see the file comment

JobConfig ClippedConfig(std::string name, double clip_grad) {
  JobConfig config = SmallJobConfig(std::move(name), kWorkers, 3);
  config.optimizer.clip_grad = clip_grad;
  return config;
}

StepOptions StandardOptions(uint64_t step) {
  StepOptions options;
  options.group_hparams = StepHyperParams(step);
  return options;
}

// Each worker's gradients multiplied by `factor` (exact for a power of two
// that neither overflows nor underflows the tensor values).
std::vector<std::string> Scaled(const std::vector<std::string>& grads,
                                DType dtype, float factor) {
  std::vector<std::string> scaled;
  for (const std::string& g : grads) {
    const size_t n = g.size() / DTypeSize(dtype);
    std::vector<float> values(n);
    ConvertToFloat(dtype, g.data(), values.data(), n);
    for (float& v : values) v *= factor;
    std::string bytes(g.size(), '\0');
    ConvertFromFloat(values.data(), dtype, bytes.data(), n);
    scaled.push_back(std::move(bytes));
  }
  return scaled;
}

class ClippingTest : public ThreeServers {
 protected:
  std::unique_ptr<ClientTraining> Open(const JobConfig& config) {
    absl::StatusOr<std::unique_ptr<ClientTraining>> training =
        ClientTraining::Open(Addresses(), config);
    EXPECT_TRUE(training.ok()) << training.status();
    if (!training.ok()) return nullptr;
    absl::Status init = (*training)->InitWeights(kSeed, DType::kFloat32);
    EXPECT_TRUE(init.ok()) << init;
    return *std::move(training);
  }

  // Steps every worker and returns worker 0's result once all agree on it.
  static StepResult StepAll(ClientTraining& training, uint64_t step,
                            const std::vector<std::string>& grads,
                            const StepOptions& options) {
    std::vector<WorkerOutcome> outcomes =
        StepWorkers(training, step, grads, options);
    for (const WorkerOutcome& outcome : outcomes) {
      EXPECT_TRUE(outcome.status.ok()) << outcome.status;
      if (!outcome.status.ok()) return StepResult();
    }
    const StepResult& first = outcomes[0].results[0];
    for (const WorkerOutcome& outcome : outcomes) {
      const StepResult& r = outcome.results[0];
      EXPECT_EQ(r.two_phase, first.two_phase);
      EXPECT_EQ(std::memcmp(&r.grad_norm, &first.grad_norm, sizeof(double)), 0);
      EXPECT_EQ(r.clip_coef, first.clip_coef);
      EXPECT_EQ(r.skipped, first.skipped);
      EXPECT_EQ(r.zero_count, first.zero_count);
    }
    return first;
  }

  // A ReferenceOptimizer of `config` fed with final (summed, unscaled,
  // clipped) gradients as one fp32 worker.
  static ReferenceOptimizer FinalGradientReference(JobConfig config) {
    config.grad_dtype = DType::kFloat32;
    ReferenceOptimizer reference(config);
    const Layout layout =
        *Layout::Create(config.tensors, config.alignment_elems);
    reference.InitWeights(
        MakeInitialWeights(layout, DType::kFloat32, kSeed).data(),
        DType::kFloat32);
    return reference;
  }

  static std::vector<float> Master(ClientTraining& training) {
    absl::StatusOr<std::vector<float>> master = training.PullMaster();
    EXPECT_TRUE(master.ok()) << master.status();
    return master.ok() ? *master : std::vector<float>();
  }
};

TEST_F(ClippingTest, OnePhaseWithTheReportedCoefficientEqualsTwoPhases) {
  const JobConfig config = ClippedConfig("two-phase", /*clip_grad=*/1.0);
  std::unique_ptr<ClientTraining> two = Open(config);
  ASSERT_NE(two, nullptr);
  std::vector<double> coefs;
  for (uint64_t step = 1; step <= 3; ++step) {
    const StepResult result =
        StepAll(*two, step, StandardGradients(config, kSeed, step),
                StandardOptions(step));
    ASSERT_TRUE(result.two_phase);
    ASSERT_LT(result.clip_coef, 1.0) << "the test must clip";
    coefs.push_back(result.clip_coef);
  }

  JobConfig one_config = config;
  one_config.name = "one-phase";
  std::unique_ptr<ClientTraining> one = Open(one_config);
  ASSERT_NE(one, nullptr);
  for (uint64_t step = 1; step <= 3; ++step) {
    StepOptions options = StandardOptions(step);
    options.known_commit = StepCommit{coefs[step - 1], false};
    const StepResult result =
        StepAll(*one, step, StandardGradients(config, kSeed, step), options);
    EXPECT_FALSE(result.two_phase);
    EXPECT_EQ(result.clip_coef, coefs[step - 1]);
  }

  EXPECT_TRUE(BitwiseEqual(Master(*two), Master(*one)));
  absl::StatusOr<std::vector<uint64_t>> two_sums = two->StateChecksums();
  absl::StatusOr<std::vector<uint64_t>> one_sums = one->StateChecksums();
  ASSERT_TRUE(two_sums.ok() && one_sums.ok());
  EXPECT_EQ(*two_sums, *one_sums);
}

TEST_F(ClippingTest, ReportedL2NormIsTheFloat64NormOfTheSummedGradient) {
  const JobConfig config = ClippedConfig("l2", /*clip_grad=*/1.0);
  std::unique_ptr<ClientTraining> training = Open(config);
  ASSERT_NE(training, nullptr);
  const Layout& layout = training->layout();
  std::vector<std::string> grads = StandardGradients(config, kSeed, 1);
  // Every 7th element is 0 from every worker, so the zero count is large.
  for (std::string& g : grads) {
    for (size_t i = 0; i < layout.total_elems(); i += 7) {
      std::memset(g.data() + i * sizeof(float), 0, sizeof(float));
    }
  }
  const StepResult result = StepAll(*training, 1, grads, StandardOptions(1));

  const std::vector<float> sum = SummedGradient(layout, DType::kFloat32, grads);
  const double norm = L2Norm(layout, sum);
  EXPECT_NEAR(result.grad_norm, norm, kNormTolerance * norm);
  EXPECT_EQ(result.zero_count, ZeroCount(layout, sum));
  EXPECT_GT(result.zero_count, layout.total_elems() / 8);
  const double coef = config.optimizer.clip_grad / (norm + 1e-6);
  EXPECT_NEAR(result.clip_coef, coef, kNormTolerance * coef);
  EXPECT_FALSE(result.found_inf);
  EXPECT_FALSE(result.skipped);

  ReferenceOptimizer reference = FinalGradientReference(config);
  const std::string final_grad = AsFp32Bytes(Clipped(sum, result.clip_coef));
  reference.Step(1, {final_grad.data()}, StepHyperParams(1));
  EXPECT_TRUE(BitwiseEqual(reference.master(), Master(*training)));
}

TEST_F(ClippingTest, ReportedInfNormIsTheLargestMagnitude) {
  JobConfig config = ClippedConfig("inf", /*clip_grad=*/0.05);
  config.optimizer.clip_grad_norm_type = GradNormType::kInf;
  std::unique_ptr<ClientTraining> training = Open(config);
  ASSERT_NE(training, nullptr);
  const std::vector<std::string> grads = StandardGradients(config, kSeed, 1);
  const StepResult result = StepAll(*training, 1, grads, StandardOptions(1));

  const Layout& layout = training->layout();
  const std::vector<float> sum = SummedGradient(layout, DType::kFloat32, grads);
  const double norm = InfNorm(layout, sum);
  EXPECT_EQ(result.grad_norm, norm);
  EXPECT_EQ(result.clip_coef, config.optimizer.clip_grad / (norm + 1e-6));
  ASSERT_LT(result.clip_coef, 1.0) << "the test must clip";

  ReferenceOptimizer reference = FinalGradientReference(config);
  const std::string final_grad = AsFp32Bytes(Clipped(sum, result.clip_coef));
  reference.Step(1, {final_grad.data()}, StepHyperParams(1));
  EXPECT_TRUE(BitwiseEqual(reference.master(), Master(*training)));
}

// Runs steps 1..2 of `config` twice: unscaled, and with the gradients and
// loss_scale multiplied by 1024. Returns both masters and the last results.
struct ScaledRuns {
  std::vector<float> unscaled_master, scaled_master;
  StepResult unscaled, scaled;
};

class LossScaleTest : public ClippingTest {
 protected:
  ScaledRuns RunBoth(const JobConfig& config) {
    constexpr float kScale = 1024.0f;
    ScaledRuns runs;
    JobConfig scaled_config = config;
    scaled_config.name += "-scaled";
    std::unique_ptr<ClientTraining> plain = Open(config);
    std::unique_ptr<ClientTraining> scaled = Open(scaled_config);
    if (plain == nullptr || scaled == nullptr) return runs;
    for (uint64_t step = 1; step <= 2; ++step) {
      const std::vector<std::string> grads =
          StandardGradients(config, kSeed, step);
      runs.unscaled = StepAll(*plain, step, grads, StandardOptions(step));
      StepOptions options = StandardOptions(step);
      options.loss_scale = kScale;
      runs.scaled = StepAll(*scaled, step,
                            Scaled(grads, config.grad_dtype, kScale), options);
    }
    runs.unscaled_master = Master(*plain);
    runs.scaled_master = Master(*scaled);
    return runs;
  }
};

TEST_F(LossScaleTest, PowerOfTwoScaleGivesTheUnscaledWeightsInOnePhase) {
  const ScaledRuns runs = RunBoth(ClippedConfig("scaled-one", 0.0));
  EXPECT_FALSE(runs.scaled.two_phase);
  EXPECT_TRUE(BitwiseEqual(runs.unscaled_master, runs.scaled_master));
}

TEST_F(LossScaleTest, PowerOfTwoScaleGivesTheUnscaledWeightsInTwoPhases) {
  const ScaledRuns runs = RunBoth(ClippedConfig("scaled-two", 1.0));
  EXPECT_TRUE(runs.scaled.two_phase);
  EXPECT_EQ(runs.scaled.grad_norm, runs.unscaled.grad_norm);
  EXPECT_EQ(runs.scaled.clip_coef, runs.unscaled.clip_coef);
  EXPECT_TRUE(BitwiseEqual(runs.unscaled_master, runs.scaled_master));
}

TEST_F(LossScaleTest, DynamicallyScaledFp16JobRunsInTwoPhasesAndUnscales) {
  JobConfig config = ClippedConfig("scaled-fp16", 0.0);
  config.grad_dtype = DType::kFloat16;
  config.optimizer.loss_scale = 0.0;  // dynamic, with fp16 gradients
  const ScaledRuns runs = RunBoth(config);
  EXPECT_TRUE(runs.scaled.two_phase);
  EXPECT_FALSE(runs.scaled.found_inf);  // padding overflows, and is ignored
  EXPECT_EQ(runs.scaled.grad_norm, runs.unscaled.grad_norm);
  EXPECT_TRUE(BitwiseEqual(runs.unscaled_master, runs.scaled_master));
}

TEST_F(ClippingTest, TwoPhasesCompleteWithMoreChunksPerServerThanTheWindow) {
  // One server holds all 12 chunks, three times the client's default window
  // of 4: no weights can come before the commit, so only the acks of summed
  // chunks let the workers send the rest.
  JobConfig config = SmallJobConfig("window", kWorkers, /*num_servers=*/1);
  config.optimizer.clip_grad = 1.0;
  absl::StatusOr<std::unique_ptr<ClientTraining>> training =
      ClientTraining::Open({Addresses()[0]}, config);
  ASSERT_TRUE(training.ok()) << training.status();
  ASSERT_GT((*training)->job(0).plan().num_chunks(),
            static_cast<uint64_t>(ClientOptions().max_inflight_chunks));
  ASSERT_TRUE((*training)->InitWeights(kSeed, DType::kFloat32).ok());
  const std::vector<std::string> grads = StandardGradients(config, kSeed, 1);
  const StepResult result = StepAll(**training, 1, grads, StandardOptions(1));
  EXPECT_TRUE(result.two_phase);

  ReferenceOptimizer reference = FinalGradientReference(config);
  const std::string final_grad = AsFp32Bytes(
      Clipped(SummedGradient((*training)->layout(), DType::kFloat32, grads),
              result.clip_coef));
  reference.Step(1, {final_grad.data()}, StepHyperParams(1));
  EXPECT_TRUE(BitwiseEqual(reference.master(), Master(**training)));
}

TEST_F(ClippingTest, GradNormAboveTheSkipThresholdSkipsTheStep) {
  JobConfig config = ClippedConfig("threshold", 0.0);
  config.optimizer.grad_norm_skip_threshold = 1.0;
  std::unique_ptr<ClientTraining> training = Open(config);
  ASSERT_NE(training, nullptr);
  absl::StatusOr<std::vector<uint64_t>> before = training->StateChecksums();
  ASSERT_TRUE(before.ok()) << before.status();
  const StepResult result = StepAll(
      *training, 1, StandardGradients(config, kSeed, 1), StandardOptions(1));
  EXPECT_TRUE(result.two_phase);
  EXPECT_GT(result.grad_norm, 1.0);
  EXPECT_FALSE(result.found_inf);
  EXPECT_TRUE(result.skipped);
  EXPECT_EQ(result.clip_coef, 1.0);
  absl::StatusOr<std::vector<uint64_t>> after = training->StateChecksums();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, *before);
}

}  // namespace
}  // namespace depot::testing
