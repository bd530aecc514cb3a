// Server-side checkpoints through real depot-server processes: a job trained
// by real clients is checkpointed in the background every 5 steps, both its
// servers are killed with SIGKILL, restarted on their checkpoint directories,
// restore the job by themselves, and the clients attach to it by opening the
// job again; it resumes from the checkpointed step and ends bit for bit where
// an uninterrupted run ends.
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
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

constexpr uint64_t kSeed = 23;
constexpr uint64_t kEvery = 5;
constexpr uint64_t kSteps = 20;
constexpr uint32_t kServers = 2;

class CheckpointRecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") +
                          "/depot-ckpt-recovery-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
    StartServers();
  }
  void TearDown() override {
    servers_.clear();
    fs::remove_all(root_);
  }

  std::string CheckpointDir(uint32_t server) const {
    return absl::StrCat(root_, "/server-", server);
  }

  // Starts (or restarts) both servers on their checkpoint directories; they
  // run different update pool sizes, which must not change any result.
  void StartServers() {
    servers_.clear();
    for (uint32_t s = 0; s < kServers; ++s) {
      absl::StatusOr<std::unique_ptr<ServerProcess>> server =
          ServerProcess::Start(
              {absl::StrCat("--checkpoint_dir=", CheckpointDir(s)),
               absl::StrCat("--checkpoint_every_steps=", kEvery),
               "--checkpoint_keep=2", absl::StrCat("--threads=", 1 + 2 * s)});
      ASSERT_TRUE(server.ok()) << server.status();
      servers_.push_back(*std::move(server));
    }
  }

  void KillServers() {
    for (auto& server : servers_) ASSERT_TRUE(server->Kill().ok());
  }

  std::vector<std::string> Addresses() const {
    std::vector<std::string> addresses;
    for (const auto& server : servers_) {
      addresses.push_back(server->grpc_address());
    }
    return addresses;
  }

  std::unique_ptr<ClientTraining> Open(const std::string& name) {
    absl::StatusOr<std::unique_ptr<ClientTraining>> training =
        ClientTraining::Open(Addresses(), SmallJobConfig(name, 2, kServers));
    EXPECT_TRUE(training.ok()) << training.status();
    return training.ok() ? *std::move(training) : nullptr;
  }

  static void Train(ClientTraining& training, uint64_t first, uint64_t last) {
    for (const WorkerOutcome& outcome : training.RunSteps(kSeed, first, last)) {
      ASSERT_TRUE(outcome.status.ok()) << outcome.status;
    }
  }

  std::string Manifest(const std::string& job, uint32_t server,
                       uint64_t step) const {
    return absl::StrFormat("%s/job-%s/step-%020d/manifest-%d-of-%d",
                           CheckpointDir(server), job, step, server, kServers);
  }

  // Checkpoints are written in the background: waits until both servers'
  // manifests of `step` exist (polling; nothing else tells a client).
  void WaitForCheckpoint(const std::string& job, uint64_t step) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    for (uint32_t s = 0; s < kServers; ++s) {
      while (!fs::exists(Manifest(job, s, step))) {
        ASSERT_LT(absl::Now(), deadline)
            << "no checkpoint of step " << step << " on server " << s << "\n"
            << servers_[s]->Log();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  }

  // A fresh job `name` initialised and trained for steps 1..last; returns
  // once both servers have written its checkpoint of `checkpointed`. The
  // clients are closed on return.
  void TrainUntilCheckpointed(const std::string& name, uint64_t last,
                              uint64_t checkpointed) {
    std::unique_ptr<ClientTraining> training = Open(name);
    ASSERT_NE(training, nullptr);
    ASSERT_TRUE(training->InitWeights(kSeed, DType::kFloat32).ok());
    Train(*training, 1, last);
    WaitForCheckpoint(name, checkpointed);
  }

  static std::vector<uint64_t> Steps(ClientTraining& training) {
    absl::StatusOr<std::vector<ServerJobStatus>> statuses =
        training.job(0).Status(/*with_checksum=*/false);
    EXPECT_TRUE(statuses.ok()) << statuses.status();
    std::vector<uint64_t> steps;
    if (statuses.ok()) {
      for (const ServerJobStatus& status : *statuses) {
        steps.push_back(status.step);
      }
    }
    return steps;
  }

  std::string root_;
  std::vector<std::unique_ptr<ServerProcess>> servers_;
};

TEST_F(CheckpointRecoveryTest, KilledServersResumeFromTheCheckpointBitwise) {
  // The uninterrupted run: its state at step 10 and at the end.
  std::vector<uint64_t> whole_checksums_at_10;
  std::vector<uint64_t> whole_checksums;
  std::vector<float> whole_master;
  {
    std::unique_ptr<ClientTraining> whole = Open("whole");
    ASSERT_NE(whole, nullptr);
    ASSERT_TRUE(whole->InitWeights(kSeed, DType::kFloat32).ok());
    Train(*whole, 1, 10);
    whole_checksums_at_10 = whole->StateChecksums().value();
    Train(*whole, 11, kSteps);
    whole_checksums = whole->StateChecksums().value();
    whole_master = whole->PullMaster().value();
  }

  ASSERT_NO_FATAL_FAILURE(TrainUntilCheckpointed("resumed", 12, 10));
  KillServers();
  StartServers();

  // Opening the job again attaches to the restored one, at step 10 on every
  // server, in the state the uninterrupted run had then.
  std::unique_ptr<ClientTraining> resumed = Open("resumed");
  ASSERT_NE(resumed, nullptr);
  EXPECT_THAT(Steps(*resumed), ::testing::Each(10u));
  absl::StatusOr<std::vector<uint64_t>> restored = resumed->StateChecksums();
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, whole_checksums_at_10);
  for (const auto& server : servers_) {
    EXPECT_THAT(server->Log(), ::testing::HasSubstr("\"resumed\" (server"));
    EXPECT_THAT(server->Log(), ::testing::HasSubstr("at step 10 from"));
  }

  Train(*resumed, 11, kSteps);
  absl::StatusOr<std::vector<float>> master = resumed->PullMaster();
  ASSERT_TRUE(master.ok()) << master.status();
  EXPECT_TRUE(BitwiseEqual(whole_master, *master));
  EXPECT_EQ(resumed->StateChecksums().value(), whole_checksums);
  // Only the last two complete checkpoints are kept.
  for (uint32_t s = 0; s < kServers; ++s) {
    EXPECT_FALSE(fs::exists(Manifest("resumed", s, 5)));
  }
}

// A damaged newest checkpoint on one server: that server restores the one
// before it, says why in its log, and the other server the newest.
TEST_F(CheckpointRecoveryTest, DamagedNewestCheckpointFallsBackToThePrevious) {
  ASSERT_NO_FATAL_FAILURE(TrainUntilCheckpointed("damaged", 10, 10));
  KillServers();
  const std::string shard_file = absl::StrFormat(
      "%s/job-damaged/step-%020d/shard-0-of-2.ckpt", CheckpointDir(0), 10);
  std::string bytes;
  {
    std::ifstream in(shard_file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(bytes.size(), 1000u);
  bytes[bytes.size() - 300] ^= 0x40;
  {
    std::ofstream out(shard_file, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  StartServers();

  std::unique_ptr<ClientTraining> resumed = Open("damaged");
  ASSERT_NE(resumed, nullptr);
  EXPECT_THAT(Steps(*resumed), ::testing::ElementsAre(5u, 10u));
  EXPECT_THAT(servers_[0]->Log(), ::testing::HasSubstr("DATA_LOSS"));
  EXPECT_THAT(servers_[0]->Log(), ::testing::HasSubstr(shard_file));
}

// DeleteJob removes the job's checkpoints: a restart does not bring it back.
TEST_F(CheckpointRecoveryTest, DeletedJobIsNotRestored) {
  ASSERT_NO_FATAL_FAILURE(TrainUntilCheckpointed("deleted", 5, 5));
  {
    // Opening it again attaches; Delete deletes it on every server.
    std::unique_ptr<ClientTraining> training = Open("deleted");
    ASSERT_NE(training, nullptr);
    ASSERT_TRUE(training->job(0).Delete().ok());
  }
  // The removal runs on the writer thread too; a graceful stop finishes it.
  for (auto& server : servers_) {
    ASSERT_TRUE(server->Signal(SIGTERM).ok());
    absl::StatusOr<ProcessExit> exit = server->Wait(absl::Seconds(30));
    ASSERT_TRUE(exit.ok()) << exit.status();
  }
  for (uint32_t s = 0; s < kServers; ++s) {
    EXPECT_FALSE(fs::exists(CheckpointDir(s) + "/job-deleted"));
  }
  StartServers();
  for (const auto& server : servers_) {
    EXPECT_THAT(server->Log(),
                ::testing::Not(::testing::HasSubstr("restored")));
  }
}

}  // namespace
}  // namespace depot::testing
