#include "server/shard_state.h"

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/job_shape.h"
#include "server/metrics.h"
#include "server/tests/test_util.h"
#include "server/thread_pool.h"

namespace depot {
namespace {

using ::depot::testing::DrainPool;
using ::depot::testing::Fp32Payload;
using ::depot::testing::Fp32Values;
using ::depot::testing::PlainSgdConfig;
using ::depot::testing::RecordingSink;

// Tensor "a" (group 0) is [0, 5), padding [5, 8), tensor "b" (group 1) is
// [8, 14), padding [14, 16). Chunks of 8 elements: chunk 0 = [0, 8), chunk 1 =
// [8, 16).
JobConfig TwoTensorConfig(uint32_t num_workers) {
  return PlainSgdConfig({{"a", 5, 0}, {"b", 6, 1}}, num_workers,
                        /*chunk_elems=*/8, /*alignment_elems=*/4);
}

class ShardStateTest : public ::depot::testing::ShardTest {
 protected:
  // Contributes a gradient of 8 elements (one chunk of TwoTensorConfig) all
  // equal to `value`.
  static absl::Status Send(ShardState& shard, uint64_t step, uint32_t worker,
                           uint64_t chunk, float value,
                           std::shared_ptr<StepReplySink> sink) {
    return shard.Contribute(Grad(
        step, worker, chunk, std::vector<float>(8, value), std::move(sink)));
  }

  static std::vector<float> ReadFp32(const ShardState& shard, uint64_t begin,
                                     uint64_t end) {
    std::vector<float> out;
    EXPECT_TRUE(shard
                    .ReadWeights(begin, end, DType::kFloat32, 0,
                                 [&](uint64_t, std::string payload) {
                                   for (float v : Fp32Values(payload)) {
                                     out.push_back(v);
                                   }
                                   return true;
                                 })
                    .ok());
    return out;
  }
};

TEST_F(ShardStateTest, NewStateIsZeroWeightsAndInitialSlots) {
  JobConfig config = TwoTensorConfig(1);
  config.optimizer.kind = OptimizerKind::kAdagrad;
  config.optimizer.adagrad_initial_accumulator_value = 0.5;
  auto shard = MakeShard(config);
  EXPECT_EQ(ReadFp32(*shard, 0, 16), std::vector<float>(16, 0.0f));
  ChunkSnapshot chunk;
  ASSERT_TRUE(shard
                  ->ExportChunks([&](ChunkSnapshot snapshot) {
                    chunk = std::move(snapshot);
                    return false;
                  })
                  .code() == absl::StatusCode::kCancelled);
  ASSERT_EQ(chunk.slots.size(), 1u);
  // The first tensor's 5 elements; its padding to 8 holds no state.
  EXPECT_EQ(Fp32Values(chunk.slots[0]),
            std::vector<float>({0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0, 0, 0}));
}

// A header more than two steps ahead of the completed step is refused
// (issue 13): recording nothing and answering OK let its chunks be updated
// later with the default settings instead of the header's lr.
TEST_F(ShardStateTest, AHeaderTooFarAheadIsAbortedAndRecordsNothing) {
  auto shard = MakeShard(TwoTensorConfig(1));
  const absl::Status ahead =
      shard->BeginStep(3, 0, {{0, 0.5, 0.0}, {1, 0.5, 0.0}});
  EXPECT_EQ(ahead.code(), absl::StatusCode::kAborted) << ahead;
  EXPECT_THAT(std::string(ahead.message()),
              ::testing::HasSubstr("has completed step 0"));
  // Steps 1 and 2 are still taken, and step 3 once step 1 is complete.
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  ASSERT_TRUE(shard->BeginStep(2, 0, {}).ok());
  // A step number no job can reach is not out of order but invalid.
  EXPECT_EQ(shard->BeginStep(kMaxStep + 1, 0, {}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->BeginStep(0, 0, {}).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ShardStateTest, UpdateRecyclesPayloadsThroughThePayloadPool) {
  auto shard = MakeShard(TwoTensorConfig(2));
  EXPECT_EQ(&shard->payload_pool(), payloads_.get());
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  ASSERT_TRUE(shard->BeginStep(1, 1, {}).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 1, sink).ok());
  ASSERT_TRUE(Send(*shard, 1, 1, 0, 2, sink).ok());
  sink->WaitFor(2);
  DrainPool(pool_);  // the update task has let go of everything
  // Both gradient payloads (8 fp32 each) were given back before the answer
  // went out.
  const size_t given_back = payloads_->free_bytes();
  EXPECT_GE(given_back, 2 * 8 * sizeof(float));
  // The answer is a pool buffer too, which the chunk keeps as its weights of
  // step 1 for pulls at a step (server/shard_pull.cc): it comes back once the
  // sink has let go and two more updates of the chunk have replaced it.
  std::weak_ptr<const std::string> answer = sink->received()[0].payload;
  sink.reset();
  EXPECT_FALSE(answer.expired());
  // Chunk 1 completes step 1 too, so that steps 2 and 3 may start (a step
  // starts once the step two before it is complete on the server).
  auto other = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Send(*shard, 1, 0, 1, 1, other).ok());
  ASSERT_TRUE(Send(*shard, 1, 1, 1, 2, other).ok());
  other->WaitFor(1);
  for (uint64_t step = 2; step <= 3; ++step) {
    auto next = std::make_shared<RecordingSink>();
    ASSERT_TRUE(shard->BeginStep(step, 0, {}).ok());
    ASSERT_TRUE(shard->BeginStep(step, 1, {}).ok());
    ASSERT_TRUE(Send(*shard, step, 0, 0, 1, next).ok());
    ASSERT_TRUE(Send(*shard, step, 1, 0, 2, next).ok());
    next->WaitFor(1);
    DrainPool(pool_);
    EXPECT_EQ(answer.expired(), step == 3) << step;
  }
  EXPECT_GE(payloads_->free_bytes(), given_back + 8 * sizeof(float));
}

TEST_F(ShardStateTest, InitChunkStoresWeightsAndZeroesPadding) {
  auto shard = MakeShard(TwoTensorConfig(1));
  ASSERT_TRUE(
      shard
          ->InitChunk(0, DType::kFloat32, Fp32Payload({1, 2, 3, 4, 5, 6, 7, 8}))
          .ok());
  EXPECT_EQ(ReadFp32(*shard, 0, 8),
            (std::vector<float>{1, 2, 3, 4, 5, 0, 0, 0}));
}

TEST_F(ShardStateTest, InitChunkRejectsWrongPayloadSize) {
  auto shard = MakeShard(TwoTensorConfig(1));
  absl::Status s = shard->InitChunk(0, DType::kFloat32, Fp32Payload({1, 2, 3}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(ReadFp32(*shard, 0, 8), std::vector<float>(8, 0.0f));
}

TEST_F(ShardStateTest, InitChunkRejectsChunkOutsideShard) {
  JobConfig config = TwoTensorConfig(1);
  config.num_servers = 2;  // server 1 holds chunk 1 only
  auto shard = MakeShard(config, /*server_index=*/1);
  absl::Status s =
      shard->InitChunk(0, DType::kFloat32, Fp32Payload(std::vector<float>(8)));
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_NE(s.message().find("chunks [1, 2)"), std::string::npos) << s;
}

TEST_F(ShardStateTest, InitChunkIsRejectedOnceAStepWasApplied) {
  auto shard = MakeShard(TwoTensorConfig(1));
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 0, sink).ok());
  sink->WaitFor(1);
  absl::Status s =
      shard->InitChunk(0, DType::kFloat32, Fp32Payload(std::vector<float>(8)));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

TEST_F(ShardStateTest, InitChunkIsRejectedWhileContributionsArePending) {
  auto shard = MakeShard(TwoTensorConfig(2));
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 0, std::make_shared<RecordingSink>()).ok());
  absl::Status s =
      shard->InitChunk(0, DType::kFloat32, Fp32Payload(std::vector<float>(8)));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

TEST_F(ShardStateTest, ChunkIsUpdatedOnlyOnceEveryWorkerContributed) {
  auto shard = MakeShard(TwoTensorConfig(2));
  ASSERT_TRUE(
      shard
          ->InitChunk(0, DType::kFloat32, Fp32Payload({1, 1, 1, 1, 1, 0, 0, 0}))
          .ok());
  auto sink0 = std::make_shared<RecordingSink>();
  auto sink1 = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  ASSERT_TRUE(shard->BeginStep(1, 1, {}).ok());
  ASSERT_TRUE(
      shard->Contribute(Grad(1, 0, 0, {1, 2, 3, 4, 5, 9, 9, 9}, sink0)).ok());
  DrainPool(pool_);
  EXPECT_TRUE(sink0->received().empty());

  ASSERT_TRUE(
      shard->Contribute(Grad(1, 1, 0, {1, 0, 1, 0, 1, 9, 9, 9}, sink1)).ok());
  const std::vector<float> expected = {0, 0, -1, -1, -2, 0, 0, 0};
  for (const auto& sink : {sink0, sink1}) {
    std::vector<ChunkWeights> got = sink->WaitFor(1);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].chunk_index, 0u);
    EXPECT_FALSE(got[0].replayed);
    EXPECT_EQ(Fp32Values(*got[0].payload), expected);
  }
}

TEST_F(ShardStateTest, ContributionsAreSummedInWorkerRankOrderNotArrivalOrder) {
  // In fp32, (1e8 + 1) + -1e8 == 0 but (1e8 + -1e8) + 1 == 1: only the rank
  // order 0, 1, 2 gives a zero gradient, so the weights stay 0.
  const std::vector<std::vector<float>> grads = {std::vector<float>(8, 1e8f),
                                                 std::vector<float>(8, 1.0f),
                                                 std::vector<float>(8, -1e8f)};
  std::vector<uint32_t> arrival = {0, 1, 2};
  do {
    auto shard = MakeShard(TwoTensorConfig(3));
    auto sink = std::make_shared<RecordingSink>();
    for (uint32_t w : arrival) {
      ASSERT_TRUE(shard->BeginStep(1, w, {}).ok());
      ASSERT_TRUE(shard->Contribute(Grad(1, w, 0, grads[w], sink)).ok());
    }
    sink->WaitFor(3);
    EXPECT_EQ(ReadFp32(*shard, 0, 5), std::vector<float>(5, 0.0f))
        << "arrival order " << arrival[0] << arrival[1] << arrival[2];
  } while (std::next_permutation(arrival.begin(), arrival.end()));
}

// Issue 13: 63 workers sending to a 180 MB job drove the server to 19x its
// budget, held after they timed out. Every payload waiting for its peers is
// charged to the server's budget now, and one that does not fit is refused.
TEST_F(ShardStateTest, PayloadsWaitingForPeersAreChargedToTheBudget) {
  constexpr uint64_t kChunkBytes = 8 * sizeof(float);
  // Room for three waiting payloads, not four.
  auto budget = std::make_shared<MemoryBudget>(3 * kChunkBytes + 1);
  auto shard = ShardState::Create(/*job_id=*/1,
                                  JobShape::Create(TwoTensorConfig(3), 0).value(),
                                  &pool_, payloads_, &metrics_, false, budget)
                   .value();
  auto sink = std::make_shared<RecordingSink>();
  for (uint32_t worker = 0; worker < 3; ++worker) {
    ASSERT_TRUE(shard->BeginStep(1, worker, {}).ok());
  }
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 1, sink).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 1, 1, sink).ok());
  ASSERT_TRUE(Send(*shard, 1, 1, 0, 1, sink).ok());
  EXPECT_EQ(budget->used(), 3 * kChunkBytes);
  EXPECT_EQ(shard->inflight_bytes(), 3 * kChunkBytes);
  // The fourth is refused, and leaves nothing behind.
  const absl::Status refused = Send(*shard, 1, 1, 1, 1, sink);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("memory budget"), std::string::npos);
  EXPECT_EQ(budget->used(), 3 * kChunkBytes);
  // A retry of a waiting payload takes its place and its charge.
  sink->set_open(false);
  auto retry = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 1, retry).ok());
  EXPECT_EQ(budget->used(), 3 * kChunkBytes);
  // What a deleted job still holds leaves the budget with it.
  shard.reset();
  EXPECT_EQ(budget->used(), 0u);
}

// Issue 13: a job's payloads in flight are bounded per job, 1024 chunks per
// worker, apart from the budget: 2 workers, 2100 chunks, so worker 0 alone
// may hold 2048 of its step's payloads and no more. A first step through
// every chunk (summed, updated, given back) must leave the count exact.
TEST_F(ShardStateTest, AJobHoldsAtMostItsPayloadLimitAfterItsUpdates) {
  constexpr uint64_t kChunks = 2100;
  auto shard =
      MakeShard(PlainSgdConfig({{"w", kChunks * 8, 0}}, /*num_workers=*/2,
                               /*chunk_elems=*/8, /*alignment_elems=*/4));
  ASSERT_EQ(ShardState::MaxHeldBytes(shard->shape()),
            2 * ShardState::kHeldChunksPerWorker * 8 * sizeof(float));
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  ASSERT_TRUE(shard->BeginStep(1, 1, {}).ok());
  for (uint64_t chunk = 0; chunk < kChunks; ++chunk) {
    for (uint32_t worker = 0; worker < 2; ++worker) {
      ASSERT_TRUE(Send(*shard, 1, worker, chunk, 1, sink).ok()) << chunk;
    }
    DrainPool(pool_);  // the update, as a worker waits for its answer
  }
  sink->WaitFor(2 * kChunks);
  DrainPool(pool_);
  EXPECT_EQ(shard->inflight_bytes(), 0u);
  ASSERT_TRUE(shard->BeginStep(2, 0, {}).ok());
  for (uint64_t chunk = 0; chunk < 2 * ShardState::kHeldChunksPerWorker;
       ++chunk) {
    ASSERT_TRUE(Send(*shard, 2, 0, chunk, 1, sink).ok()) << chunk;
  }
  const absl::Status refused =
      Send(*shard, 2, 0, 2 * ShardState::kHeldChunksPerWorker, 1, sink);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("the job's limit of"), std::string::npos)
      << refused;
}

// A refused contribution leaves no trace: the chunk may still be initialised
// (InitChunk refuses a chunk with contributions pending).
TEST_F(ShardStateTest, ARefusedContributionLeavesTheChunkAsItWas) {
  auto budget = std::make_shared<MemoryBudget>(8 * sizeof(float) - 1);
  auto shard = ShardState::Create(/*job_id=*/1,
                                  JobShape::Create(TwoTensorConfig(2), 0).value(),
                                  &pool_, payloads_, &metrics_, false, budget)
                   .value();
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  EXPECT_EQ(Send(*shard, 1, 0, 0, 1, sink).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(shard->OldestPendingStep().step, 0u);
  EXPECT_TRUE(shard->InitChunk(0, DType::kFloat32,
                               Fp32Payload(std::vector<float>(8, 1.0f)))
                  .ok());
  EXPECT_EQ(budget->used(), 0u);
}

TEST_F(ShardStateTest, AnUpdateGivesItsPayloadsBackToTheBudget) {
  auto budget = std::make_shared<MemoryBudget>(1 << 20);
  auto shard = ShardState::Create(/*job_id=*/1,
                                  JobShape::Create(TwoTensorConfig(2), 0).value(),
                                  &pool_, payloads_, &metrics_, false, budget)
                   .value();
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  ASSERT_TRUE(shard->BeginStep(1, 1, {}).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 1, sink).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 1, 1, sink).ok());
  EXPECT_EQ(budget->used(), 2 * 8 * sizeof(float));
  ASSERT_TRUE(Send(*shard, 1, 1, 0, 1, sink).ok());
  sink->WaitFor(1);
  DrainPool(pool_);
  // Chunk 0's two payloads are back; chunk 1's one still waits.
  EXPECT_EQ(budget->used(), 8 * sizeof(float));
  EXPECT_EQ(shard->inflight_bytes(), 8 * sizeof(float));
}

TEST_F(ShardStateTest, RolledBackPayloadsLeaveTheBudget) {
  auto budget = std::make_shared<MemoryBudget>(1 << 20);
  auto shard = ShardState::Create(/*job_id=*/1,
                                  JobShape::Create(TwoTensorConfig(2), 0).value(),
                                  &pool_, payloads_, &metrics_, false, budget)
                   .value();
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 1, sink).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 1, 1, sink).ok());
  EXPECT_EQ(budget->used(), 2 * 8 * sizeof(float));
  shard->BeginRollBack();
  EXPECT_EQ(shard->DropInFlight(), 2u);
  shard->EndRollBack();
  EXPECT_EQ(budget->used(), 0u);
}

// A chunk outside the shard or of the wrong size is refused before its
// payload is copied anywhere (the Step reader checks first).
TEST_F(ShardStateTest, GradientPayloadIsCheckedBeforeItIsCopied) {
  auto shard = MakeShard(TwoTensorConfig(1));
  EXPECT_TRUE(shard->CheckGradientPayload(1, 8 * sizeof(float)).ok());
  EXPECT_EQ(shard->CheckGradientPayload(2, 8 * sizeof(float)).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(shard->CheckGradientPayload(0, 7 * sizeof(float)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ShardStateTest, DuplicateContributionFromAnOpenStreamIsAlreadyExists) {
  auto shard = MakeShard(TwoTensorConfig(2));
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 1, {}).ok());
  ASSERT_TRUE(Send(*shard, 1, 1, 0, 0, sink).ok());
  absl::Status s = Send(*shard, 1, 1, 0, 0, sink);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_EQ(s.message(),
            "duplicate contribution: worker 1 already sent chunk 0 of step 1");
}

TEST_F(ShardStateTest, RetryAfterTheFirstStreamEndedReplacesItsContribution) {
  auto shard = MakeShard(TwoTensorConfig(2));
  auto first = std::make_shared<RecordingSink>();
  auto retry = std::make_shared<RecordingSink>();
  auto other = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 4, first).ok());
  first->set_open(false);
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 2, retry).ok());
  ASSERT_TRUE(shard->BeginStep(1, 1, {}).ok());
  ASSERT_TRUE(Send(*shard, 1, 1, 0, 0, other).ok());

  std::vector<ChunkWeights> got = retry->WaitFor(1);
  other->WaitFor(1);
  EXPECT_TRUE(first->received().empty());
  EXPECT_EQ(Fp32Values(*got[0].payload),
            (std::vector<float>{-1, -1, -1, -1, -1, 0, 0, 0}));
}

TEST_F(ShardStateTest, StepAheadOfTheNextIsAborted) {
  auto shard = MakeShard(TwoTensorConfig(1));
  ASSERT_TRUE(shard->BeginStep(2, 0, {}).ok());
  absl::Status s = Send(*shard, 2, 0, 0, 0, std::make_shared<RecordingSink>());
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_EQ(s.message(),
            "step 2 is out of order for chunk 0: its last applied step is 0");
}

TEST_F(ShardStateTest, ResentContributionForTheAppliedStepReplaysItsWeights) {
  auto shard = MakeShard(TwoTensorConfig(1));
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 2, sink).ok());
  const ChunkWeights updated = sink->WaitFor(1)[0];
  const uint64_t checksum = shard->Checksum();

  auto resend = std::make_shared<RecordingSink>();
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 2, resend).ok());
  const std::vector<ChunkWeights> replayed = resend->received();
  ASSERT_EQ(replayed.size(), 1u);
  EXPECT_TRUE(replayed[0].replayed);
  EXPECT_EQ(*replayed[0].payload, *updated.payload);
  EXPECT_EQ(shard->Checksum(), checksum);
}

TEST_F(ShardStateTest, RejectedContributionLeavesNoTrace) {
  auto shard = MakeShard(TwoTensorConfig(2));
  const uint64_t checksum = shard->Checksum();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  absl::Status s = shard->Contribute(
      Grad(1, 0, 0, {1, 2, 3}, std::make_shared<RecordingSink>()));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(shard->Checksum(), checksum);
  // No contribution is pending: the chunk may still be initialised.
  EXPECT_TRUE(
      shard->InitChunk(0, DType::kFloat32, Fp32Payload(std::vector<float>(8)))
          .ok());
}

TEST_F(ShardStateTest, StepGroupHyperParamsOverrideTheJobConfig) {
  auto shard = MakeShard(TwoTensorConfig(1));
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {{/*param_group=*/1, 0.25, 0.0}}).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 4, sink).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 1, 4, sink).ok());
  sink->WaitFor(2);
  EXPECT_EQ(ReadFp32(*shard, 0, 16),
            (std::vector<float>{-2, -2, -2, -2, -2, 0, 0, 0,      // lr 0.5
                                -1, -1, -1, -1, -1, -1, 0, 0}));  // lr 0.25
}

TEST_F(ShardStateTest, BeginStepRejectsWorkerRankOutOfRange) {
  auto shard = MakeShard(TwoTensorConfig(2));
  EXPECT_EQ(shard->BeginStep(1, 2, {}).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ShardStateTest, BeginStepRejectsStepZero) {
  auto shard = MakeShard(TwoTensorConfig(1));
  EXPECT_EQ(shard->BeginStep(0, 0, {}).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ShardStateTest, BeginStepRejectsParamGroupNotInLayout) {
  auto shard = MakeShard(TwoTensorConfig(1));
  EXPECT_EQ(shard->BeginStep(1, 0, {{7, 0.1, 0.0}}).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ShardStateTest, BeginStepRejectsNegativeOrNonFiniteHyperParams) {
  auto shard = MakeShard(TwoTensorConfig(1));
  EXPECT_EQ(shard->BeginStep(1, 0, {{0, -0.1, 0.0}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->BeginStep(1, 0, {{0, 0.1, std::nan("")}}).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ShardStateTest, BeginStepRejectsHyperParamsDifferentFromTheStepsFirst) {
  auto shard = MakeShard(TwoTensorConfig(2));
  ASSERT_TRUE(shard->BeginStep(1, 0, {{0, 0.1, 0.0}}).ok());
  EXPECT_TRUE(shard->BeginStep(1, 1, {{0, 0.1, 0.0}}).ok());
  EXPECT_EQ(shard->BeginStep(1, 1, {{0, 0.2, 0.0}}).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(ShardStateTest, StepCompletesWhenEveryChunkOfTheShardAppliedIt) {
  auto shard = MakeShard(TwoTensorConfig(1));
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 0, 0, sink).ok());
  sink->WaitFor(1);
  EXPECT_EQ(shard->completed_step(), 0u);
  ASSERT_TRUE(Send(*shard, 1, 0, 1, 0, sink).ok());
  sink->WaitFor(2);
  EXPECT_EQ(shard->completed_step(), 1u);
  EXPECT_EQ(metrics_.steps_completed.Value(), 1.0);
  EXPECT_EQ(metrics_.chunks_updated.Value(), 2.0);
}

TEST_F(ShardStateTest, ReadWeightsSendsOnePiecePerChunkTouched) {
  auto shard = MakeShard(TwoTensorConfig(1));
  std::vector<std::pair<uint64_t, size_t>> pieces;
  ASSERT_TRUE(shard
                  ->ReadWeights(3, 13, DType::kBFloat16, 0,
                                [&](uint64_t offset, std::string payload) {
                                  pieces.emplace_back(offset, payload.size());
                                  return true;
                                })
                  .ok());
  EXPECT_EQ(pieces,
            (std::vector<std::pair<uint64_t, size_t>>{{3, 10}, {8, 10}}));
}

TEST_F(ShardStateTest, ReadWeightsRejectsRangeOutsideTheShard) {
  auto shard = MakeShard(TwoTensorConfig(1));
  auto emit = [](uint64_t, std::string) { return true; };
  EXPECT_EQ(shard->ReadWeights(4, 17, DType::kFloat32, 0, emit).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(shard->ReadWeights(5, 4, DType::kFloat32, 0, emit).code(),
            absl::StatusCode::kOutOfRange);
}

TEST_F(ShardStateTest, DeletedJobRejectsContributions) {
  auto shard = MakeShard(TwoTensorConfig(1));
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  shard->MarkDeleted();
  absl::Status s = Send(*shard, 1, 0, 0, 0, std::make_shared<RecordingSink>());
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
}

// Three Adam steps, three workers, four chunks of two tensors, with a loss
// scale and a clip coefficient: once with one update thread and contributions
// in rank order, once with four pinned threads and a shuffled arrival order.
// The state and the weights answered must be bitwise identical.
struct StepOutcome {
  uint64_t state_checksum = 0;
  std::vector<std::string> last_weights;  // by chunk, the last step's answer
};

StepOutcome AdamSteps(int threads, bool shuffle) {
  JobConfig config;
  config.name = "determinism";
  config.tensors = {{"w", 100, 0}, {"b", 20, 1}};
  config.num_workers = 3;
  config.optimizer.kind = OptimizerKind::kAdamW;
  config.grad_dtype = DType::kBFloat16;
  config.weight_dtype = DType::kBFloat16;
  config.chunk_elems = 32;
  config.alignment_elems = 16;
  prometheus::Registry registry;
  ServerMetrics metrics(registry);
  ThreadPool pool(threads, /*pin_threads=*/threads > 1);
  auto shard = ShardState::Create(1, JobShape::Create(config, 0).value(), &pool,
                                  PayloadPool::Create(1 << 20), &metrics)
                   .value();
  const ShardRange range = shard->shape().shard();

  std::mt19937 rng(42);
  std::normal_distribution<float> normal;
  std::vector<float> init(range.size());
  for (float& v : init) v = normal(rng);
  for (uint64_t c = range.first_chunk; c < range.end_chunk; ++c) {
    const ChunkRange chunk = shard->shape().plan().chunk(c);
    EXPECT_TRUE(shard
                    ->InitChunk(c, DType::kFloat32,
                                Fp32Payload(std::vector<float>(
                                    init.begin() + chunk.begin,
                                    init.begin() + chunk.end)))
                    .ok());
  }
  StepOutcome outcome;
  std::mt19937 order_rng(7);
  for (uint64_t step = 1; step <= 3; ++step) {
    struct Item {
      uint32_t worker;
      uint64_t chunk;
    };
    std::vector<Item> items;
    for (uint64_t c = range.first_chunk; c < range.end_chunk; ++c) {
      for (uint32_t w = 0; w < 3; ++w) items.push_back({w, c});
    }
    if (shuffle) std::shuffle(items.begin(), items.end(), order_rng);
    auto sink = std::make_shared<RecordingSink>();
    StepNumerics numerics;
    numerics.loss_scale = 1024;
    numerics.commit.clip_coef = 0.75;
    for (uint32_t w = 0; w < 3; ++w)
      EXPECT_TRUE(shard->BeginStep(step, w, {}, numerics).ok());
    for (const Item& item : items) {
      const ChunkRange chunk = shard->shape().plan().chunk(item.chunk);
      std::string payload(chunk.size() * 2, '\0');
      std::vector<float> grad(chunk.size());
      // The gradient depends on (step, worker, chunk) only, not on the order.
      std::mt19937 grad_rng(step * 1000 + item.worker * 100 + item.chunk);
      std::normal_distribution<float> grad_dist;
      for (float& g : grad) g = 1024 * grad_dist(grad_rng);
      ConvertFromFloat(grad.data(), DType::kBFloat16, payload.data(),
                       grad.size());
      Contribution c;
      c.step = step;
      c.worker_rank = item.worker;
      c.chunk_index = item.chunk;
      c.payload = std::move(payload);
      c.sink = sink;
      EXPECT_TRUE(shard->Contribute(std::move(c)).ok());
    }
    const std::vector<ChunkWeights> answers = sink->WaitFor(items.size());
    outcome.last_weights.assign(range.num_chunks(), "");
    for (const ChunkWeights& answer : answers) {
      std::string& kept =
          outcome.last_weights[answer.chunk_index - range.first_chunk];
      // Every worker of a chunk gets the same answer.
      if (!kept.empty()) {
        EXPECT_EQ(kept, *answer.payload);
      }
      kept = *answer.payload;
    }
  }
  EXPECT_EQ(shard->completed_step(), 3u);
  outcome.state_checksum = shard->Checksum();
  return outcome;
}

TEST(ShardStateDeterminismTest,
     StateAndWeightsAreIndependentOfArrivalOrderAndThreadCount) {
  const StepOutcome serial = AdamSteps(/*threads=*/1, /*shuffle=*/false);
  const StepOutcome parallel = AdamSteps(/*threads=*/4, /*shuffle=*/true);
  EXPECT_EQ(serial.state_checksum, parallel.state_checksum);
  EXPECT_TRUE(serial.last_weights == parallel.last_weights);
}

}  // namespace
}  // namespace depot
