// What ends a step that is waiting on the servers: a server killed or
// terminated, or the job deleted. The step must end with the right error, never
// hang, and SIGTERM must drain and exit 0.
//
// The waiting step: only worker 0 of a W=2 job steps, so the servers hold its
// contributions and wait for worker 1's, which never come. The tests wait on
// the servers' metrics to know that they hold all of them before they act.
#include <signal.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "client_training.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "metrics_scrape.h"
#include "raw_driver.h"
#include "training_data.h"
#include "two_servers.h"

namespace depot::testing {
namespace {

using ::grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

constexpr uint64_t kSeed = 11;
constexpr int kGraceSeconds = 3;
// The backstop: a step that ran into it would fail with DEADLINE_EXCEEDED,
// which the tests reject, so they need no clock of their own.
constexpr absl::Duration kStepTimeout = absl::Seconds(90);
// A gone server's streams are sent again this long (ClientOptions), then the
// step fails with UNAVAILABLE, long before kStepTimeout.
constexpr absl::Duration kUnavailableRetry = absl::Seconds(2);

class WaitingStepTest : public TwoServers {
 protected:
  std::vector<std::string> ServerAFlags() const override {
    return {absl::StrCat("--shutdown_grace_seconds=", kGraceSeconds)};
  }

  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(TwoServers::SetUp());
    absl::StatusOr<std::unique_ptr<ClientTraining>> training =
        ClientTraining::Open(Addresses(), SmallJobConfig("waiting", 2, 2),
                             kStepTimeout,
                             ClientOptions().connections_per_server,
                             kUnavailableRetry);
    ASSERT_TRUE(training.ok()) << training.status();
    training_ = *std::move(training);
    absl::Status init = training_->InitWeights(kSeed, DType::kFloat32);
    ASSERT_TRUE(init.ok()) << init;
  }

  void TearDown() override {
    // Killing the servers first ends a step that a failed assertion left
    // waiting.
    server_a_.reset();
    server_b_.reset();
    waiting_step_.reset();
  }

  // Starts worker 0's step 1 and returns once both servers hold all of its
  // gradients: every one of its Step streams (one per connection) has then
  // been accepted, so what the test does next meets open streams only, never
  // a stream whose header is still on its way.
  void StartWaitingStep() {
    waiting_step_ = std::make_unique<BackgroundStep>(*training_, kSeed, 1, 0);
    const Job& job = training_->job(0);
    for (int s = 0; s < 2; ++s) {
      const double shard_bytes = static_cast<double>(
          job.plan().shard(s).size() * DTypeSize(job.config().grad_dtype));
      absl::Status held = WaitForMetricAtLeast(
          server(s).metrics_address(),
          R"(depot_received_bytes_total{rpc="step"})", shard_bytes,
          absl::Seconds(60));
      ASSERT_TRUE(held.ok()) << held;
    }
  }

  absl::Status WaitingStepStatus() { return waiting_step_->Join().status; }

  std::unique_ptr<ClientTraining> training_;
  std::unique_ptr<BackgroundStep> waiting_step_;
};

TEST_F(WaitingStepTest, SigkillOfAServerFailsTheStepWithUnavailable) {
  ASSERT_NO_FATAL_FAILURE(StartWaitingStep());
  absl::StatusOr<ProcessExit> exit = server_a_->Kill();
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->signal, SIGKILL);

  const absl::Status step = WaitingStepStatus();
  EXPECT_NE(step.code(), absl::StatusCode::kDeadlineExceeded)
      << "the step only ended at its deadline: " << step;
  EXPECT_EQ(step.code(), absl::StatusCode::kUnavailable) << step;
  // ... after being sent again for kUnavailableRetry.
  EXPECT_THAT(step.message(), HasSubstr("unavailable_retry")) << step;
}

TEST_F(WaitingStepTest, SigtermFailsTheStepAndTheServerExitsZero) {
  ASSERT_NO_FATAL_FAILURE(StartWaitingStep());
  ASSERT_TRUE(server_a_->Signal(SIGTERM).ok());

  absl::StatusOr<ProcessExit> exit =
      server_a_->Wait(absl::Seconds(kGraceSeconds + 60));
  ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << server_a_->Log();
  EXPECT_EQ(exit->exit_code, 0) << "signal " << exit->signal << "\n"
                                << server_a_->Log();
  const absl::Status step = WaitingStepStatus();
  EXPECT_EQ(step.code(), absl::StatusCode::kUnavailable) << step;
  // ... after being sent again for kUnavailableRetry.
  EXPECT_THAT(step.message(), HasSubstr("unavailable_retry")) << step;
}

TEST_F(WaitingStepTest, SigtermReportsNotServingAndRejectsNewRpcs) {
  ASSERT_NO_FATAL_FAILURE(StartWaitingStep());
  auto health = grpc::health::v1::Health::NewStub(grpc::CreateChannel(
      server_a_->grpc_address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext watch_context;
  watch_context.set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("depot.v1.Depot");
  auto watch = health->Watch(&watch_context, request);
  HealthCheckResponse response;
  ASSERT_TRUE(watch->Read(&response));
  ASSERT_EQ(response.status(), HealthCheckResponse::SERVING);

  ASSERT_TRUE(server_a_->Signal(SIGTERM).ok());
  // The waiting step keeps the server in its grace period while we look.
  ASSERT_TRUE(watch->Read(&response)) << "health Watch ended without an update";
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  v1::JobStatus job;
  grpc::Status rejected =
      RawGetJob(*NewDepotStub(server_a_->grpc_address()), 1, false, &job);
  EXPECT_EQ(rejected.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(rejected.error_message(), HasSubstr("shutting down"));
  watch_context.TryCancel();
  watch->Finish().IgnoreError();

  EXPECT_FALSE(WaitingStepStatus().ok());
  absl::StatusOr<ProcessExit> exit =
      server_a_->Wait(absl::Seconds(kGraceSeconds + 60));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->exit_code, 0);
}

TEST_F(WaitingStepTest, DeleteJobAbortsTheStepAndFreesTheJobsState) {
  ASSERT_NO_FATAL_FAILURE(StartWaitingStep());
  absl::Status deleted = training_->job(1).Delete();
  ASSERT_TRUE(deleted.ok()) << deleted;

  const absl::Status step = WaitingStepStatus();
  EXPECT_EQ(step.code(), absl::StatusCode::kAborted) << step;
  EXPECT_EQ(training_->job(1).Status(false).status().code(),
            absl::StatusCode::kNotFound);
  for (int s = 0; s < 2; ++s) {
    absl::StatusOr<std::string> text =
        ScrapeMetrics(server(s).metrics_address());
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(MetricValue(*text, "depot_jobs").value_or(-1), 0);
    EXPECT_EQ(MetricValue(*text, "depot_state_bytes").value_or(-1), 0);
  }
}

}  // namespace
}  // namespace depot::testing
