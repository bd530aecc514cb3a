// A NaN or Inf anywhere in a step's summed gradient skips the whole step on
// every server: 3 servers x W = 3 workers, fp16 gradients with dynamic loss
// scaling (so the client runs two phases, as a Megatron fp16 run would).
// Skipped means: no state changes on any server, the optimizer's step count
// does not advance, the workers are told found_inf, and the training step
// still counts as applied (a resend returns the same weights).
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "bitwise_compare.h"
#include "client_training.h"
#include "depot/shard_plan.h"
#include "gtest/gtest.h"
#include "reference_optimizer.h"
#include "summed_gradient.h"
#include "three_servers.h"
#include "training_data.h"
#include "worker_steps.h"

namespace depot::testing {
namespace {

constexpr uint64_t kSeed = 13;
constexpr uint32_t kWorkers = 3;

JobConfig Fp16DynamicScaleConfig(std::string name) {
  JobConfig config = SmallJobConfig(std::move(name), kWorkers, 3);
  config.grad_dtype = DType::kFloat16;
  config.optimizer.loss_scale = 0.0;  // dynamic
  return config;
}

StepOptions StandardOptions(uint64_t step) {
  StepOptions options;
  options.group_hparams = StepHyperParams(step);
  return options;
}

// Sets element `index` of one worker's gradient buffer to `value`.
void SetElement(std::string& grads, DType dtype, uint64_t index, float value) {
  ConvertFromFloat(&value, dtype, grads.data() + index * DTypeSize(dtype), 1);
}

// A tensor element in the middle server's shard.
uint64_t ElementOnServer1(const JobConfig& config, const Layout& layout) {
  const ShardPlan plan = *ShardPlan::Create(
      layout.total_elems(), config.num_servers, config.chunk_elems);
  const ShardRange& shard = plan.shard(1);
  return layout.SegmentsIn(shard.begin, shard.end).front().begin + 3;
}

class NonFiniteSkipTest : public ThreeServers {
 protected:
  void SetUp() override {
    ThreeServers::SetUp();
    if (HasFatalFailure()) return;
    config_ = Fp16DynamicScaleConfig("nonfinite");
    absl::StatusOr<std::unique_ptr<ClientTraining>> training =
        ClientTraining::Open(Addresses(), config_);
    ASSERT_TRUE(training.ok()) << training.status();
    training_ = *std::move(training);
    absl::Status init = training_->InitWeights(kSeed, DType::kFloat32);
    ASSERT_TRUE(init.ok()) << init;
  }

  // Runs `step` on every worker; expects every worker to succeed.
  std::vector<WorkerOutcome> StepAll(uint64_t step,
                                     const std::vector<std::string>& grads,
                                     const StepOptions& options) {
    std::vector<WorkerOutcome> outcomes =
        StepWorkers(*training_, step, grads, options);
    for (const WorkerOutcome& outcome : outcomes) {
      EXPECT_TRUE(outcome.status.ok()) << outcome.status;
    }
    return outcomes;
  }

  std::vector<uint64_t> Checksums() {
    absl::StatusOr<std::vector<uint64_t>> sums = training_->StateChecksums();
    EXPECT_TRUE(sums.ok()) << sums.status();
    return sums.ok() ? *sums : std::vector<uint64_t>();
  }

  // Worker 1's step-2 gradient gets `value` at an element of server 1.
  std::vector<std::string> PoisonedGradients(float value) {
    std::vector<std::string> grads = StandardGradients(config_, kSeed, 2);
    SetElement(grads[1], config_.grad_dtype,
               ElementOnServer1(config_, training_->layout()), value);
    return grads;
  }

  // Runs step 1, then step 2 with `value` in worker 1's gradient; expects the
  // skip and returns the step-2 outcomes.
  std::vector<WorkerOutcome> SkipStep2(float value) {
    std::vector<WorkerOutcome> first =
        StepAll(1, StandardGradients(config_, kSeed, 1), StandardOptions(1));
    before_ = Checksums();
    std::vector<WorkerOutcome> second =
        StepAll(2, PoisonedGradients(value), StandardOptions(2));
    for (const WorkerOutcome& outcome : second) {
      if (!outcome.status.ok()) continue;
      const StepResult& result = outcome.results[0];
      EXPECT_TRUE(result.two_phase);
      EXPECT_TRUE(result.found_inf);
      EXPECT_TRUE(result.skipped);
      EXPECT_EQ(result.clip_coef, 1.0);
      // The weights come back unchanged.
      EXPECT_TRUE(BitwiseEqual(first[0].last_weights, outcome.last_weights,
                               sizeof(float)));
    }
    return second;
  }

  JobConfig config_;
  std::unique_ptr<ClientTraining> training_;
  std::vector<uint64_t> before_;
};

TEST_F(NonFiniteSkipTest, InfOnOneServerSkipsTheStepOnEveryServer) {
  SkipStep2(std::numeric_limits<float>::infinity());
  EXPECT_EQ(Checksums(), before_);
  absl::StatusOr<std::vector<ServerJobStatus>> statuses =
      training_->job(0).Status(/*with_checksum=*/false);
  ASSERT_TRUE(statuses.ok()) << statuses.status();
  for (const ServerJobStatus& status : *statuses) {
    EXPECT_EQ(status.step, 2u) << status.server;
  }
}

TEST_F(NonFiniteSkipTest, NanOnOneServerSkipsTheStepOnEveryServer) {
  SkipStep2(std::nanf(""));
  EXPECT_EQ(Checksums(), before_);
}

TEST_F(NonFiniteSkipTest, NextStepMatchesAReferenceThatNeverSawTheSkippedOne) {
  SkipStep2(std::numeric_limits<float>::infinity());
  StepAll(3, StandardGradients(config_, kSeed, 3), StandardOptions(3));

  // The servers' Adam bias correction at step 3 must use optimizer step 2.
  JobConfig reference_config = config_;
  reference_config.grad_dtype = DType::kFloat32;
  ReferenceOptimizer reference(reference_config);
  const Layout& layout = training_->layout();
  reference.InitWeights(
      MakeInitialWeights(layout, DType::kFloat32, kSeed).data(),
      DType::kFloat32);
  uint64_t optimizer_step = 0;
  for (uint64_t step : {1, 3}) {
    const std::string final_grad = AsFp32Bytes(SummedGradient(
        layout, config_.grad_dtype, StandardGradients(config_, kSeed, step)));
    reference.Step(++optimizer_step, {final_grad.data()},
                   StepHyperParams(step));
  }
  absl::StatusOr<std::vector<float>> master = training_->PullMaster();
  ASSERT_TRUE(master.ok()) << master.status();
  EXPECT_TRUE(BitwiseEqual(reference.master(), *master));
}

TEST_F(NonFiniteSkipTest, ResendingTheSkippedStepReturnsTheSameWeights) {
  std::vector<WorkerOutcome> skipped =
      SkipStep2(std::numeric_limits<float>::infinity());
  // Worker 0 alone resends step 2: nothing waits for the others.
  std::vector<WorkerOutcome> resent = StepWorkers(
      *training_, 2, PoisonedGradients(std::numeric_limits<float>::infinity()),
      StandardOptions(2), /*ranks=*/{0});
  ASSERT_TRUE(resent[0].status.ok()) << resent[0].status;
  const StepResult& result = resent[0].results[0];
  EXPECT_TRUE(result.skipped);
  EXPECT_EQ(result.chunks_replayed, result.chunks);
  EXPECT_TRUE(BitwiseEqual(skipped[0].last_weights, resent[0].last_weights,
                           sizeof(float)));
  EXPECT_EQ(Checksums(), before_);
}

TEST_F(NonFiniteSkipTest, KnownSkipInOnePhaseChangesNoStateOnAnyServer) {
  const std::vector<uint64_t> before = Checksums();
  StepOptions options = StandardOptions(1);
  options.known_commit = StepCommit{1.0, /*skip=*/true};
  std::vector<WorkerOutcome> outcomes =
      StepAll(1, StandardGradients(config_, kSeed, 1), options);
  for (const WorkerOutcome& outcome : outcomes) {
    if (!outcome.status.ok()) continue;
    EXPECT_FALSE(outcome.results[0].two_phase);
    EXPECT_TRUE(outcome.results[0].skipped);
  }
  EXPECT_EQ(Checksums(), before);
}

}  // namespace
}  // namespace depot::testing
