// ReadCheckpointForShard: the chunks of a new shard read from a checkpoint
// that another server count wrote, and the checks made before any shard file
// is read (every old server's manifest there, one server count, the job's
// fingerprint).
#include "server/checkpoint_import.h"

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/checkpoint_directory.h"
#include "server/tests/checkpoint_test_util.h"

namespace depot {
namespace {

using ::depot::testing::CheckpointTestConfig;
using ::depot::testing::RandomCheckpoint;
using ::depot::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

namespace fs = std::filesystem;

constexpr uint32_t kOldServers = 3;
constexpr uint64_t kStep = 10;

// The test config with chunks of 4 elements: 11 chunks, so that old and new
// shards of 1 to 5 servers meet in many ways.
JobConfig ConfigOf(uint32_t servers) {
  JobConfig config = CheckpointTestConfig();
  config.chunk_elems = 4;
  config.num_servers = servers;
  return config;
}

class CheckpointImportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (uint32_t s = 0; s < kOldServers; ++s) {
      absl::StatusOr<std::unique_ptr<CheckpointDirectory>> dir =
          CheckpointDirectory::Open(OldDir(s));
      ASSERT_TRUE(dir.ok()) << dir.status();
      ShardCheckpoint checkpoint =
          RandomCheckpoint(ConfigOf(kOldServers), s, kStep, 7 + s);
      ASSERT_TRUE((*dir)->Write(checkpoint).ok());
      for (ChunkSnapshot& chunk : checkpoint.chunks) {
        written_[chunk.index] = chunk;
      }
    }
  }

  std::string OldDir(uint32_t server) const {
    return absl::StrCat(temp_.path(), "/old-", server);
  }
  std::vector<std::string> OldDirs() const {
    return {OldDir(2), OldDir(0), OldDir(1)};  // any order
  }
  std::string StepDir(uint32_t server) const {
    return CheckpointStepDirectory(OldDir(server), JobKey{"", "ckpt-job"},
                                   kStep);
  }

  TempDir temp_;
  std::map<uint64_t, ChunkSnapshot> written_;
};

TEST_F(CheckpointImportTest, EveryNewShardGetsExactlyItsChunks) {
  for (uint32_t servers = 1; servers <= 5; ++servers) {
    for (uint32_t s = 0; s < servers; ++s) {
      SCOPED_TRACE(absl::StrCat("server ", s, " of ", servers));
      const JobShape shape = JobShape::Create(ConfigOf(servers), s).value();
      absl::StatusOr<CheckpointForShard> read =
          ReadCheckpointForShard(OldDirs(), shape, kStep, true);
      ASSERT_TRUE(read.ok()) << read.status();
      EXPECT_EQ(read->old_num_servers, kOldServers);
      ASSERT_EQ(read->chunks.size(), shape.shard().num_chunks());
      for (const ChunkSnapshot& chunk : read->chunks) {
        const ChunkSnapshot& expected = written_.at(chunk.index);
        EXPECT_EQ(chunk.applied_step, kStep);
        EXPECT_EQ(chunk.tensor_steps, expected.tensor_steps);
        EXPECT_EQ(chunk.master, expected.master);
        EXPECT_EQ(chunk.slots, expected.slots);
      }
    }
  }
}

TEST_F(CheckpointImportTest, OnlyTheOldFilesAShardMeetsAreRead) {
  // One server of 5 holds 2 or 3 of the 11 chunks: server 0's are all in old
  // shard 0.
  const JobShape shape = JobShape::Create(ConfigOf(5), 0).value();
  absl::StatusOr<CheckpointForShard> read =
      ReadCheckpointForShard(OldDirs(), shape, kStep, false);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->shard_files,
            std::vector<std::string>{StepDir(0) + "/shard-0-of-3.ckpt"});
  EXPECT_THAT(read->chunks, IsEmpty());  // a check only
}

TEST_F(CheckpointImportTest,
       AMissingManifestIsRefusedEvenWhereItsFileIsNotNeeded) {
  fs::remove(StepDir(2) + "/manifest-2-of-3");
  const JobShape shape = JobShape::Create(ConfigOf(5), 0).value();
  absl::StatusOr<CheckpointForShard> read =
      ReadCheckpointForShard(OldDirs(), shape, kStep, true);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(read.status().message(), HasSubstr("incomplete"));
  EXPECT_THAT(read.status().message(), HasSubstr("manifest-2-of-3"));
}

TEST_F(CheckpointImportTest, AnotherConfigIsRefused) {
  JobConfig other = ConfigOf(2);
  other.optimizer.lr = 2e-3;
  const JobShape shape = JobShape::Create(other, 0).value();
  absl::StatusOr<CheckpointForShard> read =
      ReadCheckpointForShard(OldDirs(), shape, kStep, true);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(read.status().message(), HasSubstr("another config"));
}

TEST_F(CheckpointImportTest, AStepNotWrittenIsNotFound) {
  const JobShape shape = JobShape::Create(ConfigOf(2), 0).value();
  EXPECT_EQ(
      ReadCheckpointForShard(OldDirs(), shape, kStep + 1, true).status().code(),
      absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadCheckpointForShard({}, shape, kStep, true).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CheckpointImportTest, ADamagedShardFileIsDataLossNamingIt) {
  const std::string file = StepDir(1) + "/shard-1-of-3.ckpt";
  std::string bytes = testing::ReadFileBytes(file);
  bytes[bytes.size() - 3] ^= 0x01;
  testing::WriteFileBytes(file, bytes);
  const JobShape shape = JobShape::Create(ConfigOf(1), 0).value();
  absl::StatusOr<CheckpointForShard> read =
      ReadCheckpointForShard(OldDirs(), shape, kStep, false);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(read.status().message(), HasSubstr(file));
}

}  // namespace
}  // namespace depot
