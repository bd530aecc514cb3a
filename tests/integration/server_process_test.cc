// The depot-server process itself: how it starts, reports its addresses,
// rejects a bad command line and stops.
#include "server_process.h"

#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics_scrape.h"

namespace depot::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// Runs depot-server with exactly `args` and waits for it to exit.
void RunToExit(const std::vector<std::string>& args, ProcessExit* exit,
               std::string* log) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Spawn(ServerProcess::DefaultBinary(), args);
  ASSERT_TRUE(server.ok()) << server.status();
  absl::StatusOr<ProcessExit> exited = (*server)->Wait(absl::Seconds(60));
  ASSERT_TRUE(exited.ok()) << exited.status();
  *exit = *exited;
  *log = (*server)->Log();
}

TEST(ServerProcessTest, ServesOnThePortFileAddressesAndPrintsThem) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT((*server)->grpc_address(), StartsWith("127.0.0.1:"));
  EXPECT_THAT((*server)->grpc_address(), Not(HasSubstr(":0")));
  EXPECT_THAT((*server)->metrics_address(), StartsWith("127.0.0.1:"));
  EXPECT_NE((*server)->grpc_address(), (*server)->metrics_address());
  EXPECT_THAT((*server)->Log(),
              HasSubstr(absl::StrCat("depot-server listening on ",
                                     (*server)->grpc_address())));
  absl::StatusOr<std::string> metrics =
      ScrapeMetrics((*server)->metrics_address());
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, HasSubstr("depot_jobs"));
}

TEST(ServerProcessTest, SigtermOnAnIdleServerExitsZero) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE((*server)->Signal(SIGTERM).ok());
  absl::StatusOr<ProcessExit> exit = (*server)->Wait(absl::Seconds(60));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(exit->exit_code, 0) << (*server)->Log();
}

TEST(ServerProcessTest, BadFlagValueExitsWithCodeTwoAndSaysWhy) {
  ProcessExit exit;
  std::string log;
  ASSERT_NO_FATAL_FAILURE(
      RunToExit({"--listen=no-port-here", "--metrics_listen="}, &exit, &log));
  EXPECT_EQ(exit.exit_code, 2);
  EXPECT_THAT(log, HasSubstr("--listen"));
}

TEST(ServerProcessTest, NegativeThreadCountExitsWithCodeTwo) {
  ProcessExit exit;
  std::string log;
  ASSERT_NO_FATAL_FAILURE(
      RunToExit({"--listen=127.0.0.1:0", "--metrics_listen=", "--threads=-1"},
                &exit, &log));
  EXPECT_EQ(exit.exit_code, 2);
  EXPECT_THAT(log, HasSubstr("--threads"));
}

// A second server on the first one's fixed port must stop at once with one
// line that says what to do, not a library's exception text or a log dump.
TEST(ServerProcessTest, MetricsPortInUseExitsWithCodeTwoAndOneLine) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> first = ServerProcess::Start();
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = (*first)->metrics_address();
  ProcessExit exit;
  std::string log;
  ASSERT_NO_FATAL_FAILURE(RunToExit(
      {"--listen=127.0.0.1:0", absl::StrCat("--metrics_listen=", taken)}, &exit,
      &log));
  EXPECT_EQ(exit.exit_code, 2) << log;
  EXPECT_EQ(log, absl::StrCat("depot-server: cannot serve metrics on ", taken,
                              ": address in use (another depot-server? pass "
                              "--metrics_listen=HOST:PORT, port 0 picks a "
                              "free one, or an empty value to disable "
                              "metrics)\n"));
}

TEST(ServerProcessTest, GrpcPortInUseExitsWithCodeTwoAndOneLine) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> first = ServerProcess::Start();
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = (*first)->grpc_address();
  ProcessExit exit;
  std::string log;
  ASSERT_NO_FATAL_FAILURE(RunToExit(
      {absl::StrCat("--listen=", taken), "--metrics_listen="}, &exit, &log));
  EXPECT_EQ(exit.exit_code, 2) << log;
  EXPECT_EQ(log, absl::StrCat("depot-server: cannot listen on ", taken,
                              ": address in use (another depot-server? pass "
                              "--listen=HOST:PORT; port 0 picks a free one, "
                              "which --port_file reports)\n"));
}

TEST(ServerProcessTest, NegativeStalledStepSecondsExitsWithCodeTwo) {
  ProcessExit exit;
  std::string log;
  ASSERT_NO_FATAL_FAILURE(
      RunToExit({"--listen=127.0.0.1:0",
                 "--metrics_listen=", "--stalled_step_seconds=-1"},
                &exit, &log));
  EXPECT_EQ(exit.exit_code, 2);
  EXPECT_THAT(log, HasSubstr("--stalled_step_seconds"));
}

}  // namespace
}  // namespace depot::testing
