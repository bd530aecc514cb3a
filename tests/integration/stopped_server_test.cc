// A Step sends slices that reference the caller's gradient buffer and returns
// only once gRPC has released them all. A server that stops reading (here:
// SIGSTOP) must not keep the Step from returning: the client's connections
// carry a TCP user timeout (wire/channel_args.h), so the Step ends with its
// deadline's error while the server is still stopped. Slow by nature: the
// timeout is 20 s.
#include <signal.h>

#include <memory>
#include <vector>

#include "depot/client.h"
#include "gtest/gtest.h"
#include "server_process.h"

namespace depot::testing {
namespace {

TEST(StoppedServerTest, StepReturnsWhileTheServerIsStillStopped) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions options;
  options.servers = {(*server)->grpc_address()};
  options.step_timeout = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->WaitForServers(absl::Seconds(30)).ok());
  // More gradient bytes in flight (window x chunk x connections = 64 MiB)
  // than the sockets' buffers hold, so that gRPC is left holding some.
  JobConfig config;
  config.name = "stopped";
  config.tensors = {{"w", uint64_t{16} << 20, 0}};
  config.chunk_elems = uint64_t{2} << 20;
  absl::StatusOr<std::unique_ptr<Job>> job = (*client)->OpenJob(config, 0);
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<float> grads((*job)->total_elems(), 0.25f);
  std::vector<float> weights(grads.size());

  ASSERT_TRUE((*server)->Signal(SIGSTOP).ok());
  const absl::Status step =
      (*job)->Step(1, grads.data(), weights.data(), nullptr);
  // Still stopped here: nothing but the client's own timeouts ended the Step.
  ASSERT_TRUE((*server)->Signal(SIGCONT).ok());
  EXPECT_EQ(step.code(), absl::StatusCode::kDeadlineExceeded) << step;
}

}  // namespace
}  // namespace depot::testing
