#include "server/server_options.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
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

// A fake /proc/self/cgroup and cgroup mount under a temporary directory.
class FakeCgroup : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/depot-cgroup-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  void Write(const std::string& relative, const std::string& contents) {
    const std::filesystem::path path = root_ + "/" + relative;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << contents;
  }
  std::string proc() const { return root_ + "/proc-self-cgroup"; }
  std::string mount() const { return root_ + "/sys-fs-cgroup"; }

  std::string root_;
};

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST_F(FakeCgroup, ReadsCgroupV2MemoryMaxOfTheProcesssOwnCgroup) {
  Write("proc-self-cgroup", "0::/user.slice/depot.scope\n");
  Write("sys-fs-cgroup/user.slice/depot.scope/memory.max", "1073741824\n");
  Write("sys-fs-cgroup/memory.max", "max\n");
  std::string path;
  EXPECT_EQ(CgroupMemoryLimit(proc(), mount(), &path), kGiB);
  EXPECT_EQ(path, mount() + "/user.slice/depot.scope/memory.max");
}

TEST_F(FakeCgroup, CgroupV2MaxIsNoLimit) {
  Write("proc-self-cgroup", "0::/\n");
  Write("sys-fs-cgroup/memory.max", "max\n");
  EXPECT_EQ(CgroupMemoryLimit(proc(), mount()), std::nullopt);
}

TEST_F(FakeCgroup, ReadsCgroupV1LimitInBytesOfTheMemoryHierarchy) {
  Write("proc-self-cgroup",
        "5:cpu,cpuacct:/a\n4:memory:/process_api/abc\n0::/\n");
  Write("sys-fs-cgroup/memory/process_api/abc/memory.limit_in_bytes",
        "2147483648\n");
  EXPECT_EQ(CgroupMemoryLimit(proc(), mount()), 2 * kGiB);
}

TEST_F(FakeCgroup, CgroupV1UnlimitedIsNoLimit) {
  Write("proc-self-cgroup", "4:memory:/\n");
  Write("sys-fs-cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_EQ(CgroupMemoryLimit(proc(), mount()), std::nullopt);
}

// In a cgroup namespace the process's cgroup is the mount's root.
TEST_F(FakeCgroup, FallsBackToTheMountsRootInACgroupNamespace) {
  Write("proc-self-cgroup", "0::/not/visible/here\n");
  Write("sys-fs-cgroup/memory.max", "536870912\n");
  EXPECT_EQ(CgroupMemoryLimit(proc(), mount()), 512 * kMiB);
}

TEST_F(FakeCgroup, DefaultBudgetIsTheCgroupLimitLessAMarginWhenBelowRam) {
  Write("proc-self-cgroup", "0::/job\n");
  Write("sys-fs-cgroup/job/memory.max", "1073741824\n");
  // 64 GiB of RAM, a 1 GiB cgroup: 1 GiB - max(128 MiB, 1/8 GiB).
  absl::StatusOr<MemoryLimitDefault> limit =
      DefaultMemoryLimit(64 * kGiB, proc(), mount());
  ASSERT_TRUE(limit.ok()) << limit.status();
  EXPECT_EQ(limit->bytes, kGiB - 128 * kMiB);
  EXPECT_NE(limit->source.find("the cgroup's memory limit of 1073741824"),
            std::string::npos)
      << limit->source;
  // A 64 GiB cgroup: 1/8 of it is the margin, 56 GiB, above 80% of 32 GiB.
  Write("sys-fs-cgroup/job/memory.max", absl::StrCat(64 * kGiB));
  limit = DefaultMemoryLimit(32 * kGiB, proc(), mount());
  ASSERT_TRUE(limit.ok()) << limit.status();
  EXPECT_EQ(limit->bytes, static_cast<uint64_t>(32 * kGiB * 0.8));
  EXPECT_NE(limit->source.find("80% of physical RAM"), std::string::npos);
  limit = DefaultMemoryLimit(128 * kGiB, proc(), mount());
  ASSERT_TRUE(limit.ok()) << limit.status();
  EXPECT_EQ(limit->bytes, 56 * kGiB);
}

TEST_F(FakeCgroup, DefaultBudgetWithoutACgroupLimitIs80PercentOfRam) {
  Write("proc-self-cgroup", "0::/\n");
  Write("sys-fs-cgroup/memory.max", "max\n");
  absl::StatusOr<MemoryLimitDefault> limit =
      DefaultMemoryLimit(10 * kGiB, proc(), mount());
  ASSERT_TRUE(limit.ok()) << limit.status();
  EXPECT_EQ(limit->bytes, 8 * kGiB);
  // No /proc/self/cgroup at all: the same.
  limit = DefaultMemoryLimit(10 * kGiB, root_ + "/none", mount());
  ASSERT_TRUE(limit.ok()) << limit.status();
  EXPECT_EQ(limit->bytes, 8 * kGiB);
}

TEST_F(FakeCgroup, CgroupLimitBelowTheMarginIsInvalidArgument) {
  Write("proc-self-cgroup", "0::/\n");
  Write("sys-fs-cgroup/memory.max", absl::StrCat(100 * kMiB));
  EXPECT_EQ(DefaultMemoryLimit(64 * kGiB, proc(), mount()).status().code(),
            absl::StatusCode::kInvalidArgument);
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
  ServerOptions no_handler_threads;
  no_handler_threads.max_handler_threads = 0;
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
  ServerOptions admin_without_auth;
  admin_without_auth.admin_tenants = {"ops"};
  ServerOptions bad_admin;
  bad_admin.tls_cert = "c.pem";
  bad_admin.tls_key = "k.pem";
  bad_admin.auth_token_file = "tokens";
  bad_admin.admin_tenants = {"ops team"};
  for (const auto& [options, flag] :
       {std::pair{admin_without_auth, "--admin_tenants"},
        std::pair{bad_admin, "--admin_tenants"},
        std::pair{threads, "--threads"},
        std::pair{no_handler_threads, "--max_handler_threads"},
        std::pair{grace, "--shutdown_grace"}, std::pair{listen, "--listen"},
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
