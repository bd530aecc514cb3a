// TwoServers: the fixture base of tests that need a job sharded over two
// depot-server processes. The servers run different update pool sizes on
// purpose: results must not depend on them.
#ifndef DEPOT_TESTS_INTEGRATION_TWO_SERVERS_H_
#define DEPOT_TESTS_INTEGRATION_TWO_SERVERS_H_

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server_process.h"

namespace depot::testing {

class TwoServers : public ::testing::Test {
 protected:
  // Flags added to each server's command line (besides its pool size).
  virtual std::vector<std::string> ServerAFlags() const { return {}; }
  virtual std::vector<std::string> ServerBFlags() const { return {}; }

  void SetUp() override {
    std::vector<std::string> a_flags = ServerAFlags();
    a_flags.push_back("--threads=1");
    absl::StatusOr<std::unique_ptr<ServerProcess>> a =
        ServerProcess::Start(a_flags);
    ASSERT_TRUE(a.ok()) << a.status();
    server_a_ = *std::move(a);
    std::vector<std::string> b_flags = ServerBFlags();
    b_flags.push_back("--threads=3");
    absl::StatusOr<std::unique_ptr<ServerProcess>> b =
        ServerProcess::Start(b_flags);
    ASSERT_TRUE(b.ok()) << b.status();
    server_b_ = *std::move(b);
  }

  std::vector<std::string> Addresses() const {
    return {server_a_->grpc_address(), server_b_->grpc_address()};
  }
  ServerProcess& server(int index) {
    return index == 0 ? *server_a_ : *server_b_;
  }

  std::unique_ptr<ServerProcess> server_a_;
  std::unique_ptr<ServerProcess> server_b_;
};

}  // namespace depot::testing

#endif  // DEPOT_TESTS_INTEGRATION_TWO_SERVERS_H_
