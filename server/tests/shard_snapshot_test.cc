// ShardState::ExportChunks / ImportChunks (server/shard_snapshot.cc).
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/crc32c.h"
#include "server/job_shape.h"
#include "server/metrics.h"
#include "server/shard_state.h"
#include "server/tests/test_util.h"
#include "server/thread_pool.h"

namespace depot {
namespace {

using ::depot::testing::DrainPool;
using ::depot::testing::Fp32Payload;
using ::depot::testing::PlainSgdConfig;
using ::depot::testing::RecordingSink;

// AdamW (two slots) over two chunks of 8 elements: tensor "a" [0, 5), "b"
// [8, 14).
JobConfig AdamWConfig(uint32_t num_workers) {
  JobConfig config = PlainSgdConfig({{"a", 5, 0}, {"b", 6, 1}}, num_workers,
                                    /*chunk_elems=*/8, /*alignment_elems=*/4);
  config.optimizer.kind = OptimizerKind::kAdamW;
  config.optimizer.lr = 0.01;
  return config;
}

class ShardSnapshotTest : public ::testing::Test {
 protected:
  std::shared_ptr<ShardState> MakeShard(const JobConfig& config,
                                        uint32_t server_index = 0) {
    return ShardState::Create(/*job_id=*/1,
                              JobShape::Create(config, server_index).value(),
                              &pool_, PayloadPool::Create(1 << 20), &metrics_)
        .value();
  }

  // Runs step `step` of a one-worker job on both chunks, gradient `value`.
  void RunStep(ShardState& shard, uint64_t step, float value) {
    auto sink = std::make_shared<RecordingSink>();
    ASSERT_TRUE(shard.BeginStep(step, 0, {}).ok());
    for (uint64_t chunk = 0; chunk < 2; ++chunk) {
      Contribution c;
      c.step = step;
      c.chunk_index = chunk;
      c.payload = Fp32Payload(std::vector<float>(8, value));
      c.sink = sink;
      ASSERT_TRUE(shard.Contribute(std::move(c)).ok());
    }
    sink->WaitFor(2);
    DrainPool(pool_);
  }

  // A shard initialised to 1..16 and trained `steps` steps.
  std::shared_ptr<ShardState> TrainedShard(int steps) {
    auto shard = MakeShard(AdamWConfig(1));
    for (uint64_t chunk = 0; chunk < 2; ++chunk) {
      std::vector<float> w(8);
      for (int i = 0; i < 8; ++i) w[i] = static_cast<float>(chunk * 8 + i + 1);
      EXPECT_TRUE(
          shard->InitChunk(chunk, DType::kFloat32, Fp32Payload(w)).ok());
    }
    for (int s = 1; s <= steps; ++s) RunStep(*shard, s, 0.25f * s);
    return shard;
  }

  static std::vector<ChunkSnapshot> Export(const ShardState& shard) {
    std::vector<ChunkSnapshot> chunks;
    EXPECT_TRUE(shard
                    .ExportChunks([&](ChunkSnapshot snapshot) {
                      chunks.push_back(std::move(snapshot));
                      return true;
                    })
                    .ok());
    return chunks;
  }

  prometheus::Registry registry_;
  ServerMetrics metrics_{registry_};
  ThreadPool pool_{1};
};

TEST_F(ShardSnapshotTest, ExportHasEveryChunkWithItsSlotsAndSteps) {
  auto shard = TrainedShard(2);
  std::vector<ChunkSnapshot> chunks = Export(*shard);
  ASSERT_EQ(chunks.size(), 2u);
  for (uint64_t i = 0; i < 2; ++i) {
    EXPECT_EQ(chunks[i].index, i);
    EXPECT_EQ(chunks[i].applied_step, 2u);
    EXPECT_EQ(chunks[i].optimizer_step, 2u);
    EXPECT_EQ(chunks[i].master.size(), 8 * sizeof(float));
    ASSERT_EQ(chunks[i].slots.size(), 2u);
    EXPECT_EQ(chunks[i].slots[0].size(), 8 * sizeof(float));
  }
}

// The copy (a checkpoint capture's too) checksums what it copied: the
// checkpoint writer takes the sum as the chunk section's.
TEST_F(ShardSnapshotTest, EveryCopyCarriesTheChecksumOfItsBytes) {
  auto shard = TrainedShard(2);
  for (const ChunkSnapshot& chunk : Export(*shard)) {
    std::string payload = chunk.master;
    for (const std::string& slot : chunk.slots) payload += slot;
    ASSERT_TRUE(chunk.payload_crc.has_value()) << "chunk " << chunk.index;
    EXPECT_EQ(*chunk.payload_crc, Crc32c(payload.data(), payload.size()))
        << "chunk " << chunk.index;
  }
}

TEST_F(ShardSnapshotTest, ImportIntoAFreshShardReproducesTheState) {
  auto trained = TrainedShard(3);
  auto fresh = MakeShard(AdamWConfig(1));
  ASSERT_TRUE(fresh->ImportChunks(Export(*trained)).ok());
  EXPECT_EQ(fresh->Checksum(), trained->Checksum());
  EXPECT_EQ(fresh->completed_step(), 3u);
}

TEST_F(ShardSnapshotTest, TrainingContinuesBitwiseAfterImport) {
  auto trained = TrainedShard(3);
  auto fresh = MakeShard(AdamWConfig(1));
  ASSERT_TRUE(fresh->ImportChunks(Export(*trained)).ok());
  RunStep(*trained, 4, 0.5f);
  RunStep(*fresh, 4, 0.5f);
  EXPECT_EQ(fresh->Checksum(), trained->Checksum());
  EXPECT_EQ(fresh->completed_step(), 4u);
}

TEST_F(ShardSnapshotTest, ImportWithAMissingChunkIsRejectedAndChangesNothing) {
  auto shard = TrainedShard(1);
  const uint64_t before = shard->Checksum();
  std::vector<ChunkSnapshot> chunks = Export(*TrainedShard(2));
  chunks.pop_back();
  absl::Status s = shard->ImportChunks(std::move(chunks));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(shard->Checksum(), before);
  EXPECT_EQ(shard->completed_step(), 1u);
}

TEST_F(ShardSnapshotTest, ImportWithAChunkTwiceIsRejected) {
  auto shard = MakeShard(AdamWConfig(1));
  std::vector<ChunkSnapshot> chunks = Export(*TrainedShard(1));
  chunks[1] = chunks[0];
  absl::Status s = shard->ImportChunks(std::move(chunks));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST_F(ShardSnapshotTest, ImportWithAShortSlotIsRejectedAndChangesNothing) {
  auto shard = TrainedShard(1);
  const uint64_t before = shard->Checksum();
  std::vector<ChunkSnapshot> chunks = Export(*TrainedShard(2));
  chunks[1].slots[1].pop_back();
  absl::Status s = shard->ImportChunks(std::move(chunks));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(shard->Checksum(), before);
}

TEST_F(ShardSnapshotTest, ImportWithChunksAtDifferentStepsIsRejected) {
  auto shard = MakeShard(AdamWConfig(1));
  std::vector<ChunkSnapshot> chunks = Export(*TrainedShard(2));
  chunks[1].applied_step = 3;
  absl::Status s = shard->ImportChunks(std::move(chunks));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

// Issue 13: an import at step 2^64 - 1 was taken and left the job stuck.
TEST_F(ShardSnapshotTest, ImportBeyondTheLargestStepIsRejectedAndChangesNothing) {
  auto shard = TrainedShard(1);
  const uint64_t before = shard->Checksum();
  std::vector<ChunkSnapshot> chunks = Export(*TrainedShard(2));
  for (ChunkSnapshot& chunk : chunks) chunk.applied_step = ~uint64_t{0};
  absl::Status s = shard->ImportChunks(std::move(chunks));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("beyond the largest step"), absl::string_view::npos)
      << s;
  EXPECT_EQ(shard->Checksum(), before);
  EXPECT_EQ(shard->completed_step(), 1u);
}

TEST_F(ShardSnapshotTest, ImportOfAChunkOutsideTheShardIsOutOfRange) {
  JobConfig config = AdamWConfig(1);
  config.num_servers = 2;  // server 1 holds chunk 1 only
  auto shard = MakeShard(config, /*server_index=*/1);
  std::vector<ChunkSnapshot> chunks = Export(*TrainedShard(1));
  chunks.pop_back();  // chunk 0 only
  absl::Status s = shard->ImportChunks(std::move(chunks));
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
}

TEST_F(ShardSnapshotTest, ImportIsRejectedWhileContributionsArePending) {
  auto shard = MakeShard(AdamWConfig(2));
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  Contribution c;
  c.step = 1;
  c.chunk_index = 0;
  c.payload = Fp32Payload(std::vector<float>(8, 1.0f));
  c.sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->Contribute(std::move(c)).ok());
  const uint64_t before = shard->Checksum();
  std::vector<ChunkSnapshot> chunks = Export(*shard);
  chunks[0].master.assign(chunks[0].master.size(), '\x01');
  absl::Status s = shard->ImportChunks(std::move(chunks));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(shard->Checksum(), before);
}

TEST_F(ShardSnapshotTest, ImportIntoADeletedJobIsAborted) {
  auto shard = MakeShard(AdamWConfig(1));
  std::vector<ChunkSnapshot> chunks = Export(*shard);
  shard->MarkDeleted();
  EXPECT_EQ(shard->ImportChunks(std::move(chunks)).code(),
            absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace depot
