// The client rides out network faults (issue 12, part 6): a job on two real
// servers, the second behind a FaultProxy that cuts, blackholes or stalls
// the connection in the middle of a step. Every run completes, and its
// weights are bit for bit those of the same steps without faults: a step's
// streams that fail with UNAVAILABLE are sent again within the step's
// deadline, and the servers apply nothing twice.
//
// Keepalive is made fast for these tests (DEPOT_TRANSPORT_ARGS, read by both
// the client and the servers it starts), so that a blackhole is found in
// about a second rather than the production 30 s.
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "depot/client.h"
#include "fault_proxy.h"
#include "gtest/gtest.h"
#include "server_process.h"
#include "training_data.h"

namespace depot::testing {
namespace {

constexpr int kSteps = 6;
constexpr uint64_t kFaultStep = 4;

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Before the servers start (they inherit it) and before Connect.
    setenv("DEPOT_TRANSPORT_ARGS",
           "grpc.keepalive_time_ms=300,grpc.keepalive_timeout_ms=1000", 1);
    for (int i = 0; i < 2; ++i) {
      absl::StatusOr<std::unique_ptr<ServerProcess>> server =
          ServerProcess::Start({"--threads=2"});
      ASSERT_TRUE(server.ok()) << server.status();
      servers_.push_back(*std::move(server));
    }
    absl::StatusOr<std::unique_ptr<FaultProxy>> proxy =
        FaultProxy::Start(servers_[1]->grpc_address());
    ASSERT_TRUE(proxy.ok()) << proxy.status();
    proxy_ = *std::move(proxy);
  }
  void TearDown() override { unsetenv("DEPOT_TRANSPORT_ARGS"); }

  // The weights after kSteps steps of job `name`, the second server reached
  // through `address_b`; `fault` runs on another thread while step
  // kFaultStep is in flight (null: none). `replayed` gets that step's
  // chunks_replayed.
  std::string Train(const std::string& name, const std::string& address_b,
                    const std::function<void()>& fault,
                    uint64_t* replayed = nullptr) {
    ClientOptions options;
    options.servers = {servers_[0]->grpc_address(), address_b};
    options.step_timeout = absl::Seconds(60);
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return "";
    EXPECT_TRUE((*client)->WaitForServers(absl::Seconds(30)).ok());
    JobConfig config = LargeJobConfig(name, DType::kBFloat16, DType::kBFloat16, 1);
    absl::StatusOr<std::unique_ptr<Job>> job = (*client)->OpenJob(config, 0);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return "";
    const Layout& layout = (*job)->layout();
    EXPECT_TRUE((*job)
                    ->InitWeights(MakeInitialWeights(layout, DType::kFloat32, 7)
                                      .data(),
                                  DType::kFloat32)
                    .ok());
    std::string weights(layout.total_elems() * 2, '\0');
    for (uint64_t step = 1; step <= kSteps; ++step) {
      const std::string grads =
          MakeGradients(layout, DType::kBFloat16, 11, step, 0);
      StepOptions step_options;
      step_options.group_hparams = StepHyperParams(step);
      std::thread faulting;
      if (step == kFaultStep && fault) faulting = std::thread(fault);
      StepResult result;
      const absl::Status stepped = (*job)->Step(
          step, grads.data(), weights.data(), &result, step_options);
      if (faulting.joinable()) faulting.join();
      EXPECT_TRUE(stepped.ok()) << "step " << step << ": " << stepped;
      if (!stepped.ok()) return "";
      if (step == kFaultStep && replayed != nullptr) {
        *replayed = result.chunks_replayed;
      }
    }
    return weights;
  }

  std::vector<std::unique_ptr<ServerProcess>> servers_;
  std::unique_ptr<FaultProxy> proxy_;
};

TEST_F(FaultTest, ACutMidStepIsRetriedAndTheRunIsBitwiseTheFaultFreeOne) {
  const std::string want =
      Train("clean", servers_[1]->grpc_address(), nullptr);
  ASSERT_FALSE(want.empty());
  int before_cut = 0;
  uint64_t replayed = 0;
  const std::string got = Train(
      "cut", proxy_->address(),
      [&] {
        // Slow the link so that the cut lands inside the step.
        proxy_->SetDelay(absl::Milliseconds(5));
        absl::SleepFor(absl::Milliseconds(60));
        before_cut = proxy_->connections_accepted();
        proxy_->Cut();
        proxy_->SetDelay(absl::ZeroDuration());
      },
      &replayed);
  EXPECT_EQ(got, want);
  // The step went on over a new connection.
  EXPECT_GT(proxy_->connections_accepted(), before_cut);
}

TEST_F(FaultTest, ABlackholeIsFoundByKeepaliveAndTheStepCompletes) {
  const std::string want =
      Train("clean", servers_[1]->grpc_address(), nullptr);
  ASSERT_FALSE(want.empty());
  const absl::Time start = absl::Now();
  const std::string got = Train("blackhole", proxy_->address(), [&] {
    proxy_->SetDelay(absl::Milliseconds(5));
    absl::SleepFor(absl::Milliseconds(60));
    proxy_->Blackhole();
    absl::SleepFor(absl::Seconds(3));
    proxy_->SetDelay(absl::ZeroDuration());
    proxy_->Heal();
  });
  EXPECT_EQ(got, want);
  // Done well before the 60 s deadline.
  EXPECT_LT(absl::Now() - start, absl::Seconds(45));
}

TEST_F(FaultTest, AStalledLinkSlowsTheStepButChangesNothing) {
  const std::string want =
      Train("clean", servers_[1]->grpc_address(), nullptr);
  ASSERT_FALSE(want.empty());
  const std::string got = Train("stall", proxy_->address(), [&] {
    proxy_->SetDelay(absl::Milliseconds(200));
    absl::SleepFor(absl::Seconds(1));
    proxy_->SetDelay(absl::ZeroDuration());
  });
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace depot::testing
