#include "server/server_options.h"

#include "gtest/gtest.h"

namespace depot {
namespace {

TEST(ParseHostPortTest, AcceptsHostAndPort) {
  absl::StatusOr<HostPort> parsed = ParseHostPort("127.0.0.1:50051");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->host, "127.0.0.1");
  EXPECT_EQ(parsed->port, 50051);
}

TEST(ParseHostPortTest, KeepsBracketsOfAnIpv6Host) {
  absl::StatusOr<HostPort> parsed = ParseHostPort("[::1]:0");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->host, "[::1]");
  EXPECT_EQ(parsed->port, 0);
}

TEST(ParseHostPortTest, RejectsMalformedAddresses) {
  for (const char* bad : {"", "localhost", ":80", "host:", "host:-1",
                          "host:65536", "host:8x", "::1:80", "[::1:80"}) {
    EXPECT_FALSE(ParseHostPort(bad).ok()) << bad;
  }
}

TEST(ResolveServerOptionsTest, FillsInMachineDefaults) {
  absl::StatusOr<ServerOptions> options = ResolveServerOptions({});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_GE(options->threads, 1);
  EXPECT_GT(options->memory_limit_bytes, 0u);
}

TEST(ResolveServerOptionsTest, KeepsExplicitValues) {
  ServerOptions given;
  given.threads = 3;
  given.memory_limit_bytes = 12345;
  absl::StatusOr<ServerOptions> options = ResolveServerOptions(given);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->threads, 3);
  EXPECT_EQ(options->memory_limit_bytes, 12345u);
}

TEST(ResolveServerOptionsTest, EmptyMetricsAddressDisablesMetrics) {
  ServerOptions given;
  given.metrics_listen = "";
  EXPECT_TRUE(ResolveServerOptions(given).ok());
}

TEST(ResolveServerOptionsTest, CheckpointDirAloneOnlyRestores) {
  ServerOptions given;
  given.checkpoint_dir = "/tmp/x";
  absl::StatusOr<ServerOptions> resolved = ResolveServerOptions(given);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->checkpoint_every_steps, 0u);
  EXPECT_EQ(resolved->checkpoint_keep, 3);
}

TEST(ResolveServerOptionsTest, RejectsBadValuesNamingTheFlag) {
  ServerOptions threads;
  threads.threads = -1;
  ServerOptions grace;
  grace.shutdown_grace = absl::Seconds(-1);
  ServerOptions listen;
  listen.listen = "nowhere";
  ServerOptions stalled;
  stalled.stalled_step_threshold = absl::Seconds(-1);
  ServerOptions stalled_forever;
  stalled_forever.stalled_step_threshold = absl::InfiniteDuration();
  ServerOptions checkpoints_nowhere;
  checkpoints_nowhere.checkpoint_every_steps = 10;
  ServerOptions keep_none;
  keep_none.checkpoint_dir = "/tmp/x";
  keep_none.checkpoint_keep = 0;
  for (const auto& [options, flag] :
       {std::pair{threads, "--threads"}, std::pair{grace, "--shutdown_grace"},
        std::pair{listen, "--listen"},
        std::pair{stalled, "--stalled_step_seconds"},
        std::pair{stalled_forever, "--stalled_step_seconds"},
        std::pair{checkpoints_nowhere, "--checkpoint_dir"},
        std::pair{keep_none, "--checkpoint_keep"}}) {
    absl::Status s = ResolveServerOptions(options).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << flag;
    EXPECT_NE(s.message().find(flag), absl::string_view::npos) << s;
  }
}

}  // namespace
}  // namespace depot
