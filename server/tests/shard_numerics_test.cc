// ShardState's handling of a step's numerics: loss-scale unscaling, a known
// clip coefficient or skip (one phase), and the two-phase flow of acks,
// gradient statistics and commits.
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/job_shape.h"
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

// Tensor "a" is [0, 5), tensor "b" [8, 14), the rest padding; chunks of 8:
// chunk 0 = [0, 8), chunk 1 = [8, 16). SGD w - 0.5 * g.
JobConfig TwoChunkConfig(uint32_t num_workers) {
  return PlainSgdConfig({{"a", 5, 0}, {"b", 6, 1}}, num_workers,
                        /*chunk_elems=*/8, /*alignment_elems=*/4);
}

StepNumerics Scaled(double loss_scale) {
  StepNumerics numerics;
  numerics.loss_scale = loss_scale;
  return numerics;
}

StepNumerics Known(double clip_coef, bool skip) {
  StepNumerics numerics;
  numerics.commit = {clip_coef, skip};
  return numerics;
}

StepNumerics TwoPhase() {
  StepNumerics numerics;
  numerics.two_phase = true;
  return numerics;
}

class ShardNumericsTest : public ::depot::testing::ShardTest {
 protected:
  // Contributes worker's chunk `chunk` for `step`, every element `value`.
  static absl::Status Send(ShardState& shard, uint64_t step, uint32_t worker,
                           uint64_t chunk, float value,
                           std::shared_ptr<StepReplySink> sink) {
    return shard.Contribute(
        Grad(step, worker, chunk, std::vector<float>(8, value), std::move(sink)));
  }

  static std::vector<float> WeightsOf(const ChunkWeights& weights) {
    return Fp32Values(*weights.payload);
  }
};

// What chunk 0 holds after w = 0 - 0.5 * g with g on tensor "a" elements.
std::vector<float> ChunkZeroAfter(float update) {
  return {update, update, update, update, update, 0, 0, 0};
}

TEST_F(ShardNumericsTest, LossScaleIsDividedOutOfTheWorkersSum) {
  auto shard = MakeShard(TwoChunkConfig(2));
  auto sink = std::make_shared<RecordingSink>();
  for (uint32_t w : {0u, 1u}) {
    ASSERT_TRUE(shard->BeginStep(1, w, {}, Scaled(4.0)).ok());
  }
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 4.0f, sink).ok());
  ASSERT_TRUE(Send(*shard, 1, 1, 0, 8.0f, sink).ok());
  // (4 + 8) * 0.25 = 3; w = -0.5 * 3.
  EXPECT_EQ(WeightsOf(sink->WaitFor(2)[0]), ChunkZeroAfter(-1.5f));
}

TEST_F(ShardNumericsTest, KnownClipCoefficientScalesTheGradient) {
  auto shard = MakeShard(TwoChunkConfig(1));
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}, Known(0.25, false)).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 4.0f, sink).ok());
  EXPECT_EQ(WeightsOf(sink->WaitFor(1)[0]), ChunkZeroAfter(-0.5f));
}

TEST_F(ShardNumericsTest, KnownSkipChangesNoStateButCompletesTheStep) {
  auto shard = MakeShard(TwoChunkConfig(1));
  ASSERT_TRUE(
      shard
          ->InitChunk(0, DType::kFloat32, Fp32Payload({1, 2, 3, 4, 5, 0, 0, 0}))
          .ok());
  const uint64_t checksum = shard->Checksum();
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}, Known(1.0, true)).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 7.0f, sink).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 1, 7.0f, sink).ok());
  std::vector<ChunkWeights> got = sink->WaitFor(2);
  for (const ChunkWeights& weights : got) {
    if (weights.chunk_index == 0) {
      EXPECT_EQ(WeightsOf(weights),
                (std::vector<float>{1, 2, 3, 4, 5, 0, 0, 0}));
    }
  }
  EXPECT_EQ(shard->Checksum(), checksum);
  EXPECT_EQ(shard->completed_step(), 1u);
}

TEST_F(ShardNumericsTest, SkippedStepDoesNotAdvanceTheOptimizerStepCount) {
  // SGD with momentum 0.9 and dampening 0.5: the first optimizer step sets
  // buf = g, a later one buf = 0.9 * buf + 0.5 * g. After a skipped step 1,
  // step 2 must be the first: w = -0.5 * 2, not -0.5 * (0.5 * 2).
  JobConfig config = TwoChunkConfig(1);
  config.optimizer.sgd_momentum = 0.9;
  config.optimizer.sgd_dampening = 0.5;
  auto shard = MakeShard(config);
  auto skipped = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}, Known(1.0, true)).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 2.0f, skipped).ok());
  skipped->WaitFor(1);
  auto applied = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(2, 0, {}).ok());
  ASSERT_TRUE(Send(*shard, 2, 0, 0, 2.0f, applied).ok());
  EXPECT_EQ(WeightsOf(applied->WaitFor(1)[0]), ChunkZeroAfter(-1.0f));
}

TEST_F(ShardNumericsTest, TwoPhaseAcksSummedChunksThenSendsStatsNotWeights) {
  auto shard = MakeShard(TwoChunkConfig(2));
  auto sink0 = std::make_shared<RecordingSink>();
  auto sink1 = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}, TwoPhase(), sink0).ok());
  ASSERT_TRUE(shard->BeginStep(1, 1, {}, TwoPhase(), sink1).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 1.0f, sink0).ok());
  ASSERT_TRUE(Send(*shard, 1, 1, 0, 2.0f, sink1).ok());
  DrainPool(pool_);
  EXPECT_EQ(sink0->acks(), (std::vector<uint64_t>{0}));
  EXPECT_EQ(sink1->acks(), (std::vector<uint64_t>{0}));
  EXPECT_TRUE(sink0->grad_stats().empty());

  ASSERT_TRUE(Send(*shard, 1, 0, 1, 0.0f, sink0).ok());
  ASSERT_TRUE(Send(*shard, 1, 1, 1, 0.0f, sink1).ok());
  DrainPool(pool_);
  for (const auto& sink : {sink0, sink1}) {
    EXPECT_EQ(sink->acks(), (std::vector<uint64_t>{0, 1}));
    ASSERT_EQ(sink->grad_stats().size(), 1u);
    const GradStats stats = sink->grad_stats()[0];
    EXPECT_EQ(stats.sum_squares, 5 * 9.0);  // five elements of 1 + 2
    EXPECT_EQ(stats.max_abs, 3.0);
    EXPECT_FALSE(stats.non_finite);
    EXPECT_EQ(stats.zero_count, 6u);  // tensor "b" in chunk 1
    EXPECT_TRUE(sink->received().empty());
  }
  EXPECT_EQ(shard->completed_step(), 0u);
}

TEST_F(ShardNumericsTest, TwoPhaseCommitStartsTheUpdatesWithItsCoefficient) {
  auto shard = MakeShard(TwoChunkConfig(1));
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}, TwoPhase(), sink).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 4.0f, sink).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 1, 4.0f, sink).ok());
  sink->WaitForGradStats();
  ASSERT_TRUE(shard->Commit(1, {0.5, false}).ok());
  std::vector<ChunkWeights> got = sink->WaitFor(2);
  for (const ChunkWeights& weights : got) {
    if (weights.chunk_index == 0) {
      EXPECT_EQ(WeightsOf(weights), ChunkZeroAfter(-1.0f));
    }
  }
  EXPECT_EQ(shard->completed_step(), 1u);
  // A second worker's identical commit is accepted and changes nothing.
  EXPECT_TRUE(shard->Commit(1, {0.5, false}).ok());
}

TEST_F(ShardNumericsTest, TwoPhaseLossScaleIsUndoneBeforeTheStats) {
  auto shard = MakeShard(TwoChunkConfig(1));
  auto sink = std::make_shared<RecordingSink>();
  StepNumerics numerics = TwoPhase();
  numerics.loss_scale = 8.0;
  ASSERT_TRUE(shard->BeginStep(1, 0, {}, numerics, sink).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 16.0f, sink).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 1, 16.0f, sink).ok());
  const GradStats stats = sink->WaitForGradStats();
  EXPECT_EQ(stats.max_abs, 2.0);
  EXPECT_EQ(stats.sum_squares, 11 * 4.0);
}

TEST_F(ShardNumericsTest, CommitBeforeEveryChunkIsSummedLeavesStateAsItWas) {
  auto shard = MakeShard(TwoChunkConfig(1));
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}, TwoPhase(), sink).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 4.0f, sink).ok());
  DrainPool(pool_);
  const uint64_t checksum = shard->Checksum();
  absl::Status s = shard->Commit(1, {1.0, false});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  DrainPool(pool_);
  EXPECT_TRUE(sink->received().empty());
  EXPECT_EQ(shard->Checksum(), checksum);
  // The step goes on once the last chunk is in.
  ASSERT_TRUE(Send(*shard, 1, 0, 1, 4.0f, sink).ok());
  sink->WaitForGradStats();
  EXPECT_TRUE(shard->Commit(1, {1.0, false}).ok());
  sink->WaitFor(2);
}

TEST_F(ShardNumericsTest, NonFiniteShardIsSkippedWithStateUnchanged) {
  auto shard = MakeShard(TwoChunkConfig(1));
  const uint64_t checksum = shard->Checksum();
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}, TwoPhase(), sink).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 1.0f, sink).ok());
  ASSERT_TRUE(
      Send(*shard, 1, 0, 1, std::numeric_limits<float>::infinity(), sink).ok());
  EXPECT_TRUE(sink->WaitForGradStats().non_finite);
  EXPECT_EQ(shard->Commit(1, {1.0, false}).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(shard->Commit(1, {1.0, true}).ok());
  sink->WaitFor(2);
  EXPECT_EQ(shard->Checksum(), checksum);
  EXPECT_EQ(shard->completed_step(), 1u);
}

TEST_F(ShardNumericsTest, CommitOfAOnePhaseStepIsFailedPrecondition) {
  auto shard = MakeShard(TwoChunkConfig(1));
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  absl::Status s = shard->Commit(1, {1.0, false});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

TEST_F(ShardNumericsTest, HeadersOfOneStepMustAgreeOnTheNumerics) {
  auto shard = MakeShard(TwoChunkConfig(2));
  ASSERT_TRUE(shard->BeginStep(1, 0, {}, Scaled(2.0)).ok());
  absl::Status s = shard->BeginStep(1, 1, {}, Scaled(4.0));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  auto sink = std::make_shared<RecordingSink>();
  s = shard->BeginStep(1, 1, {}, TwoPhase(), sink);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

TEST_F(ShardNumericsTest, InvalidNumericsAreInvalidArgument) {
  auto shard = MakeShard(TwoChunkConfig(1));
  EXPECT_EQ(shard->BeginStep(1, 0, {}, Scaled(0.0)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->BeginStep(1, 0, {}, Known(1.5, false)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->BeginStep(1, 0, {}, TwoPhase(), nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  // None of them fixed the step's numerics.
  EXPECT_TRUE(shard->BeginStep(1, 0, {}, Scaled(2.0)).ok());
}

TEST_F(ShardNumericsTest, TwoPhaseRetryOfASummedChunkIsAckedAtOnce) {
  auto shard = MakeShard(TwoChunkConfig(1));
  auto first = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}, TwoPhase(), first).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 1.0f, first).ok());
  DrainPool(pool_);
  EXPECT_EQ(first->acks(), (std::vector<uint64_t>{0}));
  first->set_open(false);  // its stream broke

  auto retry = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}, TwoPhase(), retry).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 1.0f, retry).ok());
  EXPECT_EQ(retry->acks(), (std::vector<uint64_t>{0}));
  ASSERT_TRUE(Send(*shard, 1, 0, 1, 1.0f, retry).ok());
  retry->WaitForGradStats();
  ASSERT_TRUE(shard->Commit(1, {1.0, false}).ok());
  EXPECT_EQ(retry->WaitFor(2).size(), 2u);
}

}  // namespace
}  // namespace depot
