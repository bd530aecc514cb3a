// A step waiting for absent workers: what ShardState::OldestPendingStep
// reports about it, and how StallMonitor logs and counts it.
#include "server/stall_monitor.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/job_store.h"
#include "server/metrics.h"
#include "server/shard_state.h"
#include "server/tests/test_util.h"
#include "server/thread_pool.h"

namespace depot {
namespace {

using ::depot::testing::DrainPool;
using ::depot::testing::Fp32Payload;
using ::depot::testing::kWaitLimit;
using ::depot::testing::PlainSgdConfig;
using ::depot::testing::RecordingSink;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using Clock = std::chrono::steady_clock;

constexpr absl::Duration kThreshold = absl::Seconds(30);
// A moment well past kThreshold from now.
Clock::time_point PastTheThreshold() {
  return Clock::now() + std::chrono::seconds(60);
}

// Two chunks of 8 elements; `workers` data-parallel workers.
JobConfig TwoChunkJob(uint32_t workers) {
  return PlainSgdConfig({{"a", 16, 0}}, workers, /*chunk_elems=*/8,
                        /*alignment_elems=*/4);
}

class StallMonitorTest : public ::testing::Test {
 protected:
  std::shared_ptr<ShardState> CreateJob(const JobConfig& config) {
    return store_.CreateOrAttach(config, 0).value().shard;
  }

  // Worker `worker`'s header and gradient for `chunk` of `step`.
  static absl::Status Send(ShardState& shard, uint64_t step, uint32_t worker,
                           uint64_t chunk,
                           const std::shared_ptr<StepReplySink>& sink,
                           const StepNumerics& numerics = {}) {
    if (absl::Status s = shard.BeginStep(step, worker, {}, numerics, sink);
        !s.ok()) {
      return s;
    }
    Contribution contribution;
    contribution.step = step;
    contribution.worker_rank = worker;
    contribution.chunk_index = chunk;
    contribution.payload = Fp32Payload(std::vector<float>(8, 1.0f));
    contribution.sink = sink;
    return shard.Contribute(std::move(contribution));
  }

  // Logs from the monitor, in order.
  std::vector<std::string> logged() const {
    absl::MutexLock lock(&log_mu_);
    return log_;
  }

  StallMonitor MakeMonitor(absl::Duration threshold = kThreshold) {
    return StallMonitor(&store_, &metrics_, threshold,
                        [this](const std::string& line) {
                          absl::MutexLock lock(&log_mu_);
                          log_.push_back(line);
                          if (!logged_once_.HasBeenNotified()) {
                            logged_once_.Notify();
                          }
                        });
  }

  prometheus::Registry registry_;
  ServerMetrics metrics_{registry_};
  ThreadPool pool_{1};
  JobStore store_{/*memory_limit_bytes=*/1 << 20, &pool_, &metrics_};
  std::shared_ptr<RecordingSink> sink_ = std::make_shared<RecordingSink>();
  mutable absl::Mutex log_mu_;
  std::vector<std::string> log_ ABSL_GUARDED_BY(log_mu_);
  absl::Notification logged_once_;
};

TEST_F(StallMonitorTest, ANewShardHasNoPendingStep) {
  auto shard = CreateJob(TwoChunkJob(2));
  EXPECT_EQ(shard->OldestPendingStep().step, 0u);
}

TEST_F(StallMonitorTest, NamesTheWorkersThatHaveNotSentAChunkOthersSent) {
  auto shard = CreateJob(TwoChunkJob(4));
  const Clock::time_point before = Clock::now();
  ASSERT_TRUE(Send(*shard, 1, 0, 0, sink_).ok());
  ASSERT_TRUE(Send(*shard, 1, 2, 0, sink_).ok());
  const PendingStepReport report = shard->OldestPendingStep();
  EXPECT_EQ(report.step, 1u);
  EXPECT_THAT(report.missing_workers, ElementsAre(1, 3));
  EXPECT_GE(report.since, before);
  EXPECT_LE(report.since, Clock::now());
}

TEST_F(StallMonitorTest, MissingWorkersAreCollectedOverTheShardsChunks) {
  auto shard = CreateJob(TwoChunkJob(3));
  ASSERT_TRUE(Send(*shard, 1, 0, 0, sink_).ok());
  ASSERT_TRUE(Send(*shard, 1, 1, 0, sink_).ok());
  ASSERT_TRUE(Send(*shard, 1, 1, 1, sink_).ok());
  // Chunk 0 lacks worker 2, chunk 1 workers 0 and 2.
  EXPECT_THAT(shard->OldestPendingStep().missing_workers, ElementsAre(0, 2));
}

TEST_F(StallMonitorTest, ACompletedStepIsNoLongerPending) {
  auto shard = CreateJob(TwoChunkJob(2));
  for (uint32_t worker = 0; worker < 2; ++worker) {
    for (uint64_t chunk = 0; chunk < 2; ++chunk) {
      ASSERT_TRUE(Send(*shard, 1, worker, chunk, sink_).ok());
    }
  }
  sink_->WaitFor(4);
  DrainPool(pool_);
  EXPECT_EQ(shard->completed_step(), 1u);
  EXPECT_EQ(shard->OldestPendingStep().step, 0u);
}

TEST_F(StallMonitorTest, TheOldestPendingStepIsReported) {
  auto shard = CreateJob(TwoChunkJob(2));
  // Chunk 0 applies step 1 and gets worker 0's step 2; chunk 1 waits for
  // worker 1's step 1.
  ASSERT_TRUE(Send(*shard, 1, 0, 0, sink_).ok());
  ASSERT_TRUE(Send(*shard, 1, 1, 0, sink_).ok());
  ASSERT_TRUE(Send(*shard, 1, 0, 1, sink_).ok());
  sink_->WaitFor(2);
  DrainPool(pool_);
  ASSERT_TRUE(Send(*shard, 2, 0, 0, sink_).ok());
  const PendingStepReport report = shard->OldestPendingStep();
  EXPECT_EQ(report.step, 1u);
  EXPECT_THAT(report.missing_workers, ElementsAre(1));
}

TEST_F(StallMonitorTest, AStepWaitingForItsCommitMissesNoWorker) {
  auto shard = CreateJob(TwoChunkJob(2));
  StepNumerics two_phase;
  two_phase.two_phase = true;
  for (uint32_t worker = 0; worker < 2; ++worker) {
    for (uint64_t chunk = 0; chunk < 2; ++chunk) {
      ASSERT_TRUE(Send(*shard, 1, worker, chunk, sink_, two_phase).ok());
    }
  }
  sink_->WaitForGradStats();
  const PendingStepReport report = shard->OldestPendingStep();
  EXPECT_EQ(report.step, 1u);
  EXPECT_THAT(report.missing_workers, IsEmpty());
}

TEST_F(StallMonitorTest, NothingIsStalledBeforeTheThreshold) {
  auto shard = CreateJob(TwoChunkJob(2));
  ASSERT_TRUE(Send(*shard, 1, 0, 0, sink_).ok());
  StallMonitor monitor = MakeMonitor();
  monitor.Check(Clock::now());
  EXPECT_THAT(logged(), IsEmpty());
  EXPECT_EQ(metrics_.stalled_steps.Value(), 0);
  EXPECT_EQ(metrics_.step_stalls.Value(), 0);
}

TEST_F(StallMonitorTest, AStalledStepIsLoggedAndCountedOnce) {
  auto shard = CreateJob(TwoChunkJob(2));
  ASSERT_TRUE(Send(*shard, 1, 0, 0, sink_).ok());
  StallMonitor monitor = MakeMonitor();
  monitor.Check(PastTheThreshold());
  monitor.Check(PastTheThreshold());
  ASSERT_EQ(logged().size(), 1u);
  EXPECT_THAT(logged()[0], ::testing::StartsWith(
                               "job 1 \"test-job\": step 1 is stalled: it has "
                               "waited 6"));
  EXPECT_THAT(logged()[0],
              ::testing::HasSubstr(" s for worker rank 1 (of 2) to send their "
                                   "gradients"));
  EXPECT_EQ(metrics_.step_stalls.Value(), 1);
  EXPECT_EQ(metrics_.stalled_steps.Value(), 1);
  EXPECT_EQ(metrics_.stalled_step_missing_workers.Value(), 1);
  EXPECT_GE(metrics_.stalled_step_wait_seconds.Value(), 59);
}

TEST_F(StallMonitorTest, AStepThatMovesOnLeavesTheGauges) {
  auto shard = CreateJob(TwoChunkJob(2));
  ASSERT_TRUE(Send(*shard, 1, 0, 0, sink_).ok());
  StallMonitor monitor = MakeMonitor();
  monitor.Check(PastTheThreshold());
  ASSERT_EQ(metrics_.stalled_steps.Value(), 1);
  ASSERT_TRUE(Send(*shard, 1, 1, 0, sink_).ok());
  sink_->WaitFor(2);
  DrainPool(pool_);
  monitor.Check(PastTheThreshold());
  EXPECT_EQ(metrics_.stalled_steps.Value(), 0);
  EXPECT_EQ(metrics_.stalled_step_missing_workers.Value(), 0);
  EXPECT_EQ(metrics_.stalled_step_wait_seconds.Value(), 0);
  EXPECT_EQ(metrics_.step_stalls.Value(), 1);
}

TEST_F(StallMonitorTest, EachStalledStepOfAJobIsLogged) {
  auto shard = CreateJob(TwoChunkJob(2));
  StallMonitor monitor = MakeMonitor();
  // Step 1 stalls on chunk 1 (worker 1 missing), then completes; step 2
  // stalls the same way.
  for (uint64_t step = 1; step <= 2; ++step) {
    ASSERT_TRUE(Send(*shard, step, 0, 0, sink_).ok());
    ASSERT_TRUE(Send(*shard, step, 0, 1, sink_).ok());
    ASSERT_TRUE(Send(*shard, step, 1, 0, sink_).ok());
    monitor.Check(PastTheThreshold());
    ASSERT_TRUE(Send(*shard, step, 1, 1, sink_).ok());
    sink_->WaitFor(4 * step);
    DrainPool(pool_);
  }
  EXPECT_EQ(logged().size(), 2u);
  EXPECT_EQ(metrics_.step_stalls.Value(), 2);
}

TEST_F(StallMonitorTest, ItsThreadFindsAStalledStepWithinTheInterval) {
  auto shard = CreateJob(TwoChunkJob(2));
  ASSERT_TRUE(Send(*shard, 1, 0, 0, sink_).ok());
  StallMonitor monitor = MakeMonitor(absl::Milliseconds(20));
  EXPECT_EQ(monitor.CheckInterval(), absl::Milliseconds(10));
  monitor.Start();
  EXPECT_TRUE(logged_once_.WaitForNotificationWithTimeout(kWaitLimit));
  monitor.Stop();
  EXPECT_EQ(metrics_.step_stalls.Value(), 1);
}

}  // namespace
}  // namespace depot
