// After a run, the servers' Prometheus counters account for exactly the traffic
// and work of the run, and the exposition passes `promtool check metrics`.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client_training.h"
#include "gtest/gtest.h"
#include "metrics_scrape.h"
#include "training_data.h"
#include "two_servers.h"

namespace depot::testing {
namespace {

constexpr uint64_t kSeed = 3;
constexpr uint64_t kSteps = 3;
constexpr uint32_t kWorkers = 2;

class MetricsTest : public TwoServers {
 protected:
  // Trains a W=2 job with bf16 gradients and fp32 weights (so received and sent
  // bytes differ) for kSteps steps; rank 0 initialises in fp32.
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(TwoServers::SetUp());
    JobConfig config = SmallJobConfig("metrics", kWorkers, 2);
    config.grad_dtype = DType::kBFloat16;
    config.weight_dtype = DType::kFloat32;
    absl::StatusOr<std::unique_ptr<ClientTraining>> training =
        ClientTraining::Open(Addresses(), config);
    ASSERT_TRUE(training.ok()) << training.status();
    training_ = *std::move(training);
    absl::Status init = training_->InitWeights(kSeed, DType::kFloat32);
    ASSERT_TRUE(init.ok()) << init;
    for (const WorkerOutcome& outcome : training_->RunSteps(kSeed, 1, kSteps)) {
      ASSERT_TRUE(outcome.status.ok()) << outcome.status;
    }
  }

  // The value of `series` on server `s`; a failure if it is missing.
  double Metric(const std::string& exposition, const std::string& series) {
    absl::StatusOr<double> value = MetricValue(exposition, series);
    EXPECT_TRUE(value.ok()) << value.status();
    return value.value_or(-1);
  }

  std::unique_ptr<ClientTraining> training_;
};

TEST_F(MetricsTest, CountersMatchTheRunsTraffic) {
  for (uint32_t s = 0; s < 2; ++s) {
    SCOPED_TRACE(absl::StrCat("server ", s));
    // The last stream of the run may still be releasing when its client
    // returns.
    absl::Status settled =
        WaitForMetricAtMost(server(s).metrics_address(), "depot_active_streams",
                            0, absl::Seconds(30));
    ASSERT_TRUE(settled.ok()) << settled;
    absl::StatusOr<std::string> text =
        ScrapeMetrics(server(s).metrics_address());
    ASSERT_TRUE(text.ok()) << text.status();
    const ShardRange& shard = training_->job(0).plan().shard(s);
    const double elems = static_cast<double>(shard.size());
    EXPECT_EQ(Metric(*text, R"(depot_received_bytes_total{rpc="step"})"),
              kWorkers * elems * 2 * kSteps);
    EXPECT_EQ(Metric(*text, R"(depot_sent_bytes_total{rpc="step"})"),
              kWorkers * elems * 4 * kSteps);
    EXPECT_EQ(Metric(*text, R"(depot_received_bytes_total{rpc="init"})"),
              elems * 4);
    EXPECT_EQ(Metric(*text, "depot_steps_completed_total"), kSteps);
    EXPECT_EQ(Metric(*text, "depot_chunks_updated_total"),
              shard.num_chunks() * kSteps);
    // A one-phase step opens one stream per connection, at most one per
    // chunk.
    const uint64_t streams = std::min<uint64_t>(
        ClientOptions().connections_per_server, shard.num_chunks());
    EXPECT_EQ(Metric(*text, R"(depot_rpcs_total{rpc="step"})"),
              kWorkers * kSteps * streams);
    EXPECT_EQ(Metric(*text, "depot_jobs"), 1);
    EXPECT_EQ(Metric(*text, "depot_active_streams"), 0);
    // No RPC of the run failed: every depot_errors_total series is 0.
    for (absl::string_view line : absl::StrSplit(*text, '\n')) {
      if (!absl::StartsWith(line, "depot_errors_total")) continue;
      EXPECT_TRUE(absl::EndsWith(line, " 0")) << line;
    }
  }
}

TEST_F(MetricsTest, ExpositionAfterARunPassesPromtool) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    GTEST_SKIP()
        << "promtool is not installed (./scripts/setup.sh installs it)";
  }
  absl::StatusOr<std::string> text = ScrapeMetrics(server(0).metrics_address());
  ASSERT_TRUE(text.ok()) << text.status();
  const std::string path =
      absl::StrCat(::testing::TempDir(), "depot_metrics_", getpid(), ".txt");
  std::ofstream(path) << *text;
  const std::string command =
      absl::StrCat("promtool check metrics < '", path, "' 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) {
    output.append(buffer, n);
  }
  const int status = pclose(pipe);
  std::remove(path.c_str());
  EXPECT_EQ(status, 0) << output << "\n--- exposition ---\n" << *text;
}

}  // namespace
}  // namespace depot::testing
