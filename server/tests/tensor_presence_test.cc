// ShardState's per-tensor semantics: tensors a step has no gradient for
// (StepHeader.no_grad_tensors), per-tensor optimizer step counts, and weights
// overrides sent before a chunk's gradient.
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/job_shape.h"
#include "server/memory_budget.h"
#include "server/metrics.h"
#include "server/shard_state.h"
#include "server/tests/test_util.h"
#include "server/thread_pool.h"

namespace depot {
namespace {

using ::depot::testing::DrainPool;
using ::depot::testing::Fp32Payload;
using ::depot::testing::Fp32Values;
using ::depot::testing::PlainSgdConfig;
using ::depot::testing::RecordingSink;

// One chunk of 8 elements: tensor "a" [0, 3), padding [3, 4), tensor "b"
// [4, 7), padding [7, 8); SGD, lr 0.5, no momentum.
JobConfig TwoTensorsInOneChunk(uint32_t workers) {
  return PlainSgdConfig({{"a", 3, 0}, {"b", 3, 0}}, workers,
                        /*chunk_elems=*/8, /*alignment_elems=*/4);
}

// Bit t set: tensor t has no gradient.
std::string Bitmap(unsigned bits) { return std::string(1, char(bits)); }

class TensorPresenceTest : public ::depot::testing::ShardTest {
 protected:
  // Worker `worker`'s gradient of the job's one chunk.
  static absl::Status Send(ShardState& shard, uint64_t step, uint32_t worker,
                           const std::vector<float>& grad,
                           std::shared_ptr<StepReplySink> sink) {
    return shard.Contribute(Grad(step, worker, 0, grad, std::move(sink)));
  }

  // A shard of `config` charging `budget`.
  std::shared_ptr<ShardState> MakeShardWithBudget(
      const JobConfig& config, std::shared_ptr<MemoryBudget> budget) {
    return ShardState::Create(/*job_id=*/1, JobShape::Create(config, 0).value(),
                              &pool_, payloads_, &metrics_, false,
                              std::move(budget))
        .value();
  }

  // The chunk's master weights and per-tensor counts, once no update runs.
  static ChunkSnapshot Snapshot(const ShardState& shard) {
    ChunkSnapshot out;
    EXPECT_TRUE(shard
                    .ExportChunks([&](ChunkSnapshot s) {
                      out = std::move(s);
                      return true;
                    })
                    .ok());
    return out;
  }
};

TEST_F(TensorPresenceTest, TensorNoWorkerHasAGradientForIsNotUpdated) {
  auto shard = MakeShard(TwoTensorsInOneChunk(2));
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}, {}, {}, Bitmap(0b10)).ok());
  ASSERT_TRUE(shard->BeginStep(1, 1, {}, {}, {}, Bitmap(0b10)).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, std::vector<float>(8, 1.0f), sink).ok());
  ASSERT_TRUE(Send(*shard, 1, 1, std::vector<float>(8, 1.0f), sink).ok());
  sink->WaitFor(2);
  const ChunkSnapshot chunk = Snapshot(*shard);
  EXPECT_EQ(Fp32Values(chunk.master),
            std::vector<float>({-1, -1, -1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(chunk.tensor_steps, std::vector<uint64_t>({1, 0}));
  EXPECT_EQ(chunk.applied_step, 1u);
}

TEST_F(TensorPresenceTest, AbsentWorkersPartCountsAsZeroWhatItsPayloadHolds) {
  auto shard = MakeShard(TwoTensorsInOneChunk(2));
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  ASSERT_TRUE(shard->BeginStep(1, 1, {}, {}, {}, Bitmap(0b10)).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, std::vector<float>(8, 1.0f), sink).ok());
  ASSERT_TRUE(Send(*shard, 1, 1, std::vector<float>(8, 5.0f), sink).ok());
  sink->WaitFor(2);
  const ChunkSnapshot chunk = Snapshot(*shard);
  // a: -0.5 * (1 + 5); b: -0.5 * (1 + 0).
  EXPECT_EQ(Fp32Values(chunk.master),
            std::vector<float>({-3, -3, -3, 0, -0.5, -0.5, -0.5, 0}));
  EXPECT_EQ(chunk.tensor_steps, std::vector<uint64_t>({1, 1}));
}

TEST_F(TensorPresenceTest, BiasCorrectionUsesTheTensorsOwnCount) {
  JobConfig config = TwoTensorsInOneChunk(1);
  config.optimizer.kind = OptimizerKind::kAdam;
  auto skipped_first = MakeShard(config);
  auto updated_first = MakeShard(config);
  auto sink = std::make_shared<RecordingSink>();
  const std::vector<float> grad = {0.5f, -2, 3, 0, 0.25f, -1, 7, 0};
  // b has no gradient in step 1, then `grad` in step 2: its first update.
  ASSERT_TRUE(skipped_first->BeginStep(1, 0, {}, {}, {}, Bitmap(0b10)).ok());
  ASSERT_TRUE(Send(*skipped_first, 1, 0, grad, sink).ok());
  sink->WaitFor(1);
  ASSERT_TRUE(skipped_first->BeginStep(2, 0, {}).ok());
  ASSERT_TRUE(Send(*skipped_first, 2, 0, grad, sink).ok());
  sink->WaitFor(2);
  ASSERT_TRUE(updated_first->BeginStep(1, 0, {}).ok());
  ASSERT_TRUE(Send(*updated_first, 1, 0, grad, sink).ok());
  sink->WaitFor(3);
  const ChunkSnapshot twice = Snapshot(*skipped_first);
  const ChunkSnapshot once = Snapshot(*updated_first);
  EXPECT_EQ(twice.tensor_steps, std::vector<uint64_t>({2, 1}));
  // b's master and moments are those of one update at count 1.
  const auto b = [](const std::string& bytes) {
    std::vector<float> v = Fp32Values(bytes);
    return std::vector<float>(v.begin() + 4, v.begin() + 7);
  };
  EXPECT_EQ(b(twice.master), b(once.master));
  EXPECT_EQ(b(twice.slots[0]), b(once.slots[0]));
  EXPECT_EQ(b(twice.slots[1]), b(once.slots[1]));
}

TEST_F(TensorPresenceTest, NoGradBitmapIsValidated) {
  auto shard = MakeShard(TwoTensorsInOneChunk(2));
  EXPECT_EQ(shard->BeginStep(1, 0, {}, {}, {}, std::string(2, '\0')).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->BeginStep(1, 0, {}, {}, {}, Bitmap(0b100)).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(shard->BeginStep(1, 0, {}, {}, {}, Bitmap(0b01)).ok());
  // Another stream of the same worker and step must say the same.
  EXPECT_EQ(shard->BeginStep(1, 0, {}, {}, {}, Bitmap(0b10)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(shard->BeginStep(1, 0, {}, {}, {}, Bitmap(0b01)).ok());
}

// Sum-only tensors (StepHeader.sum_only_tensors): the workers update them
// from the server's sum, which comes with the chunk's weights.
TEST_F(TensorPresenceTest, SumOnlyTensorIsSummedAndSentNotUpdated) {
  auto shard = MakeShard(TwoTensorsInOneChunk(2));
  auto sink = std::make_shared<RecordingSink>();
  for (uint32_t worker : {0u, 1u}) {
    ASSERT_TRUE(
        shard->BeginStep(1, worker, {}, {}, {}, {}, {}, Bitmap(0b10)).ok());
  }
  ASSERT_TRUE(Send(*shard, 1, 0, {1, 2, 3, 0, 0.5f, -1, 1e-8f, 0}, sink).ok());
  ASSERT_TRUE(Send(*shard, 1, 1, {1, 1, 1, 0, 0.25f, 3, 1, 0}, sink).ok());
  sink->WaitFor(2);
  const ChunkSnapshot chunk = Snapshot(*shard);
  // a is updated from the sum (lr 0.5); b keeps its master and count.
  EXPECT_EQ(Fp32Values(chunk.master),
            std::vector<float>({-1, -1.5f, -2, 0, 0, 0, 0, 0}));
  EXPECT_EQ(chunk.tensor_steps, std::vector<uint64_t>({1, 0}));
  // b's sum in rank order, in fp32: 1e-8 + 1 rounds to 1.
  for (const ChunkWeights& weights : sink->received()) {
    ASSERT_NE(weights.grad_sum, nullptr);
    EXPECT_EQ(Fp32Values(weights.grad_sum->sums),
              std::vector<float>({0.75f, 2, 1e-8f + 1.0f}));
  }
}

TEST_F(TensorPresenceTest, SumOnlyTensorWithoutAGradientSumsToZero) {
  auto shard = MakeShard(TwoTensorsInOneChunk(2));
  auto sink = std::make_shared<RecordingSink>();
  for (uint32_t worker : {0u, 1u}) {
    ASSERT_TRUE(
        shard->BeginStep(1, worker, {}, {}, {}, Bitmap(0b01), {}, Bitmap(0b01))
            .ok());
  }
  ASSERT_TRUE(Send(*shard, 1, 0, std::vector<float>(8, 7.0f), sink).ok());
  ASSERT_TRUE(Send(*shard, 1, 1, std::vector<float>(8, 1.0f), sink).ok());
  sink->WaitFor(2);
  const ChunkSnapshot chunk = Snapshot(*shard);
  EXPECT_EQ(Fp32Values(chunk.master),
            std::vector<float>({0, 0, 0, 0, -4, -4, -4, 0}));
  EXPECT_EQ(chunk.tensor_steps, std::vector<uint64_t>({0, 1}));
  for (const ChunkWeights& weights : sink->received()) {
    ASSERT_NE(weights.grad_sum, nullptr);
    EXPECT_EQ(Fp32Values(weights.grad_sum->sums), std::vector<float>(3, 0.0f));
    EXPECT_EQ(weights.grad_sum->skipped_tensors, std::vector<uint32_t>{0});
  }
}

// Some workers have a gradient for a sum-only tensor: the others' parts
// count as zero whatever their payloads hold, and the tensor is not skipped
// (the workers update it, as the server updates such a tensor).
TEST_F(TensorPresenceTest, SumOnlyTensorWithAGradientOnSomeWorkersOnly) {
  auto shard = MakeShard(TwoTensorsInOneChunk(2));
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}, {}, {}, {}, {}, Bitmap(0b10)).ok());
  ASSERT_TRUE(
      shard->BeginStep(1, 1, {}, {}, {}, Bitmap(0b10), {}, Bitmap(0b10)).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, {1, 1, 1, 0, 2, 3, 4, 0}, sink).ok());
  ASSERT_TRUE(Send(*shard, 1, 1, {1, 1, 1, 0, 50, 50, 50, 0}, sink).ok());
  sink->WaitFor(2);
  for (const ChunkWeights& weights : sink->received()) {
    ASSERT_NE(weights.grad_sum, nullptr);
    EXPECT_EQ(Fp32Values(weights.grad_sum->sums),
              std::vector<float>({2, 3, 4}));
    EXPECT_TRUE(weights.grad_sum->skipped_tensors.empty());
  }
  EXPECT_EQ(Snapshot(*shard).tensor_steps, std::vector<uint64_t>({1, 0}));
}

// The sums are charged to the server's memory budget from the update until
// the last stream that sends them lets go (a client that does not read holds
// them).
TEST_F(TensorPresenceTest, AGradSumIsChargedUntilItsLastHolderLetsGo) {
  auto budget = std::make_shared<MemoryBudget>(uint64_t{1} << 20);
  auto shard = MakeShardWithBudget(TwoTensorsInOneChunk(1), budget);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}, {}, {}, {}, {}, Bitmap(0b10)).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, std::vector<float>(8, 1.0f), sink).ok());
  sink->WaitFor(1);
  DrainPool(pool_);
  EXPECT_EQ(budget->used(), 3 * sizeof(float));  // b's three sums
  sink.reset();
  EXPECT_EQ(budget->used(), 0u);
}

// omit_sums (a job of one worker, which holds the sums): the GradSum brings
// the decision and the skipped tensors only, and costs no budget.
TEST_F(TensorPresenceTest, OmittedSumsLeaveTheDecisionAndTheSkippedTensors) {
  auto budget = std::make_shared<MemoryBudget>(uint64_t{1} << 20);
  auto shard = MakeShardWithBudget(TwoTensorsInOneChunk(1), budget);
  auto sink = std::make_shared<RecordingSink>();
  StepNumerics numerics;
  numerics.commit.clip_coef = 0.5;
  ASSERT_TRUE(shard
                  ->BeginStep(1, 0, {}, numerics, {}, Bitmap(0b01), {},
                              SumOnlyTensors(Bitmap(0b11), true))
                  .ok());
  ASSERT_TRUE(Send(*shard, 1, 0, std::vector<float>(8, 1.0f), sink).ok());
  const std::vector<ChunkWeights> got = sink->WaitFor(1);
  ASSERT_NE(got[0].grad_sum, nullptr);
  EXPECT_TRUE(got[0].grad_sum->sums.empty());
  EXPECT_EQ(got[0].grad_sum->skipped_tensors, std::vector<uint32_t>{0});
  EXPECT_EQ(got[0].grad_sum->commit.clip_coef, 0.5);
  DrainPool(pool_);
  EXPECT_EQ(budget->used(), 0u);
  // Neither tensor is the server's to update.
  EXPECT_EQ(Snapshot(*shard).tensor_steps, std::vector<uint64_t>({0, 0}));
}

TEST_F(TensorPresenceTest, ChunkWithoutSumOnlyTensorsSendsNoSum) {
  auto shard = MakeShard(TwoTensorsInOneChunk(1));
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, std::vector<float>(8, 1.0f), sink).ok());
  sink->WaitFor(1);
  EXPECT_EQ(sink->received().at(0).grad_sum, nullptr);
}

// Two phases: the sum-only tensor counts in the shard's GradStats, its sums
// come unscaled (as the server's own two-phase update reads them), and each
// GradSum carries the decision the update applied.
TEST_F(TensorPresenceTest, SumOnlyTensorInTwoPhasesCountsInTheNorm) {
  auto shard = MakeShard(TwoTensorsInOneChunk(2));
  auto sink = std::make_shared<RecordingSink>();
  StepNumerics numerics;
  numerics.two_phase = true;
  numerics.loss_scale = 2.0;
  for (uint32_t worker : {0u, 1u}) {
    ASSERT_TRUE(
        shard->BeginStep(1, worker, {}, numerics, sink, {}, {}, Bitmap(0b10))
            .ok());
  }
  ASSERT_TRUE(Send(*shard, 1, 0, {2, 2, 2, 0, 4, 4, 4, 0}, sink).ok());
  ASSERT_TRUE(Send(*shard, 1, 1, {2, 2, 2, 0, 2, 2, 2, 0}, sink).ok());
  // Unscaled sums: a 2 each, b 3 each; b is in the norm.
  EXPECT_EQ(sink->WaitForGradStats().sum_squares, 3 * 4.0 + 3 * 9.0);
  ASSERT_TRUE(shard->Commit(1, {0.5, false}).ok());
  for (const ChunkWeights& weights : sink->WaitFor(2)) {
    ASSERT_NE(weights.grad_sum, nullptr);
    EXPECT_EQ(Fp32Values(weights.grad_sum->sums), std::vector<float>(3, 3.0f));
    EXPECT_EQ(weights.grad_sum->commit.clip_coef, 0.5);
    EXPECT_FALSE(weights.grad_sum->commit.skip);
  }
  const ChunkSnapshot chunk = Snapshot(*shard);
  // a: -0.5 * 2 * 0.5; b untouched.
  EXPECT_EQ(Fp32Values(chunk.master),
            std::vector<float>({-0.5f, -0.5f, -0.5f, 0, 0, 0, 0, 0}));
  EXPECT_EQ(chunk.tensor_steps, std::vector<uint64_t>({1, 0}));
}

// clip_grad_norm_ sees only the parameters with a .grad: a tensor no worker
// has a gradient for is left out of GradStats whatever its payloads hold.
TEST_F(TensorPresenceTest,
       TwoPhaseStatsLeaveOutATensorNoWorkerHasAGradientFor) {
  auto shard = MakeShard(TwoTensorsInOneChunk(2));
  auto sink = std::make_shared<RecordingSink>();
  StepNumerics numerics;
  numerics.two_phase = true;
  for (uint32_t worker : {0u, 1u}) {
    ASSERT_TRUE(
        shard->BeginStep(1, worker, {}, numerics, sink, Bitmap(0b10)).ok());
  }
  ASSERT_TRUE(Send(*shard, 1, 0, {1, 1, 1, 0, 50, 50, 50, 0}, sink).ok());
  ASSERT_TRUE(Send(*shard, 1, 1, {1, 1, 1, 0, 50, 50, 50, 0}, sink).ok());
  const GradStats stats = sink->WaitForGradStats();
  EXPECT_EQ(stats.sum_squares, 3 * 4.0);
  EXPECT_EQ(stats.max_abs, 2.0);
  EXPECT_EQ(stats.zero_count, 0u);
}

TEST_F(TensorPresenceTest, SumOnlyBitmapIsValidatedAndTheSameFromEveryWorker) {
  auto shard = MakeShard(TwoTensorsInOneChunk(2));
  const auto begin = [&](uint32_t worker, std::string no_grad,
                         std::string sum_only, bool two_phase = false) {
    StepNumerics numerics;
    numerics.two_phase = two_phase;
    return shard
        ->BeginStep(1, worker, {}, numerics, std::make_shared<RecordingSink>(),
                    std::move(no_grad), {}, std::move(sum_only))
        .code();
  };
  EXPECT_EQ(begin(0, {}, std::string(2, '\0')),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(begin(0, {}, Bitmap(0b100)), absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(begin(0, Bitmap(0b01), Bitmap(0b10)), absl::StatusCode::kOk);
  // Another worker with other sum-only tensors, or none.
  EXPECT_EQ(begin(1, Bitmap(0b01), Bitmap(0b01)),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(begin(1, Bitmap(0b01), {}), absl::StatusCode::kFailedPrecondition);
  // The workers' gradients may differ, for sum-only tensors too (GradSum
  // says which no worker has).
  EXPECT_EQ(begin(1, Bitmap(0b11), Bitmap(0b10)), absl::StatusCode::kOk);
  // omit_sums: only in a job of one worker, and with sum-only tensors.
  EXPECT_EQ(shard
                ->BeginStep(2, 0, {}, {}, {}, {}, {},
                            SumOnlyTensors(Bitmap(0b10), true))
                .code(),
            absl::StatusCode::kInvalidArgument);
  auto one = MakeShard(TwoTensorsInOneChunk(1));
  EXPECT_EQ(
      one->BeginStep(1, 0, {}, {}, {}, {}, {}, SumOnlyTensors({}, true)).code(),
      absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(one->BeginStep(1, 0, {}, {}, {}, {}, {},
                             SumOnlyTensors(Bitmap(0b10), true))
                  .ok());
  // Another stream of the step must say the same.
  EXPECT_EQ(one->BeginStep(1, 0, {}, {}, {}, {}, {}, Bitmap(0b10)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(TensorPresenceTest, OverrideReplacesMasterWeightsBeforeTheUpdate) {
  auto shard = MakeShard(TwoTensorsInOneChunk(1));
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  // b := {7, 8, 9} and the padding after it, which must stay 0.
  ASSERT_TRUE(shard
                  ->OverrideWeights(1, 0, 0,
                                    {4, Fp32Payload({7, 8, 9, 100})})
                  .ok());
  ASSERT_TRUE(
      Send(*shard, 1, 0, {2, 2, 2, 0, 2, 2, 2, 0}, sink).ok());
  const std::vector<ChunkWeights> answers = sink->WaitFor(1);
  EXPECT_EQ(Fp32Values(*answers[0].payload),
            std::vector<float>({-1, -1, -1, 0, 6, 7, 8, 0}));
  // A resent step's override is ignored; one after the gradient is refused.
  EXPECT_TRUE(shard->OverrideWeights(1, 0, 0, {4, Fp32Payload({1})}).ok());
  ASSERT_TRUE(shard->BeginStep(2, 0, {}).ok());
  ASSERT_TRUE(Send(*shard, 2, 0, std::vector<float>(8, 0), sink).ok());
  sink->WaitFor(2);
  EXPECT_EQ(Fp32Values(Snapshot(*shard).master),
            std::vector<float>({-1, -1, -1, 0, 6, 7, 8, 0}));
}

TEST_F(TensorPresenceTest, BadOverridesAreRejectedAndChangeNothing) {
  auto shard = MakeShard(TwoTensorsInOneChunk(2));
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  EXPECT_EQ(shard->OverrideWeights(1, 0, 1, {0, Fp32Payload({1})}).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(shard->OverrideWeights(1, 0, 0, {6, Fp32Payload({1, 2, 3})})
                .code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(shard->OverrideWeights(1, 0, 0, {0, std::string(6, '\0')}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->OverrideWeights(3, 0, 0, {0, Fp32Payload({1})}).code(),
            absl::StatusCode::kAborted);
  ASSERT_TRUE(Send(*shard, 1, 0, std::vector<float>(8, 0), sink).ok());
  EXPECT_EQ(shard->OverrideWeights(1, 0, 0, {0, Fp32Payload({1})}).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(shard->BeginStep(1, 1, {}).ok());
  ASSERT_TRUE(Send(*shard, 1, 1, std::vector<float>(8, 0), sink).ok());
  sink->WaitFor(2);
  EXPECT_EQ(Fp32Values(Snapshot(*shard).master), std::vector<float>(8, 0));
}

TEST_F(TensorPresenceTest, StateWithOneCountPerChunkImportsToEveryTensor) {
  auto shard = MakeShard(TwoTensorsInOneChunk(1));
  ChunkSnapshot old_format = Snapshot(*shard);
  old_format.applied_step = 4;
  old_format.optimizer_step = 3;
  old_format.tensor_steps.clear();
  ASSERT_TRUE(shard->ImportChunks({old_format}).ok());
  EXPECT_EQ(Snapshot(*shard).tensor_steps, std::vector<uint64_t>({3, 3}));
  ChunkSnapshot wrong = Snapshot(*shard);
  wrong.tensor_steps = {1};
  EXPECT_EQ(shard->ImportChunks({wrong}).code(),
            absl::StatusCode::kInvalidArgument);
  wrong.tensor_steps = {1, 5};
  EXPECT_EQ(shard->ImportChunks({wrong}).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace depot
