// A worker killed with SIGKILL at random points of a run, and started again,
// rejoins exactly: it reads the job's status, pulls the weights at the
// oldest step the servers report, and the run ends bitwise where an
// uninterrupted one does (issue 12 part 5; docs/protocol.md, "A worker that
// rejoins").
//
// Two real servers, W = 2: worker 0 runs in this process, worker 1 is the
// depot_rejoin_worker process. The model's gradient depends on the whole
// model (CoupledGradients), so a rejoined worker that pulled weights of two
// different steps, some chunks already updated by the step it was killed in
// and others not, sends wrong gradients for the chunks it had not sent, and
// the run diverges. Kill points land before, in the middle of and after a
// step's transfers; some leave one server having completed the step (it had
// all of the worker's chunks) while the other waits ("split"): the restarted
// worker then pulls the older step from both, which the first holds as the
// weights its chunks sent for it.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bitwise_compare.h"
#include "depot/client.h"
#include "gtest/gtest.h"
#include "rejoin_worker.h"
#include "server_process.h"
#include "training_data.h"
#include "two_servers.h"

namespace depot::testing {
namespace {

constexpr uint64_t kSeed = 12;
constexpr uint64_t kSteps = 8;
constexpr int kKillPoints = 20;

// One worker's client and job, on the calling process.
struct LocalWorker {
  std::unique_ptr<Client> client;
  std::unique_ptr<Job> job;
};

// The state a run ends with.
struct RunEnd {
  std::vector<float> master;
  std::vector<uint64_t> checksums;
};

class RejoinTest : public TwoServers {
 protected:
  LocalWorker Open(const std::string& name, uint32_t rank) {
    LocalWorker worker;
    ClientOptions options;
    options.servers = Addresses();
    options.step_timeout = absl::Minutes(1);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return worker;
    worker.client = *std::move(client);
    absl::StatusOr<std::unique_ptr<Job>> job =
        worker.client->OpenJob(RejoinJobConfig(name), rank);
    EXPECT_TRUE(job.ok()) << job.status();
    if (job.ok()) worker.job = *std::move(job);
    return worker;
  }

  static absl::Status InitWeights(Job& job) {
    const std::string weights =
        MakeInitialWeights(job.layout(), DType::kFloat32, kSeed);
    return job.InitWeights(weights.data(), DType::kFloat32);
  }

  static RunEnd End(Job& job) {
    RunEnd end;
    end.master.resize(job.total_elems());
    EXPECT_TRUE(
        job.Pull(0, job.total_elems(), DType::kFloat32, end.master.data())
            .ok());
    absl::StatusOr<std::vector<ServerJobStatus>> status = job.Status(true);
    EXPECT_TRUE(status.ok()) << status.status();
    if (status.ok()) {
      for (const ServerJobStatus& server : *status) {
        EXPECT_EQ(server.step, kSteps);
        end.checksums.push_back(server.state_checksum);
      }
    }
    return end;
  }

  // The worker process of rank 1, dying at (die_at_step, die_after_us) when
  // die_at_step is not 0.
  absl::StatusOr<std::unique_ptr<ServerProcess>> SpawnWorker(
      const std::string& name, uint64_t die_at_step, uint64_t die_after_us) {
    std::vector<std::string> args = {
        absl::StrCat("--servers=", absl::StrJoin(Addresses(), ",")),
        absl::StrCat("--job=", name), "--rank=1",
        absl::StrCat("--seed=", kSeed), absl::StrCat("--last_step=", kSteps)};
    if (die_at_step != 0) {
      args.push_back(absl::StrCat("--die_at_step=", die_at_step));
      args.push_back(absl::StrCat("--die_after_us=", die_after_us));
    }
    return ServerProcess::Spawn(DEPOT_REJOIN_WORKER_PATH, args);
  }
};

TEST_F(RejoinTest, WorkerKilledAtTwentyRandomPointsRejoinsBitwise) {
  // The uninterrupted run, both workers in this process.
  RunEnd reference;
  double step_us = 0;
  {
    LocalWorker w0 = Open("reference", 0);
    LocalWorker w1 = Open("reference", 1);
    ASSERT_NE(w0.job, nullptr);
    ASSERT_NE(w1.job, nullptr);
    ASSERT_TRUE(InitWeights(*w0.job).ok());
    const auto start = std::chrono::steady_clock::now();
    absl::Status s1;
    uint64_t from1 = 0;
    std::vector<uint64_t> steps1;
    std::thread t1([&] {
      s1 = RejoinAndTrain(*w1.job, kSeed, kSteps, {}, &from1, &steps1);
    });
    uint64_t from0 = 0;
    std::vector<uint64_t> steps0;
    absl::Status s0 =
        RejoinAndTrain(*w0.job, kSeed, kSteps, {}, &from0, &steps0);
    t1.join();
    ASSERT_TRUE(s0.ok()) << s0;
    ASSERT_TRUE(s1.ok()) << s1;
    step_us = std::chrono::duration<double, std::micro>(
                  std::chrono::steady_clock::now() - start)
                  .count() /
              kSteps;
    reference = End(*w0.job);
    ASSERT_TRUE(w0.job->Delete().ok());
  }

  // Kill points: a step in [1, kSteps - 2] and a delay after its Job::Step
  // begins of up to 1.5 step times, so that most land in the middle of the
  // step's transfers and some after it. A fixed seed, printed: the same
  // points each run (timing decides where in the transfers each lands).
  constexpr uint64_t kKillSeed = 20261124;
  std::printf("kill points from seed %llu, step time %.0f us\n",
              static_cast<unsigned long long>(kKillSeed), step_us);
  std::mt19937_64 random(kKillSeed);
  int equal_points = 0;
  int killed_mid_step = 0;
  int splits = 0;
  for (int point = 0; point < kKillPoints; ++point) {
    const std::string name = absl::StrCat("rejoin-", point);
    const uint64_t die_at_step =
        std::uniform_int_distribution<uint64_t>(1, kSteps - 2)(random);
    const uint64_t die_after_us = std::uniform_int_distribution<uint64_t>(
        0, static_cast<uint64_t>(1.5 * step_us))(random);
    SCOPED_TRACE(absl::StrCat("kill point ", point, ": step ", die_at_step,
                              " + ", die_after_us, " us"));
    LocalWorker w0 = Open(name, 0);
    ASSERT_NE(w0.job, nullptr);
    ASSERT_TRUE(InitWeights(*w0.job).ok());
    absl::StatusOr<std::unique_ptr<ServerProcess>> victim =
        SpawnWorker(name, die_at_step, die_after_us);
    ASSERT_TRUE(victim.ok()) << victim.status();
    absl::Status s0;
    uint64_t from0 = 0;
    std::vector<uint64_t> steps0;
    std::thread t0([&] {
      s0 = RejoinAndTrain(*w0.job, kSeed, kSteps, {}, &from0, &steps0);
    });
    absl::StatusOr<ProcessExit> died = (*victim)->Wait(absl::Seconds(60));
    ASSERT_TRUE(died.ok()) << died.status();
    EXPECT_EQ(died->signal, SIGKILL) << (*victim)->Log();

    // What the servers hold now: a step that waits for worker 1 is a kill in
    // the middle of a step.
    absl::StatusOr<std::vector<ServerJobStatus>> status = w0.job->Status(false);
    ASSERT_TRUE(status.ok()) << status.status();
    std::vector<std::string> servers;
    bool waits_for_victim = false;
    for (const ServerJobStatus& server : *status) {
      servers.push_back(absl::StrCat(
          "step ", server.step, " pending ", server.pending_step, " missing [",
          absl::StrJoin(server.missing_workers, ","), "]"));
      waits_for_victim |= server.pending_step != 0 &&
                          std::count(server.missing_workers.begin(),
                                     server.missing_workers.end(), 1u) > 0;
    }

    absl::StatusOr<std::unique_ptr<ServerProcess>> restarted =
        SpawnWorker(name, 0, 0);
    ASSERT_TRUE(restarted.ok()) << restarted.status();
    absl::StatusOr<ProcessExit> done = (*restarted)->Wait(absl::Seconds(60));
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_TRUE(done->ExitedWith(0)) << (*restarted)->Log();
    t0.join();
    ASSERT_TRUE(s0.ok()) << s0;

    // The steps the restarted worker found: a split when they differ.
    const std::string log = (*restarted)->Log();
    const size_t at = log.find("servers at steps ");
    ASSERT_NE(at, std::string::npos) << log;
    const std::string found =
        log.substr(at + 17, log.find(';', at) - (at + 17));
    const std::vector<std::string> steps = absl::StrSplit(found, ',');
    const bool split = std::count(steps.begin(), steps.end(), steps[0]) !=
                       static_cast<long>(steps.size());

    const RunEnd end = End(*w0.job);
    const bool equal =
        static_cast<bool>(BitwiseEqual(reference.master, end.master)) &&
        end.checksums == reference.checksums;
    equal_points += equal;
    splits += split;
    killed_mid_step += waits_for_victim;
    EXPECT_TRUE(equal) << "servers then: " << absl::StrJoin(servers, " | ");
    std::printf(
        "kill point %2d: step %llu + %6llu us; servers then: %s; the restarted "
        "worker found steps %s%s; %s\n",
        point, static_cast<unsigned long long>(die_at_step),
        static_cast<unsigned long long>(die_after_us),
        absl::StrJoin(servers, " | ").c_str(), found.c_str(),
        split ? " (split)" : "", equal ? "bitwise equal" : "DIVERGED");
    ASSERT_TRUE(w0.job->Delete().ok());
  }
  std::printf(
      "%d of %d kill points ended bitwise equal (%d in the middle of a step, "
      "%d with the servers at different steps)\n",
      equal_points, kKillPoints, killed_mid_step, splits);
  EXPECT_EQ(equal_points, kKillPoints);
  // The kill points exercise what they are for: steps left half applied,
  // waiting for the killed worker.
  EXPECT_GE(killed_mid_step, 1);
}

}  // namespace
}  // namespace depot::testing
