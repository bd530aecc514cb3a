// ShardState::ExportChunks / ImportChunks / PatchChunks
// (server/shard_snapshot.cc).
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

  // A two-worker shard in step 1, worker 0's contribution to chunk 0 in.
  std::shared_ptr<ShardState> ShardWithAPendingContribution() {
    auto shard = MakeShard(AdamWConfig(2));
    EXPECT_TRUE(shard->BeginStep(1, 0, {}).ok());
    Contribution c;
    c.step = 1;
    c.chunk_index = 0;
    c.payload = Fp32Payload(std::vector<float>(8, 1.0f));
    c.sink = std::make_shared<RecordingSink>();
    EXPECT_TRUE(shard->Contribute(std::move(c)).ok());
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
  auto shard = ShardWithAPendingContribution();
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

TEST_F(ShardSnapshotTest, ExportOfListedChunksSendsOnlyThoseInTheirOrder) {
  auto shard = TrainedShard(2);
  const std::vector<ChunkSnapshot> whole = Export(*shard);
  std::vector<ChunkSnapshot> listed;
  ASSERT_TRUE(shard
                  ->ExportChunks({1, 0},
                                 [&](ChunkSnapshot snapshot) {
                                   listed.push_back(std::move(snapshot));
                                   return true;
                                 })
                  .ok());
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].index, 1u);
  EXPECT_EQ(listed[0].master, whole[1].master);
  EXPECT_EQ(listed[1].index, 0u);
  EXPECT_EQ(listed[1].slots, whole[0].slots);
  int emitted = 0;
  const auto count = [&](ChunkSnapshot) { return ++emitted, true; };
  EXPECT_EQ(shard->ExportChunks({2}, count).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(shard->ExportChunks({0, 0}, count).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(emitted, 0);
}

// What the patch is for (docs/gpu.md, "Offload fraction"): one chunk's state
// replaced at the shard's step, the other chunk, the step and the history
// left as they were, and training goes on from the patched state.
TEST_F(ShardSnapshotTest, APatchReplacesOnlyItsChunksAtTheShardsStep) {
  auto shard = TrainedShard(3);
  auto other = TrainedShard(3);
  RunStep(*other, 4, 1.0f);  // another state, taken back to step 3 below
  std::vector<ChunkSnapshot> theirs = Export(*other);
  for (ChunkSnapshot& chunk : theirs) {
    chunk.applied_step = 3;
    chunk.optimizer_step = 3;
    chunk.tensor_steps.assign(chunk.tensor_steps.size(), 2);
  }
  const std::vector<ChunkSnapshot> before = Export(*shard);
  ASSERT_NE(before[1].master, theirs[1].master);
  std::vector<ChunkSnapshot> patch;
  patch.push_back(theirs[1]);
  ASSERT_TRUE(shard->PatchChunks(std::move(patch)).ok());
  const std::vector<ChunkSnapshot> after = Export(*shard);
  EXPECT_EQ(after[0].master, before[0].master);
  EXPECT_EQ(after[0].slots, before[0].slots);
  EXPECT_EQ(after[0].tensor_steps, before[0].tensor_steps);
  EXPECT_EQ(after[1].master, theirs[1].master);
  EXPECT_EQ(after[1].slots, theirs[1].slots);
  EXPECT_EQ(after[1].tensor_steps, std::vector<uint64_t>{2});
  EXPECT_EQ(after[1].applied_step, 3u);
  EXPECT_EQ(shard->completed_step(), 3u);

  // Step 4 from the patched state equals step 4 from an imported one.
  auto imported = MakeShard(AdamWConfig(1));
  std::vector<ChunkSnapshot> whole = after;
  ASSERT_TRUE(imported->ImportChunks(std::move(whole)).ok());
  RunStep(*shard, 4, 0.5f);
  RunStep(*imported, 4, 0.5f);
  EXPECT_EQ(shard->Checksum(), imported->Checksum());
}

TEST_F(ShardSnapshotTest, APatchOfAnotherStepIsRefusedAndChangesNothing) {
  auto shard = TrainedShard(3);
  const uint64_t before = shard->Checksum();
  std::vector<ChunkSnapshot> chunks = Export(*shard);
  chunks[1].master.assign(chunks[1].master.size(), '\x01');
  chunks[1].applied_step = 4;
  std::vector<ChunkSnapshot> patch{chunks[0], chunks[1]};
  absl::Status s = shard->PatchChunks(std::move(patch));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("of step 4 and the shard is at step 3"),
            std::string::npos)
      << s;
  EXPECT_EQ(shard->Checksum(), before);

  std::vector<ChunkSnapshot> twice{chunks[0], chunks[0]};
  EXPECT_EQ(shard->PatchChunks(std::move(twice)).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<ChunkSnapshot> short_master{chunks[0]};
  short_master[0].master.resize(4);
  EXPECT_EQ(shard->PatchChunks(std::move(short_master)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shard->Checksum(), before);
}

// A server whose shard holds no chunk (more servers than chunks): an empty
// patch changes nothing and indexes no chunk.
TEST_F(ShardSnapshotTest, AnEmptyPatchOfAShardWithoutChunksIsAccepted) {
  JobConfig config = AdamWConfig(1);
  config.num_servers = 3;
  for (uint32_t server = 0; server < 3; ++server) {
    auto shard = MakeShard(config, server);
    if (shard->shape().shard().num_chunks() != 0) continue;
    EXPECT_TRUE(shard->PatchChunks({}).ok());
    EXPECT_TRUE(Export(*shard).empty());
    return;
  }
  FAIL() << "no server without chunks";
}

TEST_F(ShardSnapshotTest, APatchWhileAStepIsInFlightIsRefused) {
  auto shard = ShardWithAPendingContribution();
  std::vector<ChunkSnapshot> chunks = Export(*shard);  // an idle chunk 1
  const uint64_t before = shard->Checksum();
  // Only chunk 1 is patched; chunk 0's contribution still refuses it.
  chunks[1].master.assign(chunks[1].master.size(), '\x01');
  std::vector<ChunkSnapshot> patch{chunks[1]};
  absl::Status s = shard->PatchChunks(std::move(patch));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(shard->Checksum(), before);
}

}  // namespace
}  // namespace depot
