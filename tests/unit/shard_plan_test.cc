#include "depot/shard_plan.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "gtest/gtest.h"

namespace depot {
namespace {

struct PlanShape {
  uint64_t total_elems;
  uint32_t num_servers;
  uint64_t chunk_elems;
};

// Even and uneven splits, a short last chunk, one chunk, more servers than
// chunks, and one server.
constexpr PlanShape kShapes[] = {
    {4096, 4, 256}, {1000, 3, 64}, {1, 1, 1},          {10, 1, 100},
    {300, 7, 100},  {17, 5, 1},    {1 << 20, 9, 4096},
};

ShardPlan MakePlan(const PlanShape& shape) {
  return ShardPlan::Create(shape.total_elems, shape.num_servers,
                           shape.chunk_elems)
      .value();
}

std::string Describe(const PlanShape& shape) {
  return "N=" + std::to_string(shape.total_elems) +
         " S=" + std::to_string(shape.num_servers) +
         " chunk=" + std::to_string(shape.chunk_elems);
}

TEST(ShardPlanTest, ChunksCoverTheSpaceInOrderWithoutOverlap) {
  for (const PlanShape& shape : kShapes) {
    const ShardPlan plan = MakePlan(shape);
    uint64_t next = 0;
    for (uint64_t c = 0; c < plan.num_chunks(); ++c) {
      const ChunkRange chunk = plan.chunk(c);
      EXPECT_EQ(chunk.index, c) << Describe(shape);
      EXPECT_EQ(chunk.begin, next) << Describe(shape) << " chunk " << c;
      EXPECT_GT(chunk.size(), 0u) << Describe(shape) << " chunk " << c;
      EXPECT_LE(chunk.size(), shape.chunk_elems) << Describe(shape);
      next = chunk.end;
    }
    EXPECT_EQ(next, shape.total_elems) << Describe(shape);
  }
}

TEST(ShardPlanTest, OnlyTheLastChunkIsShort) {
  const ShardPlan plan = ShardPlan::Create(1000, 3, 64).value();
  ASSERT_EQ(plan.num_chunks(), 16u);
  for (uint64_t c = 0; c + 1 < plan.num_chunks(); ++c) {
    EXPECT_EQ(plan.chunk(c).size(), 64u) << c;
  }
  EXPECT_EQ(plan.chunk(15).size(), 1000u - 15 * 64);
}

TEST(ShardPlanTest, ShardsAreContiguousAndChunkAligned) {
  for (const PlanShape& shape : kShapes) {
    const ShardPlan plan = MakePlan(shape);
    ASSERT_EQ(plan.num_servers(), shape.num_servers);
    uint64_t next_chunk = 0;
    uint64_t next_elem = 0;
    for (uint32_t s = 0; s < plan.num_servers(); ++s) {
      const ShardRange& shard = plan.shard(s);
      EXPECT_EQ(shard.server, s);
      EXPECT_EQ(shard.first_chunk, next_chunk) << Describe(shape) << " s=" << s;
      EXPECT_EQ(shard.begin, next_elem) << Describe(shape) << " s=" << s;
      if (shard.num_chunks() > 0) {
        EXPECT_EQ(shard.begin, plan.chunk(shard.first_chunk).begin);
        EXPECT_EQ(shard.end, plan.chunk(shard.end_chunk - 1).end);
      } else {
        EXPECT_EQ(shard.size(), 0u);
      }
      next_chunk = shard.end_chunk;
      next_elem = shard.end;
    }
    EXPECT_EQ(next_chunk, plan.num_chunks()) << Describe(shape);
    EXPECT_EQ(next_elem, shape.total_elems) << Describe(shape);
  }
}

TEST(ShardPlanTest, ShardSizesDifferByAtMostOneChunk) {
  for (const PlanShape& shape : kShapes) {
    const ShardPlan plan = MakePlan(shape);
    uint64_t fewest = UINT64_MAX;
    uint64_t most = 0;
    for (uint32_t s = 0; s < plan.num_servers(); ++s) {
      fewest = std::min(fewest, plan.shard(s).num_chunks());
      most = std::max(most, plan.shard(s).num_chunks());
    }
    EXPECT_LE(most - fewest, 1u) << Describe(shape);
  }
}

TEST(ShardPlanTest, ServerSHoldsChunksFromSTimesCOverS) {
  // 10 chunks over 4 servers: [0, 2), [2, 5), [5, 7), [7, 10).
  const ShardPlan plan = ShardPlan::Create(1000, 4, 100).value();
  const uint64_t expected[][2] = {{0, 2}, {2, 5}, {5, 7}, {7, 10}};
  for (uint32_t s = 0; s < 4; ++s) {
    EXPECT_EQ(plan.shard(s).first_chunk, expected[s][0]) << s;
    EXPECT_EQ(plan.shard(s).end_chunk, expected[s][1]) << s;
  }
  EXPECT_EQ(plan.shard(1).begin, 200u);
  EXPECT_EQ(plan.shard(1).end, 500u);
}

TEST(ShardPlanTest, MoreServersThanChunksLeavesSomeServersEmpty) {
  // 3 chunks over 5 servers: [0, 0), [0, 1), [1, 1), [1, 2), [2, 3).
  const ShardPlan plan = ShardPlan::Create(250, 5, 100).value();
  ASSERT_EQ(plan.num_chunks(), 3u);
  int empty = 0;
  for (uint32_t s = 0; s < 5; ++s) {
    if (plan.shard(s).num_chunks() == 0) ++empty;
    EXPECT_LE(plan.shard(s).num_chunks(), 1u) << s;
  }
  EXPECT_EQ(empty, 2);
  EXPECT_EQ(plan.shard(4).end, 250u);
}

TEST(ShardPlanTest, ServerOfChunkIsTheShardThatHoldsIt) {
  for (const PlanShape& shape : kShapes) {
    const ShardPlan plan = MakePlan(shape);
    for (uint64_t c = 0; c < plan.num_chunks(); ++c) {
      const ShardRange& shard = plan.shard(plan.ServerOfChunk(c));
      EXPECT_LE(shard.first_chunk, c) << Describe(shape) << " chunk " << c;
      EXPECT_LT(c, shard.end_chunk) << Describe(shape) << " chunk " << c;
    }
  }
}

TEST(ShardPlanTest, HugeSpacesDoNotOverflow) {
  // s * C exceeds 2^64 here; compare with 128-bit arithmetic.
  const uint64_t total = uint64_t{1} << 62;
  const uint32_t servers = 1000;
  const ShardPlan plan = ShardPlan::Create(total, servers, 3).value();
  const uint64_t chunks = plan.num_chunks();
  EXPECT_EQ(chunks, total / 3 + 1);
  for (uint32_t s = 0; s < servers; ++s) {
    const auto expected_first = static_cast<uint64_t>(
        static_cast<unsigned __int128>(s) * chunks / servers);
    EXPECT_EQ(plan.shard(s).first_chunk, expected_first) << s;
  }
  EXPECT_EQ(plan.shard(servers - 1).end, total);
  EXPECT_EQ(plan.chunk(chunks - 1).end, total);
  EXPECT_EQ(plan.ServerOfChunk(chunks - 1), servers - 1);
}

TEST(ShardPlanTest, RejectsZeroTotal) {
  const absl::StatusOr<ShardPlan> plan = ShardPlan::Create(0, 1, 1);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("total_elems"), std::string::npos);
}

TEST(ShardPlanTest, RejectsZeroServers) {
  const absl::StatusOr<ShardPlan> plan = ShardPlan::Create(10, 0, 1);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("num_servers"), std::string::npos);
}

// A plan holds a range per server: a job of one element must not make the
// server hold 20 million of them (depot-soak, issue 13).
TEST(ShardPlanTest, RejectsMoreServersThanTheLimit) {
  EXPECT_TRUE(ShardPlan::Create(1, kMaxServers, 1).ok());
  for (const uint32_t servers : {kMaxServers + 1, uint32_t{20000000},
                                 ~uint32_t{0}}) {
    const absl::StatusOr<ShardPlan> plan = ShardPlan::Create(1, servers, 1);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(plan.status().message().find("num_servers"), std::string::npos);
  }
}

TEST(ShardPlanTest, RejectsZeroChunkSize) {
  const absl::StatusOr<ShardPlan> plan = ShardPlan::Create(10, 1, 0);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("chunk_elems"), std::string::npos);
}

}  // namespace
}  // namespace depot
