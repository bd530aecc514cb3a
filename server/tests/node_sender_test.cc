// Node workers on the server (docs/protocol.md, "Node workers"): the header's
// node shape is checked (NodeSender::FromHeader), a local rank may send only
// the chunks NodePartition gives it (Contribute, OverrideWeights), and every
// stream of a worker's step declares the same shape (BeginStep). A rejected
// request leaves no trace.
#include "server/node_sender.h"

#include <memory>
#include <string>
#include <vector>

#include "depot/node_partition.h"
#include "depot/shard_plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard_state.h"
#include "server/tests/test_util.h"

namespace depot {
namespace {

using ::depot::testing::Fp32Payload;
using ::depot::testing::Fp32Values;
using ::depot::testing::PlainSgdConfig;
using ::depot::testing::RecordingSink;
using ::testing::HasSubstr;

ShardPlan SevenChunks() { return *ShardPlan::Create(7 * 8, 1, 8); }

TEST(NodeSenderTest, NoLocalRanksIsOneProcessThatMaySendAnyChunk) {
  absl::StatusOr<NodeSender> sender =
      NodeSender::FromHeader(SevenChunks(), 0, 0, 0);
  ASSERT_TRUE(sender.ok()) << sender.status();
  EXPECT_FALSE(sender->is_node());
  EXPECT_EQ(sender->shape(), NodeShape());
  for (uint64_t chunk = 0; chunk < 7; ++chunk) {
    EXPECT_TRUE(sender->CheckOwns("chunk", chunk, 1, 0).ok());
  }
}

TEST(NodeSenderTest, LocalRankOrBucketChunksWithoutLocalRanksIsInvalid) {
  for (const auto& [rank, bucket] :
       std::vector<std::pair<uint32_t, uint64_t>>{{1, 0}, {0, 4}, {1, 4}}) {
    absl::StatusOr<NodeSender> sender =
        NodeSender::FromHeader(SevenChunks(), 0, rank, bucket);
    ASSERT_FALSE(sender.ok());
    EXPECT_EQ(sender.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(sender.status().message(), HasSubstr("local_ranks is 0"));
  }
}

TEST(NodeSenderTest, BadShapesAreInvalidArgumentNamingTheField) {
  struct Case {
    uint32_t local_ranks;
    uint32_t local_rank;
    uint64_t bucket_chunks;
    const char* expected;
  };
  for (const Case& c : std::vector<Case>{
           {2, 0, 0, "bucket_chunks: must be a positive multiple of "
                     "local_ranks (2), is 0"},
           {2, 0, 3, "bucket_chunks: must be a positive multiple of "
                     "local_ranks (2), is 3"},
           {2, 2, 4, "local_rank 2 is out of range: the node has 2 local "
                     "ranks"},
           {4, 7, 4, "local_rank 7 is out of range"},
           {NodeSender::kMaxLocalRanks + 1, 0,
            uint64_t{NodeSender::kMaxLocalRanks + 1},
            "local_ranks is 1025, more than the 1024"},
           {0xffffffffu, 0, 0xffffffffull, "more than the 1024"},
       }) {
    absl::StatusOr<NodeSender> sender = NodeSender::FromHeader(
        SevenChunks(), c.local_ranks, c.local_rank, c.bucket_chunks);
    ASSERT_FALSE(sender.ok()) << c.expected;
    EXPECT_EQ(sender.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(sender.status().message(), HasSubstr(c.expected));
  }
}

TEST(NodeSenderTest, ALocalRankOwnsExactlyWhatNodePartitionGivesIt) {
  const ShardPlan plan = SevenChunks();
  // Buckets of 4 over 7 chunks: [0, 4) and [4, 7) (padded to 8); a bucket
  // larger than the model is one bucket.
  for (uint64_t bucket_chunks : {4, 6, 8, 1000}) {
    const NodePartition partition = *NodePartition::Create(plan, 2,
                                                           bucket_chunks);
    for (uint32_t rank = 0; rank < 2; ++rank) {
      const NodeSender sender = *NodeSender::FromHeader(plan, 2, rank,
                                                        bucket_chunks);
      EXPECT_EQ(sender.shape(), (NodeShape{2, bucket_chunks}));
      for (uint64_t chunk = 0; chunk < 7; ++chunk) {
        EXPECT_EQ(sender.CheckOwns("chunk", chunk, 1, 0).ok(),
                  partition.OwnerOfChunk(chunk) == rank)
            << "bucket_chunks " << bucket_chunks << " rank " << rank
            << " chunk " << chunk;
      }
    }
  }
}

TEST(NodeSenderTest, TheWrongOwnerIsNamedInTheMessage) {
  const NodeSender rank0 = *NodeSender::FromHeader(SevenChunks(), 2, 0, 4);
  // Bucket [4, 8): rank 0 owns 4, 5; rank 1 owns 6 (7 is a phantom).
  absl::Status s = rank0.CheckOwns("chunk", 6, 3, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "chunk 6 of step 3 belongs to local rank 1 of worker 1's 2 local "
            "ranks (bucket_chunks 4), but local rank 0 sent it");
}

// Tensor "a" of 20 elements in chunks of 4 with no padding: 5 chunks, all
// one tensor. SGD lr 0.5: w - 0.5 * sum.
JobConfig FiveChunks(uint32_t num_workers) {
  return PlainSgdConfig({{"a", 20, 0}}, num_workers, /*chunk_elems=*/4,
                        /*alignment_elems=*/4);
}

class NodeShardTest : public ::depot::testing::ShardTest {
 protected:
  static Contribution NodeGrad(uint64_t step, uint32_t worker, uint64_t chunk,
                               float value, const NodeSender& sender,
                               std::shared_ptr<StepReplySink> sink) {
    Contribution c =
        Grad(step, worker, chunk, std::vector<float>(4, value), std::move(sink));
    c.sender = sender;
    return c;
  }
};

TEST_F(NodeShardTest, AChunkFromTheWrongLocalRankIsRejectedAndLeavesNoTrace) {
  auto shard = MakeShard(FiveChunks(1));
  const ShardPlan& plan = shard->shape().plan();
  const NodeSender rank0 = *NodeSender::FromHeader(plan, 2, 0, 2);
  const NodeSender rank1 = *NodeSender::FromHeader(plan, 2, 1, 2);
  const uint64_t checksum = shard->Checksum();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}, {}, {}, {}, rank0.shape()).ok());
  auto sink = std::make_shared<RecordingSink>();
  // Buckets of 2: rank 1 owns chunks 1 and 3 (and bucket [4, 6)'s phantom).
  absl::Status s = shard->Contribute(NodeGrad(1, 0, 1, 2.0f, rank0, sink));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(),
            "chunk 1 of step 1 belongs to local rank 1 of worker 0's 2 local "
            "ranks (bucket_chunks 2), but local rank 0 sent it");
  s = shard->OverrideWeights(1, 0, 3, {0, Fp32Payload({1.0f})}, rank0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("weights override: chunk 3 of step 1 "
                                     "belongs to local rank 1"));
  EXPECT_EQ(shard->Checksum(), checksum);
  EXPECT_EQ(shard->OldestPendingStep().step, 0u);
  // Nothing pending: chunk 1 may still be initialised.
  EXPECT_TRUE(
      shard->InitChunk(1, DType::kFloat32, Fp32Payload({0, 0, 0, 0})).ok());

  // The owner's chunk is taken, and with W = 1 updated at once.
  ASSERT_TRUE(shard->BeginStep(1, 0, {}, {}, {}, {}, rank1.shape()).ok());
  ASSERT_TRUE(shard->Contribute(NodeGrad(1, 0, 1, 2.0f, rank1, sink)).ok());
  const std::vector<ChunkWeights> got = sink->WaitFor(1);
  EXPECT_EQ(got[0].chunk_index, 1u);
  EXPECT_EQ(Fp32Values(*got[0].payload), (std::vector<float>(4, -1.0f)));
}

TEST_F(NodeShardTest, EveryStreamOfAWorkersStepDeclaresTheSameShape) {
  auto shard = MakeShard(FiveChunks(2));
  ASSERT_TRUE(shard->BeginStep(1, 0, {}, {}, {}, {}, NodeShape{2, 2}).ok());
  // Another local rank of the same shape, and another worker of another
  // shape, are fine.
  ASSERT_TRUE(shard->BeginStep(1, 0, {}, {}, {}, {}, NodeShape{2, 2}).ok());
  ASSERT_TRUE(shard->BeginStep(1, 1, {}, {}, {}, {}, NodeShape{4, 8}).ok());
  ASSERT_TRUE(shard->BeginStep(1, 1, {}, {}, {}, {}, NodeShape{4, 8}).ok());

  absl::Status s = shard->BeginStep(1, 0, {}, {}, {}, {}, NodeShape{2, 4});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(),
            "worker 0 in step 1 declares itself 2 local ranks, bucket_chunks 4 "
            "but its earlier Step stream of the step declared 2 local ranks, "
            "bucket_chunks 2: every stream of a worker's step must send the "
            "same local_ranks and bucket_chunks");
  s = shard->BeginStep(1, 1, {}, {}, {}, {}, NodeShape());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("declares itself one process "
                                     "(local_ranks 0) but its earlier Step "
                                     "stream of the step declared 4 local "
                                     "ranks, bucket_chunks 8"));
  // The rejected headers fixed nothing: the first shapes still hold.
  EXPECT_TRUE(shard->BeginStep(1, 0, {}, {}, {}, {}, NodeShape{2, 2}).ok());
  EXPECT_TRUE(shard->BeginStep(1, 1, {}, {}, {}, {}, NodeShape{4, 8}).ok());
}

TEST_F(NodeShardTest, ALegacyWorkerCannotBecomeANodeWithinAStep) {
  auto shard = MakeShard(FiveChunks(1));
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  absl::Status s = shard->BeginStep(1, 0, {}, {}, {}, {}, NodeShape{2, 2});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("earlier Step stream of the step "
                                     "declared one process (local_ranks 0)"));
}

TEST_F(NodeShardTest, ANodesShapeMayChangeFromOneStepToTheNext) {
  auto shard = MakeShard(FiveChunks(1));
  const ShardPlan& plan = shard->shape().plan();
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  for (uint64_t chunk = 0; chunk < 5; ++chunk) {
    ASSERT_TRUE(
        shard->Contribute(NodeGrad(1, 0, chunk, 1.0f, NodeSender(), sink))
            .ok());
  }
  sink->WaitFor(5);
  ASSERT_EQ(shard->completed_step(), 1u);
  ASSERT_TRUE(shard->BeginStep(2, 0, {}, {}, {}, {}, NodeShape{2, 4}).ok());
  for (uint32_t rank = 0; rank < 2; ++rank) {
    const NodeSender sender = *NodeSender::FromHeader(plan, 2, rank, 4);
    const NodePartition partition = *NodePartition::Create(plan, 2, 4);
    for (uint64_t b = 0; b < partition.num_buckets(); ++b) {
      const ChunkSpan owned = partition.owned(b, rank);
      for (uint64_t chunk = owned.first; chunk < owned.end; ++chunk) {
        ASSERT_TRUE(
            shard->Contribute(NodeGrad(2, 0, chunk, 1.0f, sender, sink)).ok())
            << chunk;
      }
    }
  }
  sink->WaitFor(10);
  EXPECT_EQ(shard->completed_step(), 2u);
}

}  // namespace
}  // namespace depot
