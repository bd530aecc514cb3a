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
#include <map>
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
    for (uint32_t s = 0; s < num_servers_; ++s) {
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

  // Opens `name` (SmallJobConfig, two workers) on the servers.
  std::unique_ptr<ClientTraining> Open(const std::string& name) {
    return Open(SmallJobConfig(name, 2, num_servers_));
  }
  std::unique_ptr<ClientTraining> Open(const JobConfig& config) {
    absl::StatusOr<std::unique_ptr<ClientTraining>> training =
        ClientTraining::Open(Addresses(), config);
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
                           CheckpointDir(server), job, step, server,
                           num_servers_);
  }

  // Checkpoints are written in the background: waits until both servers'
  // manifests of `step` exist (polling; nothing else tells a client).
  void WaitForCheckpoint(const std::string& job, uint64_t step) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    for (uint32_t s = 0; s < num_servers_; ++s) {
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
    // A capture step that comes while the previous checkpoint is still being
    // written is skipped: wait for each checkpoint before the next one's step.
    uint64_t done = 0;
    for (uint64_t at = kEvery; at <= checkpointed; at += kEvery) {
      Train(*training, done + 1, at);
      WaitForCheckpoint(name, at);
      done = at;
    }
    Train(*training, done + 1, last);
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
  uint32_t num_servers_ = 2;
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
  // Only the last two complete checkpoints are kept: once step 15's is
  // written (20's may be skipped while 15's is still being written), the
  // writer prunes step 5's, in the background.
  ASSERT_NO_FATAL_FAILURE(WaitForCheckpoint("resumed", 15));
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (uint32_t s = 0; s < num_servers_; ++s) {
    while (fs::exists(Manifest("resumed", s, 5)) && absl::Now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_FALSE(fs::exists(Manifest("resumed", s, 5))) << servers_[s]->Log();
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
  for (uint32_t s = 0; s < num_servers_; ++s) {
    EXPECT_FALSE(fs::exists(CheckpointDir(s) + "/job-deleted"));
  }
  StartServers();
  for (const auto& server : servers_) {
    EXPECT_THAT(server->Log(),
                ::testing::Not(::testing::HasSubstr("restored")));
  }
}

// SIGKILL while a checkpoint is being written (its temporary shard file is
// on disk): the restarted server restores a complete checkpoint — the one
// being written if it finished in time, else the one before — and the job
// resumes bitwise. A job big enough (4 Mi parameters, a 48 MiB shard file)
// that the write takes a while; a write that finishes before the kill lands
// is retried at the next checkpoint step.
TEST_F(CheckpointRecoveryTest, KillDuringACheckpointWriteRestoresACompleteOne) {
  num_servers_ = 1;
  ASSERT_NO_FATAL_FAILURE(StartServers());
  auto config = [](const std::string& name) {
    JobConfig config = SmallJobConfig(name, 1, 1);
    config.tensors = {{"w", 3u << 20, 0}, {"b", 1u << 20, 1}};
    config.chunk_elems = 1u << 18;
    return config;
  };
  constexpr uint64_t kLast = 30;
  std::map<uint64_t, std::vector<uint64_t>> reference_checksums;
  std::vector<float> reference_master;
  {
    std::unique_ptr<ClientTraining> reference = Open(config("reference"));
    ASSERT_NE(reference, nullptr);
    ASSERT_TRUE(reference->InitWeights(kSeed, DType::kFloat32).ok());
    for (uint64_t step = kEvery; step <= kLast; step += kEvery) {
      Train(*reference, step - kEvery + 1, step);
      reference_checksums[step] = reference->StateChecksums().value();
    }
    reference_master = reference->PullMaster().value();
    ASSERT_TRUE(reference->job(0).Delete().ok());
  }

  std::unique_ptr<ClientTraining> victim = Open(config("victim"));
  ASSERT_NE(victim, nullptr);
  ASSERT_TRUE(victim->InitWeights(kSeed, DType::kFloat32).ok());
  // The first checkpoint complete, so that one is there to fall back to.
  Train(*victim, 1, kEvery);
  ASSERT_NO_FATAL_FAILURE(WaitForCheckpoint("victim", kEvery));
  uint64_t killed_at = 0;
  bool mid_write = false;
  for (uint64_t step = 2 * kEvery; step < kLast && killed_at == 0;
       step += kEvery) {
    Train(*victim, step - kEvery + 1, step);
    const std::string step_dir =
        absl::StrFormat("%s/job-victim/step-%020d", CheckpointDir(0), step);
    // The capture was handed to the writer before the step's last weights
    // went out: its write starts now.
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline && killed_at == 0 &&
           !fs::exists(Manifest("victim", 0, step))) {
      std::error_code error;
      for (const auto& entry : fs::directory_iterator(step_dir, error)) {
        if (entry.path().filename().string().find(".tmp-") !=
            std::string::npos) {
          ASSERT_TRUE(servers_[0]->Kill().ok());
          killed_at = step;
          break;
        }
      }
    }
    mid_write = killed_at != 0 && !fs::exists(Manifest("victim", 0, step));
  }
  ASSERT_NE(killed_at, 0u) << "every write finished before it was seen";
  victim.reset();
  ASSERT_NO_FATAL_FAILURE(StartServers());

  std::unique_ptr<ClientTraining> resumed = Open(config("victim"));
  ASSERT_NE(resumed, nullptr);
  const std::vector<uint64_t> steps = Steps(*resumed);
  ASSERT_EQ(steps.size(), 1u);
  const uint64_t restored = steps[0];
  // Killed while step `killed_at` was written: that one if the write got
  // its manifest down in time, else the one before.
  if (mid_write) {
    EXPECT_EQ(restored, killed_at - kEvery) << servers_[0]->Log();
  } else {
    EXPECT_TRUE(restored == killed_at || restored == killed_at - kEvery)
        << restored;
  }
  ASSERT_TRUE(reference_checksums.count(restored)) << restored;
  EXPECT_EQ(resumed->StateChecksums().value(), reference_checksums[restored]);
  Train(*resumed, restored + 1, kLast);
  absl::StatusOr<std::vector<float>> master = resumed->PullMaster();
  ASSERT_TRUE(master.ok()) << master.status();
  EXPECT_TRUE(BitwiseEqual(reference_master, *master));
}

// The Checkpoint RPC (Job::Checkpoint): a checkpoint of step 7, not a
// multiple of the periodic 5, taken on demand; after SIGKILL both servers
// restore it, and the run resumes bitwise. While a step is in flight (one of
// two workers has sent its gradients) it is refused, and nothing changes.
TEST_F(CheckpointRecoveryTest, OnDemandCheckpointIsRestoredAfterAKill) {
  std::vector<uint64_t> whole_checksums_at_7;
  std::vector<float> whole_master;
  {
    std::unique_ptr<ClientTraining> whole = Open("whole");
    ASSERT_NE(whole, nullptr);
    ASSERT_TRUE(whole->InitWeights(kSeed, DType::kFloat32).ok());
    Train(*whole, 1, 7);
    whole_checksums_at_7 = whole->StateChecksums().value();
    Train(*whole, 8, 12);
    whole_master = whole->PullMaster().value();
  }
  {
    std::unique_ptr<ClientTraining> training = Open("on-demand");
    ASSERT_NE(training, nullptr);
    ASSERT_TRUE(training->InitWeights(kSeed, DType::kFloat32).ok());
    Train(*training, 1, 7);
    // UNAVAILABLE while the periodic checkpoint of step 5 is still being
    // written: retry, as the API says.
    absl::StatusOr<uint64_t> step = training->job(0).Checkpoint();
    for (int retry = 0; retry < 300 && absl::IsUnavailable(step.status());
         ++retry) {
      absl::SleepFor(absl::Milliseconds(10));
      step = training->job(0).Checkpoint();
    }
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(*step, 7u);
    for (uint32_t s = 0; s < num_servers_; ++s) {
      EXPECT_TRUE(fs::exists(Manifest("on-demand", s, 7)));
    }
    // Step 8 in flight: worker 0 has sent, worker 1 has not.
    BackgroundStep first(*training, kSeed, 8, 0);
    absl::Status refused;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      absl::StatusOr<uint64_t> again = training->job(1).Checkpoint();
      if (absl::IsUnavailable(again.status())) continue;  // a write is out
      if (!again.ok()) {
        refused = again.status();
        break;
      }
      EXPECT_EQ(*again, 7u);  // before worker 0's gradients arrived
      absl::SleepFor(absl::Milliseconds(2));
    }
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition)
        << refused;
    EXPECT_THAT(refused.message(), ::testing::HasSubstr("in flight"));
    BackgroundStep second(*training, kSeed, 8, 1);
    ASSERT_TRUE(first.Join().status.ok());
    ASSERT_TRUE(second.Join().status.ok());
    Train(*training, 9, 9);  // past the checkpoint, lost with the kill
  }
  KillServers();
  StartServers();
  std::unique_ptr<ClientTraining> resumed = Open("on-demand");
  ASSERT_NE(resumed, nullptr);
  EXPECT_THAT(Steps(*resumed), ::testing::Each(7u));
  EXPECT_EQ(resumed->StateChecksums().value(), whole_checksums_at_7);
  Train(*resumed, 8, 12);
  absl::StatusOr<std::vector<float>> master = resumed->PullMaster();
  ASSERT_TRUE(master.ok()) << master.status();
  EXPECT_TRUE(BitwiseEqual(whole_master, *master));
}

TEST(CheckpointRpcTest, AServerWithoutACheckpointDirSaysSo) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<std::unique_ptr<ClientTraining>> training =
      ClientTraining::Open({(*server)->grpc_address()},
                           SmallJobConfig("plain", 1, 1));
  ASSERT_TRUE(training.ok()) << training.status();
  absl::StatusOr<uint64_t> step = (*training)->job(0).Checkpoint();
  EXPECT_EQ(step.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(step.status().message(),
              ::testing::HasSubstr("no --checkpoint_dir"));
}

}  // namespace
}  // namespace depot::testing
