// Several TCP connections per server (ClientOptions::connections_per_server):
// a one-phase step splits each shard's chunks over one stream per connection,
// and the result is bit for bit the result over one connection.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bitwise_compare.h"
#include "client_training.h"
#include "gtest/gtest.h"
#include "metrics_scrape.h"
#include "training_data.h"
#include "two_servers.h"

namespace depot::testing {
namespace {

constexpr uint64_t kSeed = 77;
constexpr uint64_t kSteps = 3;

class MultiConnectionTest : public TwoServers {
 protected:
  // Trains job `name` (two workers, the small shape) with `connections` per
  // server for kSteps one-phase steps from the same data every time.
  std::unique_ptr<ClientTraining> Train(const std::string& name,
                                        int connections,
                                        std::vector<WorkerOutcome>* outcomes) {
    const JobConfig config = SmallJobConfig(name, 2, 2);
    absl::StatusOr<std::unique_ptr<ClientTraining>> training =
        ClientTraining::Open(Addresses(), config, absl::Minutes(2),
                             connections);
    EXPECT_TRUE(training.ok()) << training.status();
    if (!training.ok()) return nullptr;
    absl::Status init = (*training)->InitWeights(kSeed, DType::kFloat32);
    EXPECT_TRUE(init.ok()) << init;
    *outcomes = (*training)->RunSteps(kSeed, 1, kSteps);
    for (const WorkerOutcome& outcome : *outcomes) {
      EXPECT_TRUE(outcome.status.ok()) << outcome.status;
    }
    return *std::move(training);
  }
};

TEST_F(MultiConnectionTest,
       SeveralConnectionsGiveOneConnectionsResultBitForBit) {
  std::vector<WorkerOutcome> one_outcomes;
  std::unique_ptr<ClientTraining> one = Train("one", 1, &one_outcomes);
  ASSERT_NE(one, nullptr);
  ASSERT_FALSE(HasFailure());
  absl::StatusOr<std::vector<float>> one_master = one->PullMaster();
  ASSERT_TRUE(one_master.ok()) << one_master.status();
  absl::StatusOr<std::vector<uint64_t>> one_checksums = one->StateChecksums();
  ASSERT_TRUE(one_checksums.ok()) << one_checksums.status();
  // 3 splits each shard of about six chunks; 16 is more connections than a
  // shard has chunks.
  for (int connections : {3, 16}) {
    SCOPED_TRACE(absl::StrCat(connections, " connections"));
    std::vector<WorkerOutcome> outcomes;
    std::unique_ptr<ClientTraining> many =
        Train(absl::StrCat("many", connections), connections, &outcomes);
    ASSERT_NE(many, nullptr);
    ASSERT_FALSE(HasFailure());
    for (size_t rank = 0; rank < outcomes.size(); ++rank) {
      EXPECT_TRUE(BitwiseEqual(one_outcomes[rank].last_weights,
                               outcomes[rank].last_weights,
                               DTypeSize(many->job(0).config().weight_dtype)))
          << "weights returned to worker " << rank;
      // Every chunk was answered once, over whichever connection carried it.
      const StepResult& last = outcomes[rank].results.back();
      EXPECT_EQ(last.chunks, one_outcomes[rank].results.back().chunks);
      EXPECT_EQ(last.bytes_sent, one_outcomes[rank].results.back().bytes_sent);
    }
    absl::StatusOr<std::vector<float>> master = many->PullMaster();
    ASSERT_TRUE(master.ok()) << master.status();
    EXPECT_TRUE(BitwiseEqual(*one_master, *master));
    absl::StatusOr<std::vector<uint64_t>> checksums = many->StateChecksums();
    ASSERT_TRUE(checksums.ok()) << checksums.status();
    EXPECT_EQ(*checksums, *one_checksums);
  }
}

// The socket inodes of this process's open file descriptors.
std::set<std::string> OwnSocketInodes() {
  std::set<std::string> inodes;
  std::error_code error;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", error);
       !error && it != std::filesystem::directory_iterator();
       it.increment(error)) {
    std::error_code link_error;
    const std::string target =
        std::filesystem::read_symlink(it->path(), link_error).string();
    // "socket:[12345]"
    if (!link_error && absl::StartsWith(target, "socket:[")) {
      inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  return inodes;
}

// This process's TCP connections to `port`, counted from /proc/net/tcp{,6}:
// rows whose remote port is `port`, whose state is ESTABLISHED and whose
// socket this process holds (other processes' connections, e.g. other tests
// run side by side, are not counted).
int EstablishedConnectionsTo(int port) {
  const std::set<std::string> own = OwnSocketInodes();
  int count = 0;
  for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream table(path);
    std::string line;
    std::getline(table, line);  // the header
    while (std::getline(table, line)) {
      std::vector<std::string> fields =
          absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (fields.size() < 10) continue;
      const std::string& remote = fields[2];  // hex address:hex port
      uint32_t remote_port = 0;
      if (!absl::SimpleHexAtoi(remote.substr(remote.rfind(':') + 1),
                               &remote_port)) {
        continue;
      }
      if (static_cast<int>(remote_port) == port && fields[3] == "01" &&
          own.count(fields[9]) > 0) {
        ++count;
      }
    }
  }
  return count;
}

int PortOf(const std::string& address) {
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port));
  return port;
}

TEST_F(MultiConnectionTest, EachConnectionIsItsOwnTcpConnectionAndStream) {
  constexpr int kConnections = 3;
  const JobConfig config = SmallJobConfig("tcp", 1, 2);
  absl::StatusOr<std::unique_ptr<ClientTraining>> training =
      ClientTraining::Open(Addresses(), config, absl::Minutes(2), kConnections);
  ASSERT_TRUE(training.ok()) << training.status();
  // Every connection is opened when the client connects (and waited for by
  // WaitForServers), not at its first Step stream.
  std::vector<WorkerOutcome> outcomes = (*training)->RunSteps(kSeed, 1, 1);
  ASSERT_TRUE(outcomes[0].status.ok()) << outcomes[0].status;
  for (int s = 0; s < 2; ++s) {
    SCOPED_TRACE(absl::StrCat("server ", s));
    ASSERT_GE((*training)->job(0).plan().shard(s).num_chunks(),
              uint64_t{kConnections});
    EXPECT_EQ(EstablishedConnectionsTo(PortOf(server(s).grpc_address())),
              kConnections);
    absl::Status settled =
        WaitForMetricAtMost(server(s).metrics_address(), "depot_active_streams",
                            0, absl::Seconds(30));
    ASSERT_TRUE(settled.ok()) << settled;
    absl::StatusOr<std::string> text =
        ScrapeMetrics(server(s).metrics_address());
    ASSERT_TRUE(text.ok()) << text.status();
    absl::StatusOr<double> streams =
        MetricValue(*text, R"(depot_rpcs_total{rpc="step"})");
    ASSERT_TRUE(streams.ok()) << streams.status();
    EXPECT_EQ(*streams, kConnections);
  }
}

TEST_F(MultiConnectionTest, ConnectionsPerServerMustBeInRange) {
  for (int connections : {0, -1, 17}) {
    ClientOptions options;
    options.servers = Addresses();
    options.connections_per_server = connections;
    absl::StatusOr<std::unique_ptr<Client>> client =
        Client::Connect(std::move(options));
    ASSERT_FALSE(client.ok());
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(client.status().message().find("connections_per_server"),
              std::string::npos)
        << client.status();
  }
}

}  // namespace
}  // namespace depot::testing
