#include "depot/node_partition.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace depot {
namespace {

TEST(NodePartitionTest, RejectsBucketsThatAreNotWholeRankParts) {
  const ShardPlan plan = ShardPlan::Create(1000, 2, 10).value();
  EXPECT_EQ(NodePartition::Create(plan, 0, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(NodePartition::Create(plan, 4, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status odd = NodePartition::Create(plan, 4, 6).status();
  EXPECT_EQ(odd.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(odd.message().find("multiple of local_ranks (4)"),
            absl::string_view::npos)
      << odd;
}

// Every real chunk is owned by exactly one local rank, each rank's chunks of
// a bucket are contiguous and inside it, and the owners agree with
// OwnerOfChunk, for shapes with a short last bucket and a short last chunk.
TEST(NodePartitionTest, EveryChunkHasExactlyOneOwner) {
  struct Shape {
    uint64_t elems, chunk;
    uint32_t ranks;
    uint64_t bucket;
  };
  for (const Shape& s : {Shape{1000, 10, 2, 4}, Shape{1001, 10, 4, 8},
                         Shape{95, 10, 4, 4}, Shape{7, 10, 2, 2},
                         Shape{640, 8, 8, 16}, Shape{330, 10, 3, 3}}) {
    const ShardPlan plan = ShardPlan::Create(s.elems, 3, s.chunk).value();
    const NodePartition p =
        NodePartition::Create(plan, s.ranks, s.bucket).value();
    std::vector<int> owners(plan.num_chunks(), 0);
    uint64_t padded_chunks = 0;
    for (uint64_t b = 0; b < p.num_buckets(); ++b) {
      const ChunkSpan padded = p.padded_bucket(b);
      EXPECT_EQ(padded.first, padded_chunks);
      EXPECT_EQ(padded.size() % s.ranks, 0u);
      padded_chunks = padded.end;
      for (uint32_t g = 0; g < s.ranks; ++g) {
        const ChunkSpan part = p.owned_padded(b, g);
        EXPECT_EQ(part.size(), padded.size() / s.ranks);
        for (uint64_t c = p.owned(b, g).first; c < p.owned(b, g).end; ++c) {
          ASSERT_LT(c, plan.num_chunks());
          EXPECT_EQ(p.BucketOfChunk(c), b);
          EXPECT_EQ(p.OwnerOfChunk(c), g);
          ++owners[c];
        }
      }
    }
    for (uint64_t c = 0; c < plan.num_chunks(); ++c) {
      EXPECT_EQ(owners[c], 1) << "chunk " << c << " elems " << s.elems;
    }
    EXPECT_EQ(p.padded_elems(), padded_chunks * s.chunk);
    EXPECT_GE(p.padded_elems(), plan.total_elems());
  }
}

TEST(NodePartitionTest, OnlyTheLastBucketIsPadded) {
  // 11 chunks, buckets of 4, 4 ranks: the last bucket holds 3 real chunks
  // and one phantom, owned (padded) by rank 3, which owns no real chunk.
  const ShardPlan plan = ShardPlan::Create(105, 1, 10).value();
  const NodePartition p = NodePartition::Create(plan, 4, 4).value();
  ASSERT_EQ(p.num_buckets(), 3u);
  EXPECT_EQ(p.bucket(2).first, 8u);
  EXPECT_EQ(p.bucket(2).end, 11u);
  EXPECT_EQ(p.padded_bucket(2).end, 12u);
  EXPECT_TRUE(p.owned(2, 3).empty());
  EXPECT_EQ(p.owned_padded(2, 3).first, 11u);
  EXPECT_EQ(p.owned(2, 2).first, 10u);
  EXPECT_EQ(p.padded_elems(), 120u);
}

}  // namespace
}  // namespace depot
