// Rolling back (issue 12 part 2, docs/checkpoints.md "Rolling back") through
// real depot-server processes: a server killed with SIGKILL and restarted on
// its checkpoint directory comes back behind the others; the clients' next
// step finds it, rolls every server back to the newest step all of them can
// return to, and tells each trainer (RolledBackError) the step to resume
// after. Every server sits behind a FaultProxy whose address the clients keep
// while the server behind it restarts on a new port.
//
// The chaos test kills a random server at random moments many times during a
// run and checks that the run ends bitwise where an uninterrupted one does.
// CI runs it short; DEPOT_CHAOS_STEPS, DEPOT_CHAOS_KILLS and DEPOT_CHAOS_SEED
// make it the long run (scripts/chaos.sh).
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bitwise_compare.h"
#include "client_training.h"
#include "fault_proxy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server_process.h"
#include "training_data.h"

namespace depot::testing {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kSeed = 31;

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* text = std::getenv(name);
  uint64_t value = 0;
  if (text == nullptr || !absl::SimpleAtoi(text, &value)) return fallback;
  return value;
}

class RollBackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") +
                          "/depot-rollback-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
  }
  void TearDown() override {
    proxies_.clear();
    servers_.clear();
    fs::remove_all(root_);
  }

  std::string CheckpointDir(uint32_t server) const {
    return absl::StrCat(root_, "/server-", server);
  }

  absl::StatusOr<std::unique_ptr<ServerProcess>> StartServer(uint32_t s) {
    std::vector<std::string> flags = {
        absl::StrCat("--checkpoint_dir=", CheckpointDir(s)),
        absl::StrCat("--checkpoint_every_steps=", every_),
        absl::StrCat("--checkpoint_keep=", keep_),
        absl::StrCat("--threads=", 1 + s % 2)};
    flags.insert(flags.end(), extra_flags_.begin(), extra_flags_.end());
    return ServerProcess::Start(flags);
  }

  static int PortOf(const std::string& address) {
    int port = 0;
    EXPECT_TRUE(
        absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port));
    return port;
  }

  void StartServers(uint32_t count) {
    for (uint32_t s = 0; s < count; ++s) {
      absl::StatusOr<std::unique_ptr<ServerProcess>> server = StartServer(s);
      ASSERT_TRUE(server.ok()) << server.status();
      absl::StatusOr<std::unique_ptr<FaultProxy>> proxy =
          FaultProxy::Start((*server)->grpc_address());
      ASSERT_TRUE(proxy.ok()) << proxy.status();
      servers_.push_back(*std::move(server));
      proxies_.push_back(*std::move(proxy));
    }
  }

  // SIGKILL of server `s`, then a restart on its checkpoint directory (it
  // restores its jobs before it serves); its proxy forwards to the new port.
  void KillAndRestart(uint32_t s) {
    ASSERT_TRUE(servers_[s]->Kill().ok());
    proxies_[s]->Cut();
    absl::StatusOr<std::unique_ptr<ServerProcess>> server = StartServer(s);
    ASSERT_TRUE(server.ok()) << server.status();
    servers_[s] = *std::move(server);
    proxies_[s]->SetTargetPort(PortOf(servers_[s]->grpc_address()));
  }

  std::vector<std::string> Addresses() const {
    std::vector<std::string> addresses;
    for (const auto& proxy : proxies_) addresses.push_back(proxy->address());
    return addresses;
  }

  std::unique_ptr<ClientTraining> Open(const std::string& name,
                                       uint32_t workers = 2) {
    absl::StatusOr<std::unique_ptr<ClientTraining>> training =
        ClientTraining::Open(
            Addresses(),
            SmallJobConfig(name, workers,
                           static_cast<uint32_t>(servers_.size())),
            absl::Minutes(2), ClientOptions().connections_per_server,
            absl::Seconds(20));
    EXPECT_TRUE(training.ok()) << training.status();
    return training.ok() ? *std::move(training) : nullptr;
  }

  static void Train(ClientTraining& training, uint64_t first, uint64_t last) {
    for (const WorkerOutcome& outcome : training.RunSteps(kSeed, first, last)) {
      ASSERT_TRUE(outcome.status.ok()) << outcome.status;
    }
  }

  // An uninterrupted run of `name` for steps 1..last: its master weights and
  // state checksums. The job is deleted afterwards.
  void Reference(const std::string& name, uint64_t last,
                 std::vector<float>* master, std::vector<uint64_t>* sums) {
    std::unique_ptr<ClientTraining> whole = Open(name);
    ASSERT_NE(whole, nullptr);
    ASSERT_TRUE(whole->InitWeights(kSeed, DType::kFloat32).ok());
    Train(*whole, 1, last);
    *master = whole->PullMaster().value();
    *sums = whole->StateChecksums().value();
    ASSERT_TRUE(whole->job(0).Delete().ok());
  }

  std::string Manifest(const std::string& job, uint32_t server,
                       uint64_t step) const {
    return absl::StrFormat("%s/job-%s/step-%020d/manifest-%d-of-%d",
                           CheckpointDir(server), job, step, server,
                           servers_.size());
  }

  void WaitForCheckpoint(const std::string& job, uint64_t step) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    for (uint32_t s = 0; s < servers_.size(); ++s) {
      while (!fs::exists(Manifest(job, s, step))) {
        ASSERT_LT(absl::Now(), deadline)
            << "no checkpoint of step " << step << " on server " << s << "\n"
            << servers_[s]->Log();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  }

  // Opens `name`, initialises it and trains steps 1..last, waiting for each
  // checkpoint before the next checkpoint step (one that comes while the
  // previous write is still out is skipped). Null after a failure.
  std::unique_ptr<ClientTraining> OpenAndTrain(const std::string& name,
                                               uint64_t last) {
    std::unique_ptr<ClientTraining> training = Open(name);
    if (training == nullptr) return nullptr;
    const absl::Status init = training->InitWeights(kSeed, DType::kFloat32);
    EXPECT_TRUE(init.ok()) << init;
    uint64_t done = 0;
    for (uint64_t at = every_; at <= last; at += every_) {
      Train(*training, done + 1, at);
      WaitForCheckpoint(name, at);
      done = at;
    }
    Train(*training, done + 1, last);
    return ::testing::Test::HasFailure() ? nullptr : std::move(training);
  }

  // What one worker's loop saw.
  struct Loop {
    absl::Status failure;            // a step that failed for good
    std::vector<uint64_t> resumed;   // the steps RolledBackError named
    std::vector<uint64_t> lost;      // steps each rollback took back
  };

  // Runs steps first..last of worker `rank`, going back on RolledBackError
  // and sending a step again after other failures (a server down), up to
  // kMaxFailures in a row.
  // `pause` between steps stands for the trainer's compute; `progress`, when
  // given, gets each step done.
  static Loop RunWorker(ClientTraining& training, uint32_t rank,
                        uint64_t first, uint64_t last,
                        absl::Duration pause = absl::ZeroDuration(),
                        std::atomic<uint64_t>* progress = nullptr) {
    constexpr int kMaxFailures = 20;
    Loop loop;
    int failures = 0;
    for (uint64_t step = first; step <= last;) {
      absl::SleepFor(pause);
      const WorkerOutcome outcome = training.RunStep(kSeed, step, rank);
      if (outcome.status.ok()) {
        if (progress != nullptr) *progress = step;
        failures = 0;
        ++step;
        continue;
      }
      if (std::optional<uint64_t> back = RolledBackStep(outcome.status)) {
        loop.resumed.push_back(*back);
        loop.lost.push_back(step - 1 - *back);
        step = *back + 1;
        failures = 0;
        continue;
      }
      // Step itself waited for the servers (its retries and Reconcile's, up
      // to ClientOptions::unavailable_retry): send the step again at once.
      if (++failures > kMaxFailures) {
        loop.failure = outcome.status;
        return loop;
      }
    }
    return loop;
  }

  std::string root_;
  uint64_t every_ = 5;
  int keep_ = 3;
  std::vector<std::string> extra_flags_;  // every server's, after the above
  std::vector<std::unique_ptr<ServerProcess>> servers_;
  std::vector<std::unique_ptr<FaultProxy>> proxies_;
};

TEST_F(RollBackTest, AServerRestartedBehindRollsTheJobBackAndItEndsBitwise) {
  ASSERT_NO_FATAL_FAILURE(StartServers(2));
  std::vector<float> whole_master;
  std::vector<uint64_t> whole_sums;
  ASSERT_NO_FATAL_FAILURE(Reference("whole", 20, &whole_master, &whole_sums));

  std::unique_ptr<ClientTraining> training = OpenAndTrain("behind", 12);
  ASSERT_NE(training, nullptr);
  // Server 0 restarts at step 10; server 1 is at 12.
  ASSERT_NO_FATAL_FAILURE(KillAndRestart(0));

  std::vector<Loop> loops(2);
  std::vector<std::thread> threads;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      loops[rank] = RunWorker(*training, rank, 13, 20);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Loop& loop : loops) {
    ASSERT_TRUE(loop.failure.ok())
        << loop.failure << "\n" << servers_[0]->Log() << servers_[1]->Log();
    EXPECT_THAT(loop.resumed, ::testing::ElementsAre(10u));
  }
  EXPECT_THAT(servers_[1]->Log(),
              ::testing::HasSubstr("\"behind\" rolled back to step 10 "
                                   "(restored from its checkpoint"));
  absl::StatusOr<std::vector<float>> master = training->PullMaster();
  ASSERT_TRUE(master.ok()) << master.status();
  EXPECT_TRUE(BitwiseEqual(whole_master, *master));
  EXPECT_EQ(training->StateChecksums().value(), whole_sums);
}

TEST_F(RollBackTest, ARollBackToAStepWithoutCheckpointChangesNothing) {
  ASSERT_NO_FATAL_FAILURE(StartServers(2));
  std::unique_ptr<ClientTraining> training = OpenAndTrain("refused", 7);
  ASSERT_NE(training, nullptr);
  const std::vector<uint64_t> before = training->StateChecksums().value();

  absl::Status status = training->job(0).RollBack(3);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_THAT(std::string(status.message()),
              ::testing::HasSubstr("no complete checkpoint of step 3"));
  status = training->job(0).RollBack(9);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_EQ(training->StateChecksums().value(), before);

  absl::StatusOr<std::vector<ServerCheckpoints>> listed =
      training->job(0).ListCheckpoints();
  ASSERT_TRUE(listed.ok()) << listed.status();
  for (const ServerCheckpoints& server : *listed) {
    EXPECT_THAT(server.steps, ::testing::ElementsAre(5u));
    EXPECT_EQ(server.step, 7u);
    EXPECT_EQ(server.newest_step, 7u);
  }
  // Nothing to reconcile: every server at one step.
  absl::StatusOr<Reconciled> reconciled = training->job(1).Reconcile();
  ASSERT_TRUE(reconciled.ok()) << reconciled.status();
  EXPECT_EQ(reconciled->step, 7u);
  EXPECT_FALSE(reconciled->rolled_back);
  Train(*training, 8, 8);
}

// An operator's rollback while a step is half sent: the waiting worker's step
// ends in RolledBackError, the other's step after it too, and both go on from
// the checkpoint to the end of an uninterrupted run.
TEST_F(RollBackTest, ARollBackAbortsTheStepInFlight) {
  ASSERT_NO_FATAL_FAILURE(StartServers(2));
  std::vector<float> whole_master;
  std::vector<uint64_t> whole_sums;
  ASSERT_NO_FATAL_FAILURE(Reference("whole", 12, &whole_master, &whole_sums));

  std::unique_ptr<ClientTraining> training = OpenAndTrain("operator", 7);
  ASSERT_NE(training, nullptr);
  Loop waiting;
  std::thread worker0([&] { waiting = RunWorker(*training, 0, 8, 12); });
  // Worker 0's step 8 waits for worker 1.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (true) {
    absl::StatusOr<std::vector<ServerJobStatus>> status =
        training->job(1).Status(false);
    ASSERT_TRUE(status.ok()) << status.status();
    if ((*status)[0].pending_step == 8 && (*status)[1].pending_step == 8) {
      break;
    }
    ASSERT_LT(absl::Now(), deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(training->job(1).RollBack(5).ok());
  const Loop other = RunWorker(*training, 1, 8, 12);
  worker0.join();
  ASSERT_TRUE(waiting.failure.ok()) << waiting.failure;
  ASSERT_TRUE(other.failure.ok()) << other.failure;
  EXPECT_THAT(waiting.resumed, ::testing::ElementsAre(5u));
  EXPECT_THAT(other.resumed, ::testing::ElementsAre(5u));
  EXPECT_TRUE(BitwiseEqual(whole_master, training->PullMaster().value()));
  EXPECT_EQ(training->StateChecksums().value(), whole_sums);
}

// --checkpoint_max_lag_steps=0, with checkpoint writes slowed to outlast
// several steps: a step after a checkpoint step completes only once that
// checkpoint is written on every server (so a kill never loses more than the
// interval). The same run without the flag goes on while the write does.
TEST_F(RollBackTest, WithNoLagAStepWaitsForTheCheckpointBeforeIt) {
  every_ = 2;
  // A shard's checkpoint is about 20 KB here: about 1.5 s at 16 KiB/s.
  const std::string slow = "--checkpoint_write_bytes_per_second=16384";
  for (const bool held : {false, true}) {
    SCOPED_TRACE(held ? "--checkpoint_max_lag_steps=0" : "no lag limit");
    extra_flags_ = {slow};
    if (held) extra_flags_.push_back("--checkpoint_max_lag_steps=0");
    ASSERT_NO_FATAL_FAILURE(StartServers(2));
    const std::string name = held ? "held" : "free";
    std::unique_ptr<ClientTraining> training = Open(name);
    ASSERT_NE(training, nullptr);
    ASSERT_TRUE(training->InitWeights(kSeed, DType::kFloat32).ok());
    Train(*training, 1, 2);  // step 2 is a checkpoint step
    const absl::Time start = absl::Now();
    Train(*training, 3, 3);
    const absl::Duration step_3 = absl::Now() - start;
    int written = 0;
    for (uint32_t s = 0; s < servers_.size(); ++s) {
      written += fs::exists(Manifest(name, s, 2));
    }
    if (held) {
      EXPECT_EQ(written, 2) << "step 3 completed before the checkpoint of "
                               "step 2 was written";
      EXPECT_GT(step_3, absl::Milliseconds(500));
    } else {
      EXPECT_EQ(written, 0) << "the write was not slow enough to tell";
    }
    // Step 4 (a checkpoint step) is within the lag of nothing out.
    Train(*training, 4, 4);
    proxies_.clear();
    servers_.clear();
  }
}

// 3 servers, W = 2, a checkpoint every 10 steps: a random server is killed
// with SIGKILL at random moments after the first checkpoint (some while it
// writes one) and restarted; the run ends bitwise equal to an uninterrupted
// one.
TEST_F(RollBackTest, ChaosKillsEndBitwise) {
  every_ = 10;
  // No step completes ahead of a checkpoint being written: a kill loses at
  // most the interval, even one that lands during a write.
  extra_flags_ = {"--checkpoint_max_lag_steps=0"};
  const uint64_t steps = EnvOr("DEPOT_CHAOS_STEPS", 60);
  const uint64_t kills = EnvOr("DEPOT_CHAOS_KILLS", 4);
  const uint64_t seed = EnvOr("DEPOT_CHAOS_SEED", 7);
  std::printf("chaos: %d steps, %d kills, seed %d\n", static_cast<int>(steps),
              static_cast<int>(kills), static_cast<int>(seed));
  ASSERT_NO_FATAL_FAILURE(StartServers(3));
  std::vector<float> whole_master;
  std::vector<uint64_t> whole_sums;
  ASSERT_NO_FATAL_FAILURE(
      Reference("whole", steps, &whole_master, &whole_sums));

  std::unique_ptr<ClientTraining> training = Open("chaos");
  ASSERT_NE(training, nullptr);
  ASSERT_TRUE(training->InitWeights(kSeed, DType::kFloat32).ok());
  std::atomic<bool> done{false};
  std::atomic<uint64_t> progress{0};
  std::vector<Loop> loops(2);
  std::vector<std::thread> threads;
  // 5 ms of "compute" per step: a checkpoint (a few ms to write here) is
  // written before the next checkpoint step, as with real step times.
  for (uint32_t rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      loops[rank] = RunWorker(*training, rank, 1, steps, absl::Milliseconds(5),
                              rank == 0 ? &progress : nullptr);
      done = true;
    });
  }
  // The killer, on this thread (ServerProcess::Start's rule): kill points
  // at random steps of the run, random victims, and a random moment inside
  // the step; every other kill first waits briefly for a checkpoint write
  // to be in progress on the victim (its temporary file on disk).
  std::mt19937_64 random(seed);
  std::vector<uint64_t> points;
  for (uint64_t k = 0; k < kills; ++k) {
    points.push_back(
        std::uniform_int_distribution<uint64_t>(every_ + 1, steps - 10)(random));
  }
  std::sort(points.begin(), points.end());
  // Before the first checkpoint a killed server has nothing to restore: the
  // job is lost there (Reconcile says so, DATA_LOSS). Kills start once every
  // server holds one.
  while (progress < every_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_NO_FATAL_FAILURE(WaitForCheckpoint("chaos", every_));
  int during_write = 0;
  for (uint64_t k = 0; k < kills && !done; ++k) {
    while (progress < points[k] && !done) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(
        std::uniform_int_distribution<int>(0, 5000)(random)));
    const uint32_t victim = std::uniform_int_distribution<uint32_t>(
        0, static_cast<uint32_t>(servers_.size()) - 1)(random);
    if (k % 2 == 1) {
      const absl::Time until = absl::Now() + absl::Milliseconds(300);
      bool writing = false;
      while (!writing && absl::Now() < until && !done) {
        std::error_code error;
        for (auto it = fs::recursive_directory_iterator(
                 CheckpointDir(victim), error);
             !error && it != fs::recursive_directory_iterator();
             it.increment(error)) {
          if (it->path().filename().string().find(".tmp-") !=
              std::string::npos) {
            writing = true;
            break;
          }
        }
      }
      during_write += writing;
    }
    // Not in the last steps: a worker that has finished could not redo them
    // with the other after a rollback.
    if (done || progress + 8 > steps) break;
    std::printf("chaos: kill %d of server %d near step %d\n",
                static_cast<int>(k + 1), static_cast<int>(victim),
                static_cast<int>(progress.load()));
    ASSERT_NO_FATAL_FAILURE(KillAndRestart(victim));
  }
  for (std::thread& t : threads) t.join();
  // A kill that landed as the run ended: both workers open the job again
  // and finish it from where it is.
  for (uint32_t rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(training->job(rank).Reconcile().ok());
  }
  absl::StatusOr<Reconciled> at = training->job(0).Reconcile();
  ASSERT_TRUE(at.ok()) << at.status();
  if (at->step < steps) {
    std::printf("chaos: the last kill left the job at step %d\n",
                static_cast<int>(at->step));
    std::vector<Loop> rest(2);
    std::vector<std::thread> finishers;
    for (uint32_t rank = 0; rank < 2; ++rank) {
      finishers.emplace_back([&, rank] {
        rest[rank] = RunWorker(*training, rank, at->step + 1, steps);
      });
    }
    for (std::thread& t : finishers) t.join();
    for (const Loop& loop : rest) ASSERT_TRUE(loop.failure.ok()) << loop.failure;
  }
  uint64_t most_lost = 0;
  for (const Loop& loop : loops) {
    ASSERT_TRUE(loop.failure.ok()) << loop.failure;
    for (uint64_t lost : loop.lost) most_lost = std::max(most_lost, lost);
  }
  std::printf(
      "chaos: rollbacks seen by worker 0: %d, by worker 1: %d; most steps "
      "lost by one: %d; kills during a checkpoint write: %d\n",
      static_cast<int>(loops[0].resumed.size()),
      static_cast<int>(loops[1].resumed.size()), static_cast<int>(most_lost),
      during_write);
  absl::StatusOr<std::vector<float>> master = training->PullMaster();
  ASSERT_TRUE(master.ok()) << master.status();
  EXPECT_TRUE(BitwiseEqual(whole_master, *master));
  EXPECT_EQ(training->StateChecksums().value(), whole_sums);
  // A kill loses at most the interval: with --checkpoint_max_lag_steps=0 no
  // worker saw a step after a checkpoint step complete before that
  // checkpoint was written everywhere, so a kill during its write goes back
  // to the one before, which the workers had not passed by more than that.
  EXPECT_LE(most_lost, every_);
}

}  // namespace
}  // namespace depot::testing
