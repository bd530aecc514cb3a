// A step whose peer worker never comes: the worker that steps must learn, from
// its DEADLINE_EXCEEDED, which ranks the servers wait for; the servers must
// say the same in their log, their metrics and GetJob.
//
// Two servers, a W=2 job, only worker 0 steps, with a short step_timeout. The
// servers check for stalled steps every 10 ms with a threshold below the
// timeout, so by the time the step fails they have noticed it too.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client_training.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics_scrape.h"
#include "server_process.h"
#include "training_data.h"

namespace depot::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kSeed = 5;
constexpr absl::Duration kStepTimeout = absl::Seconds(2);
// Far below kStepTimeout: the servers report the stall while the step waits.
constexpr char kStalledStepFlag[] = "--stalled_step_seconds=0.05";
// Only a backstop for waiting on the servers' metrics.
constexpr absl::Duration kWaitLimit = absl::Seconds(60);

class StalledStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int s = 0; s < 2; ++s) {
      absl::StatusOr<std::unique_ptr<ServerProcess>> server =
          ServerProcess::Start({kStalledStepFlag, "--threads=1"});
      ASSERT_TRUE(server.ok()) << server.status();
      servers_.push_back(*std::move(server));
    }
    absl::StatusOr<std::unique_ptr<ClientTraining>> training =
        ClientTraining::Open(Addresses(), SmallJobConfig("stalled", 2, 2),
                             kStepTimeout);
    ASSERT_TRUE(training.ok()) << training.status();
    training_ = *std::move(training);
    absl::Status init = training_->InitWeights(kSeed, DType::kFloat32);
    ASSERT_TRUE(init.ok()) << init;
  }

  std::vector<std::string> Addresses() const {
    return {servers_[0]->grpc_address(), servers_[1]->grpc_address()};
  }

  std::vector<std::unique_ptr<ServerProcess>> servers_;
  std::unique_ptr<ClientTraining> training_;
};

TEST_F(StalledStepTest, TheDeadlineErrorNamesTheStepAndTheMissingRank) {
  const absl::Status step = training_->RunStep(kSeed, 1, 0).status;
  EXPECT_EQ(step.code(), absl::StatusCode::kDeadlineExceeded) << step;
  EXPECT_THAT(step.message(), HasSubstr("step 1 did not complete within 2s "));
  EXPECT_THAT(step.message(),
              HasSubstr(absl::StrCat("servers ", servers_[0]->grpc_address(),
                                     ", ", servers_[1]->grpc_address(),
                                     " are waiting for worker rank 1 (of 2) "
                                     "to send their gradients (for up to ")))
      << step;
  EXPECT_THAT(step.message(),
              HasSubstr("Is every worker running, each with its own rank?"));
}

TEST_F(StalledStepTest, GetJobReportsThePendingStepAndTheMissingRank) {
  ASSERT_EQ(training_->RunStep(kSeed, 1, 0).status.code(),
            absl::StatusCode::kDeadlineExceeded);
  absl::StatusOr<std::vector<ServerJobStatus>> statuses =
      training_->job(0).Status(false);
  ASSERT_TRUE(statuses.ok()) << statuses.status();
  for (const ServerJobStatus& status : *statuses) {
    EXPECT_EQ(status.step, 0u) << status.server;
    EXPECT_EQ(status.pending_step, 1u) << status.server;
    EXPECT_THAT(status.missing_workers, ElementsAre(1)) << status.server;
    EXPECT_GT(status.waiting_seconds, 0.0) << status.server;
  }
}

TEST_F(StalledStepTest, EachServerLogsAndCountsTheStalledStep) {
  ASSERT_EQ(training_->RunStep(kSeed, 1, 0).status.code(),
            absl::StatusCode::kDeadlineExceeded);
  for (const std::unique_ptr<ServerProcess>& server : servers_) {
    // The count follows the log line, so once it shows, the line is there.
    absl::Status counted = WaitForMetricAtLeast(
        server->metrics_address(), "depot_step_stalls_total", 1, kWaitLimit);
    ASSERT_TRUE(counted.ok()) << counted;
    absl::StatusOr<std::string> metrics =
        ScrapeMetrics(server->metrics_address());
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    EXPECT_EQ(MetricValue(*metrics, "depot_step_stalls_total").value_or(-1), 1);
    EXPECT_EQ(MetricValue(*metrics, "depot_stalled_steps").value_or(-1), 1);
    EXPECT_EQ(MetricValue(*metrics, "depot_stalled_step_missing_workers")
                  .value_or(-1),
              1);
    EXPECT_GT(
        MetricValue(*metrics, "depot_stalled_step_wait_seconds").value_or(-1),
        0);
    EXPECT_THAT(server->Log(),
                HasSubstr("depot-server: job 1 \"stalled\": step 1 is stalled: "
                          "it has waited "));
    EXPECT_THAT(server->Log(),
                HasSubstr(" s for worker rank 1 (of 2) to send their "
                          "gradients"));
  }
}

TEST_F(StalledStepTest, TheStallEndsWhenTheMissingWorkerSteps) {
  ASSERT_EQ(training_->RunStep(kSeed, 1, 0).status.code(),
            absl::StatusCode::kDeadlineExceeded);
  // A retry while the server still holds the failed streams open would be a
  // duplicate contribution (ALREADY_EXISTS): wait until it has let them go.
  for (const std::unique_ptr<ServerProcess>& server : servers_) {
    absl::Status released = WaitForMetricAtMost(
        server->metrics_address(), "depot_active_streams", 0, kWaitLimit);
    ASSERT_TRUE(released.ok()) << released;
  }
  // Worker 0 retries while worker 1 finally comes: step 1 completes.
  std::vector<WorkerOutcome> outcomes = training_->RunSteps(kSeed, 1, 1);
  for (const WorkerOutcome& outcome : outcomes) {
    ASSERT_TRUE(outcome.status.ok()) << outcome.status;
  }
  for (const std::unique_ptr<ServerProcess>& server : servers_) {
    absl::Status cleared = WaitForMetricAtMost(
        server->metrics_address(), "depot_stalled_steps", 0, kWaitLimit);
    EXPECT_TRUE(cleared.ok()) << cleared;
  }
  absl::StatusOr<std::vector<ServerJobStatus>> statuses =
      training_->job(0).Status(false);
  ASSERT_TRUE(statuses.ok()) << statuses.status();
  for (const ServerJobStatus& status : *statuses) {
    EXPECT_EQ(status.step, 1u);
    EXPECT_EQ(status.pending_step, 0u);
  }
}

}  // namespace
}  // namespace depot::testing
