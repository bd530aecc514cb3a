// What a restarted server exports for the restart alerts
// (deploy/prometheus/depot_rules.yml): a new process_start_time_seconds, the
// jobs it restored from its checkpoint directory, and none when it has no
// checkpoint directory (the jobs it held are lost: DepotJobsLostOnRestart).
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client_training.h"
#include "gtest/gtest.h"
#include "metrics_scrape.h"
#include "server_process.h"
#include "training_data.h"

namespace depot::testing {
namespace {

namespace fs = std::filesystem;

// The value of `series` on `server`'s metrics endpoint (-1 when absent).
double Metric(const ServerProcess& server, const std::string& series) {
  absl::StatusOr<std::string> body = ScrapeMetrics(server.metrics_address());
  EXPECT_TRUE(body.ok()) << body.status();
  if (!body.ok()) return -1;
  absl::StatusOr<double> value = MetricValue(*body, series);
  EXPECT_TRUE(value.ok()) << series << ": " << value.status();
  return value.ok() ? *value : -1;
}

// Starts a server with `flags`, opens job `name` (one worker) on it and
// trains steps 1..2.
std::unique_ptr<ServerProcess> StartAndTrain(
    const std::vector<std::string>& flags, const std::string& name) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(flags);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return nullptr;
  absl::StatusOr<std::unique_ptr<ClientTraining>> training =
      ClientTraining::Open({(*server)->grpc_address()},
                           SmallJobConfig(name, 1, 1));
  EXPECT_TRUE(training.ok()) << training.status();
  if (!training.ok()) return nullptr;
  EXPECT_TRUE((*training)->InitWeights(3, DType::kFloat32).ok());
  for (const WorkerOutcome& outcome : (*training)->RunSteps(3, 1, 2)) {
    EXPECT_TRUE(outcome.status.ok()) << outcome.status;
  }
  return *std::move(server);
}

class RestartMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") +
                          "/depot-restart-metrics-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string dir_;
};

TEST_F(RestartMetricsTest, RestartedServerShowsANewStartAndTheJobsItRestored) {
  const std::vector<std::string> flags = {
      absl::StrCat("--checkpoint_dir=", dir_), "--checkpoint_every_steps=2"};
  const double before = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  std::unique_ptr<ServerProcess> server = StartAndTrain(flags, "kept");
  ASSERT_NE(server, nullptr);
  const double started = Metric(*server, "process_start_time_seconds");
  EXPECT_GE(started, before - 1);
  EXPECT_LE(started, absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  EXPECT_EQ(Metric(*server, "depot_checkpoint_every_steps"), 2);
  EXPECT_EQ(Metric(*server, "depot_jobs_restored_total"), 0);
  ASSERT_TRUE(WaitForMetricAtLeast(server->metrics_address(),
                                   "depot_checkpoints_written_total", 1,
                                   absl::Seconds(30))
                  .ok());

  ASSERT_TRUE(server->Kill().ok());
  absl::StatusOr<std::unique_ptr<ServerProcess>> restarted =
      ServerProcess::Start(flags);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_GT(Metric(**restarted, "process_start_time_seconds"), started);
  EXPECT_EQ(Metric(**restarted, "depot_jobs"), 1);
  EXPECT_EQ(Metric(**restarted, "depot_jobs_restored_total"), 1);
  EXPECT_EQ(Metric(**restarted, "depot_job_restore_failures_total"), 0);
}

TEST_F(RestartMetricsTest, ServerWithoutCheckpointsRestartsWithNoJob) {
  std::unique_ptr<ServerProcess> server = StartAndTrain({}, "lost");
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Metric(*server, "depot_checkpoint_every_steps"), 0);
  EXPECT_EQ(Metric(*server, "depot_jobs"), 1);
  const double started = Metric(*server, "process_start_time_seconds");

  ASSERT_TRUE(server->Kill().ok());
  absl::StatusOr<std::unique_ptr<ServerProcess>> restarted =
      ServerProcess::Start();
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  // One job before, none restored: what DepotJobsLostOnRestart compares.
  EXPECT_GT(Metric(**restarted, "process_start_time_seconds"), started);
  EXPECT_EQ(Metric(**restarted, "depot_jobs"), 0);
  EXPECT_EQ(Metric(**restarted, "depot_jobs_restored_total"), 0);
}

}  // namespace
}  // namespace depot::testing
