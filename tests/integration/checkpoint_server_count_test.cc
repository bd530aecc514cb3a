// A server-side checkpoint restores onto another server count (issue 12, part
// 3; docs/checkpoints.md "Restoring onto another server count"): three
// depot-server processes checkpoint a job every 10 steps into their own
// directories; fresh servers, 1, 2 and 4 of them, open the job of the same
// name and config, import the checkpoint of step 10 from those directories
// (each reads the old shard files its chunks lie in) and train on to step 20,
// ending bit for bit where the uninterrupted 3-server run ends. A checkpoint
// with a file missing or damaged is refused before any server changes.
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bitwise_compare.h"
#include "client_training.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server_process.h"
#include "training_data.h"

namespace depot::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr uint64_t kSeed = 31;
constexpr uint64_t kCheckpointed = 10;
constexpr uint64_t kSteps = 20;
constexpr uint32_t kOldServers = 3;
constexpr const char* kJob = "moved";

class CheckpointServerCountTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") +
                          "/depot-ckpt-count-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
    // A checkpoint every 10 steps: step 10 is the first, so no write still
    // out can make a server skip it (a capture step that finds the previous
    // write unfinished is skipped, which a loaded machine makes happen).
    for (uint32_t s = 0; s < kOldServers; ++s) {
      old_servers_.push_back(
          Start({absl::StrCat("--checkpoint_dir=", OldDir(s)),
                 "--checkpoint_every_steps=10", "--checkpoint_keep=10",
                 absl::StrCat("--threads=", 1 + s % 2)}));
    }
    // New servers 0 and 2 checkpoint too, into their own directories; 1 and
    // 3 have none.
    for (uint32_t s = 0; s < 4; ++s) {
      std::vector<std::string> flags = {absl::StrCat("--threads=", 2 - s % 2),
                                        absl::StrCat("--import_roots=", root_)};
      if (s % 2 == 0) {
        flags.push_back(absl::StrCat("--checkpoint_dir=", root_, "/new-", s));
        flags.push_back("--checkpoint_every_steps=5");
      }
      new_servers_.push_back(Start(flags));
    }
  }
  void TearDown() override {
    old_servers_.clear();
    new_servers_.clear();
    fs::remove_all(root_);
  }

  static std::unique_ptr<ServerProcess> Start(
      const std::vector<std::string>& flags) {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::Start(flags);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  std::string OldDir(uint32_t server) const {
    return absl::StrCat(root_, "/old-", server);
  }
  std::vector<std::string> OldDirs() const {
    std::vector<std::string> dirs;
    for (uint32_t s = 0; s < kOldServers; ++s) dirs.push_back(OldDir(s));
    return dirs;
  }
  std::string OldFile(uint32_t server, const std::string& file) const {
    return absl::StrFormat("%s/job-%s/step-%020d/%s", OldDir(server), kJob,
                           kCheckpointed, file);
  }
  std::string OldShardFile(uint32_t server) const {
    return OldFile(
        server, absl::StrCat("shard-", server, "-of-", kOldServers, ".ckpt"));
  }
  std::string OldManifest(uint32_t server) const {
    return OldFile(server,
                   absl::StrCat("manifest-", server, "-of-", kOldServers));
  }

  // Job kJob of two workers on the first `count` of `servers`.
  static std::unique_ptr<ClientTraining> Open(
      const std::vector<std::unique_ptr<ServerProcess>>& servers,
      uint32_t count) {
    std::vector<std::string> addresses;
    for (uint32_t s = 0; s < count; ++s) {
      addresses.push_back(servers[s]->grpc_address());
    }
    absl::StatusOr<std::unique_ptr<ClientTraining>> training =
        ClientTraining::Open(addresses, SmallJobConfig(kJob, 2, count));
    EXPECT_TRUE(training.ok()) << training.status();
    return training.ok() ? *std::move(training) : nullptr;
  }

  static std::string Train(ClientTraining& training, uint64_t first,
                           uint64_t last) {
    absl::StatusOr<std::string> weights = training.Train(kSeed, first, last);
    EXPECT_TRUE(weights.ok()) << weights.status();
    return weights.ok() ? *std::move(weights) : std::string();
  }

  // The whole optimizer state (master, slots, per-tensor counts) as flat
  // arrays: comparable across server counts, unlike per-shard checksums.
  static FlatState WholeState(ClientTraining& training) {
    absl::StatusOr<std::string> blob = training.job(0).SaveState();
    EXPECT_TRUE(blob.ok()) << blob.status();
    if (!blob.ok()) return {};
    absl::StatusOr<FlatState> state = training.job(0).DecodeState(*blob);
    EXPECT_TRUE(state.ok()) << state.status();
    return state.ok() ? *std::move(state) : FlatState{};
  }

  static void ExpectSameState(const FlatState& expected,
                              const FlatState& actual) {
    EXPECT_EQ(expected.applied_step, actual.applied_step);
    EXPECT_TRUE(BitwiseEqual(expected.master, actual.master));
    ASSERT_EQ(expected.slots.size(), actual.slots.size());
    for (size_t k = 0; k < expected.slots.size(); ++k) {
      EXPECT_TRUE(BitwiseEqual(expected.slots[k], actual.slots[k]))
          << "slot " << k;
    }
    EXPECT_EQ(expected.tensor_steps, actual.tensor_steps);
  }

  static std::vector<uint64_t> Steps(ClientTraining& training) {
    std::vector<uint64_t> steps;
    absl::StatusOr<std::vector<ServerJobStatus>> statuses =
        training.job(0).Status(/*with_checksum=*/false);
    EXPECT_TRUE(statuses.ok()) << statuses.status();
    if (!statuses.ok()) return steps;
    for (const ServerJobStatus& status : *statuses) {
      steps.push_back(status.step);
    }
    return steps;
  }

  // The 3-server run: trained to step kCheckpointed, whose checkpoint every
  // old server has written (in the background: polled), then left there.
  std::unique_ptr<ClientTraining> TrainOldUntilCheckpointed() {
    std::unique_ptr<ClientTraining> old = Open(old_servers_, kOldServers);
    if (old == nullptr) return nullptr;
    EXPECT_TRUE(old->InitWeights(kSeed, DType::kFloat32).ok());
    Train(*old, 1, kCheckpointed);
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    for (uint32_t s = 0; s < kOldServers; ++s) {
      while (!fs::exists(OldManifest(s))) {
        if (absl::Now() > deadline) {
          ADD_FAILURE() << "no checkpoint of step " << kCheckpointed
                        << " on server " << s << "\n"
                        << old_servers_[s]->Log();
          return nullptr;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    return old;
  }

  std::string root_;
  std::vector<std::unique_ptr<ServerProcess>> old_servers_;
  std::vector<std::unique_ptr<ServerProcess>> new_servers_;
};

TEST_F(CheckpointServerCountTest,
       AThreeServerCheckpointResumesOnOneTwoAndFourServersBitwise) {
  std::unique_ptr<ClientTraining> old = TrainOldUntilCheckpointed();
  ASSERT_NE(old, nullptr);
  // The uninterrupted run goes on from its checkpoint to the end.
  const std::string whole_weights = Train(*old, kCheckpointed + 1, kSteps);
  const FlatState whole = WholeState(*old);
  ASSERT_EQ(whole.applied_step, kSteps);

  for (uint32_t count : {1u, 2u, 4u}) {
    SCOPED_TRACE(absl::StrCat(count, " servers"));
    std::unique_ptr<ClientTraining> resumed = Open(new_servers_, count);
    ASSERT_NE(resumed, nullptr);
    // No InitWeights: the import sets every chunk.
    absl::Status imported =
        resumed->job(0).ImportCheckpoint(kCheckpointed, OldDirs());
    ASSERT_TRUE(imported.ok()) << imported << "\n" << new_servers_[0]->Log();
    EXPECT_EQ(Steps(*resumed), std::vector<uint64_t>(count, kCheckpointed));
    const std::string weights = Train(*resumed, kCheckpointed + 1, kSteps);
    EXPECT_TRUE(BitwiseEqual(whole_weights, weights, sizeof(float)));
    ExpectSameState(whole, WholeState(*resumed));
    ASSERT_TRUE(resumed->job(0).Delete().ok());
  }
}

TEST_F(CheckpointServerCountTest,
       AnIncompleteOrDamagedCheckpointIsRefusedWithNoServerChanged) {
  ASSERT_NE(TrainOldUntilCheckpointed(), nullptr);
  // Two new servers, trained a little so that a change would show: new
  // server 0's chunks lie in old shards 0 and 1, server 1's in 1 and 2.
  std::unique_ptr<ClientTraining> resumed = Open(new_servers_, 2);
  ASSERT_NE(resumed, nullptr);
  ASSERT_TRUE(resumed->InitWeights(kSeed, DType::kFloat32).ok());
  Train(*resumed, 1, 2);
  const std::vector<uint64_t> before = resumed->StateChecksums().value();
  const auto expect_unchanged = [&] {
    EXPECT_EQ(resumed->StateChecksums().value(), before);
    EXPECT_EQ(Steps(*resumed), (std::vector<uint64_t>{2, 2}));
  };

  // Old server 1's directory left out: the step is incomplete.
  absl::Status status =
      resumed->job(0).ImportCheckpoint(kCheckpointed, {OldDir(0), OldDir(2)});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_THAT(status.message(), HasSubstr("incomplete"));
  EXPECT_THAT(status.message(), HasSubstr("manifest-1-of-3"));
  expect_unchanged();

  // Old server 2's shard file missing: only new server 1 reads it.
  const std::string shard2 = OldShardFile(2);
  const std::string moved = shard2 + ".away";
  fs::rename(shard2, moved);
  status = resumed->job(0).ImportCheckpoint(kCheckpointed, OldDirs());
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr(shard2));
  EXPECT_THAT(status.message(), HasSubstr("does not exist"));
  expect_unchanged();
  fs::rename(moved, shard2);

  // A bit flipped in the last chunk of old server 2's shard file.
  const auto flip = [&] {
    std::fstream file(shard2, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(-7, std::ios::end);
    char byte = 0;
    file.get(byte);
    file.seekp(-7, std::ios::end);
    file.put(static_cast<char>(byte ^ 0x10));
  };
  flip();
  status = resumed->job(0).ImportCheckpoint(kCheckpointed, OldDirs());
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), HasSubstr(shard2));
  EXPECT_THAT(status.message(), HasSubstr("CRC-32C mismatch"));
  expect_unchanged();
  flip();  // repaired

  // A step no server wrote.
  status = resumed->job(0).ImportCheckpoint(7, OldDirs());
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  expect_unchanged();

  // Old server 0's directory copied outside the new servers' --import_roots
  // (root_): a complete checkpoint, refused before any file is read, named
  // directly, through `..`, or through a symbolic link inside the root.
  const std::string outside = root_ + "-outside";
  fs::copy(OldDir(0), outside, fs::copy_options::recursive);
  fs::create_directory_symlink(outside, root_ + "/link");
  const std::string dotdot =
      absl::StrCat(OldDir(1), "/../../", fs::path(outside).filename().string());
  for (const std::string& dir : {outside, dotdot, root_ + "/link"}) {
    SCOPED_TRACE(dir);
    status = resumed->job(0).ImportCheckpoint(kCheckpointed,
                                              {dir, OldDir(1), OldDir(2)});
    EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
    EXPECT_THAT(status.message(), HasSubstr("--import_roots"));
    expect_unchanged();
  }
  fs::remove_all(outside);

  // Repaired, it imports.
  status = resumed->job(0).ImportCheckpoint(kCheckpointed, OldDirs());
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(Steps(*resumed), (std::vector<uint64_t>{10, 10}));
}

}  // namespace
}  // namespace depot::testing
