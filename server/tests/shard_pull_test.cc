// A pull reads every chunk of the shard at one step, also while a step is
// half applied: the chunks one step ahead from the weights they keep
// (server/shard_pull.cc).
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/shard_state.h"
#include "server/tests/test_util.h"

namespace depot {
namespace {

using ::depot::testing::Fp32Values;
using ::depot::testing::PlainSgdConfig;
using ::depot::testing::RecordingSink;

// Two chunks of 8 elements, two workers.
JobConfig TwoChunkConfig(DType weight_dtype = DType::kFloat32) {
  JobConfig config = PlainSgdConfig({{"a", 5, 0}, {"b", 6, 1}},
                                    /*num_workers=*/2, /*chunk_elems=*/8,
                                    /*alignment_elems=*/4);
  config.weight_dtype = weight_dtype;
  return config;
}

class ShardPullTest : public ::depot::testing::ShardTest {
 protected:
  void Start(const JobConfig& config, bool noop_update = false) {
    shard_ =
        ShardState::Create(/*job_id=*/1, JobShape::Create(config, 0).value(),
                           &pool_, payloads_, &metrics_, noop_update)
            .value();
    at_step_0_ = Pull(0);
  }

  absl::Status Send(uint64_t step, uint32_t worker, uint64_t chunk) {
    if (absl::Status s = shard_->BeginStep(step, worker, {}, numerics_);
        !s.ok()) {
      return s;
    }
    return shard_->Contribute(Grad(
        step, worker, chunk,
        std::vector<float>(8, 0.25f * (worker + 1) + chunk + step), sink_));
  }

  // Both workers' gradients of every chunk of `step`, applied.
  void Complete(uint64_t step) {
    for (uint64_t chunk = 0; chunk < 2; ++chunk) {
      for (uint32_t worker = 0; worker < 2; ++worker) {
        ASSERT_TRUE(Send(step, worker, chunk).ok());
      }
    }
    // Each chunk's weights go to both workers (the one sink here).
    sink_->WaitFor(delivered_ += 4);
    ASSERT_EQ(shard_->completed_step(), step);
  }

  // Step `step` half applied: chunk 0 has both gradients and is updated,
  // chunk 1 waits for worker 1 (a worker killed in the middle of the step).
  void HalfApply(uint64_t step) {
    ASSERT_TRUE(Send(step, 0, 0).ok());
    ASSERT_TRUE(Send(step, 1, 0).ok());
    ASSERT_TRUE(Send(step, 0, 1).ok());
    sink_->WaitFor(delivered_ += 2);
    ASSERT_EQ(shard_->completed_step(), step - 1);
  }

  absl::Status PullStatus(uint64_t step, DType dtype,
                          std::vector<std::string>* pieces) {
    return shard_->ReadWeights(0, 16, dtype, step,
                               [&](uint64_t, std::string payload) {
                                 pieces->push_back(std::move(payload));
                                 return true;
                               });
  }

  // The whole shard at `step` (0: the completed step) as fp32.
  std::vector<float> Pull(uint64_t step) {
    std::vector<std::string> pieces;
    const absl::Status s = PullStatus(step, DType::kFloat32, &pieces);
    EXPECT_TRUE(s.ok()) << s;
    std::vector<float> out;
    for (const std::string& piece : pieces) {
      for (float v : Fp32Values(piece)) out.push_back(v);
    }
    return out;
  }

  std::shared_ptr<ShardState> shard_;
  std::shared_ptr<RecordingSink> sink_ = std::make_shared<RecordingSink>();
  size_t delivered_ = 0;
  StepNumerics numerics_;  // of the steps Send sends
  std::vector<float> at_step_0_;
};

TEST_F(ShardPullTest, PullWhileAStepWaitsForAWorkerReadsTheCompletedStep) {
  Start(TwoChunkConfig());
  Complete(1);
  const std::vector<float> at_step_1 = Pull(0);
  HalfApply(2);
  EXPECT_EQ(Pull(0), at_step_1);
  EXPECT_EQ(Pull(1), at_step_1);
}

TEST_F(ShardPullTest, PullInTheFirstStepReadsTheInitialWeights) {
  Start(TwoChunkConfig());
  HalfApply(1);
  EXPECT_EQ(Pull(0), at_step_0_);
}

TEST_F(ShardPullTest, PullAtTheStepBeforeTheCompletedOneIsServedWhole) {
  // One server has completed the step, its peer waits: the worker that
  // rejoins pulls the older step from both.
  Start(TwoChunkConfig());
  Complete(1);
  const std::vector<float> at_step_1 = Pull(0);
  Complete(2);
  const std::vector<float> at_step_2 = Pull(0);
  EXPECT_NE(at_step_2, at_step_1);
  EXPECT_EQ(Pull(1), at_step_1);
  EXPECT_EQ(Pull(2), at_step_2);
  // The step's answers are what the pull at the step reads.
  std::vector<float> answered;
  for (const ChunkWeights& answer : sink_->received()) {
    if (answer.chunk_index == 0) answered = Fp32Values(*answer.payload);
  }
  EXPECT_EQ(answered,
            std::vector<float>(at_step_2.begin(), at_step_2.begin() + 8));
}

TEST_F(ShardPullTest, PullAtAStepNoLongerHeldIsFailedPrecondition) {
  Start(TwoChunkConfig());
  Complete(1);
  Complete(2);
  Complete(3);
  std::vector<std::string> pieces;
  const absl::Status s = PullStatus(1, DType::kFloat32, &pieces);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("step 1 is no longer held"), std::string::npos)
      << s;
  EXPECT_NE(s.message().find("at step 3"), std::string::npos) << s;
  EXPECT_TRUE(pieces.empty());
}

TEST_F(ShardPullTest, PullAtAStepNotYetAppliedIsFailedPrecondition) {
  Start(TwoChunkConfig());
  Complete(1);
  HalfApply(2);
  std::vector<std::string> pieces;
  // Chunk 0 is at step 2, chunk 1 is not.
  const absl::Status s = PullStatus(2, DType::kFloat32, &pieces);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("step 2 has not been applied yet"),
            std::string::npos)
      << s;
}

TEST_F(ShardPullTest, Bf16WeightsOfTheStepBeforeArePulledAsBf16Only) {
  Start(TwoChunkConfig(DType::kBFloat16));
  Complete(1);
  std::vector<std::string> at_step_1;
  ASSERT_TRUE(PullStatus(0, DType::kBFloat16, &at_step_1).ok());
  HalfApply(2);
  std::vector<std::string> pieces;
  ASSERT_TRUE(PullStatus(1, DType::kBFloat16, &pieces).ok());
  EXPECT_EQ(pieces, at_step_1);
  // The master of step 1 is gone from chunk 0: only the bf16 weights remain.
  pieces.clear();
  const absl::Status s = PullStatus(1, DType::kFloat32, &pieces);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("only as bf16"), std::string::npos) << s;
}

TEST_F(ShardPullTest, SkippedStepKeepsTheWeightsItAnsweredWith) {
  Start(TwoChunkConfig());
  Complete(1);
  const std::vector<float> at_step_1 = Pull(0);
  numerics_.commit.skip = true;
  Complete(2);
  numerics_ = StepNumerics();
  HalfApply(3);
  EXPECT_EQ(Pull(2), at_step_1);
  EXPECT_EQ(Pull(0), at_step_1);
}

TEST_F(ShardPullTest, ImportDropsTheHistoryAndTheNextUpdateStartsOne) {
  Start(TwoChunkConfig());
  Complete(1);
  Complete(2);
  // Another state of step 2 (the master weights doubled) replaces it.
  std::vector<ChunkSnapshot> saved;
  ASSERT_TRUE(shard_
                  ->ExportChunks([&](ChunkSnapshot chunk) {
                    saved.push_back(std::move(chunk));
                    return true;
                  })
                  .ok());
  for (ChunkSnapshot& chunk : saved) {
    float* master = reinterpret_cast<float*>(chunk.master.data());
    for (size_t i = 0; i < chunk.master.size() / sizeof(float); ++i) {
      master[i] *= 2;
    }
  }
  ASSERT_TRUE(shard_->ImportChunks(saved).ok());
  const std::vector<float> imported = Pull(0);
  EXPECT_EQ(Pull(2), imported);
  // Step 1's weights belonged to the replaced history.
  std::vector<std::string> pieces;
  EXPECT_EQ(PullStatus(1, DType::kFloat32, &pieces).code(),
            absl::StatusCode::kFailedPrecondition);
  // Chunk 0's update of step 3 keeps the imported weights of step 2, not
  // the ones its update of step 2 answered with before the import.
  HalfApply(3);
  EXPECT_EQ(Pull(2), imported);
}

TEST_F(ShardPullTest, NoopUpdateServesTheMasterAtAnyStep) {
  Start(TwoChunkConfig(), /*noop_update=*/true);
  Complete(1);
  Complete(2);
  Complete(3);
  EXPECT_EQ(Pull(1), at_step_0_);
  EXPECT_EQ(Pull(0), at_step_0_);
}

}  // namespace
}  // namespace depot
