// ThreeServers: the fixture base of tests that need a job sharded over three
// depot-server processes, each with its own update pool size (results must
// not depend on it).
#ifndef DEPOT_TESTS_INTEGRATION_THREE_SERVERS_H_
#define DEPOT_TESTS_INTEGRATION_THREE_SERVERS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server_process.h"

namespace depot::testing {

class ThreeServers : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int threads : {1, 2, 3}) {
      absl::StatusOr<std::unique_ptr<ServerProcess>> server =
          ServerProcess::Start({absl::StrCat("--threads=", threads)});
      ASSERT_TRUE(server.ok()) << server.status();
      servers_.push_back(*std::move(server));
    }
  }

  std::vector<std::string> Addresses() const {
    std::vector<std::string> addresses;
    for (const auto& server : servers_) {
      addresses.push_back(server->grpc_address());
    }
    return addresses;
  }

  std::vector<std::unique_ptr<ServerProcess>> servers_;
};

}  // namespace depot::testing

#endif  // DEPOT_TESTS_INTEGRATION_THREE_SERVERS_H_
