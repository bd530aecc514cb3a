// A job's state moves between server counts (issue 12, part 3): a state
// saved from 3 servers at step 10 loads into jobs of 1, 2 and 4 servers (the
// fingerprint leaves the server count out; each chunk goes to the server
// that owns it in the new plan), which continue to step 20 bit for bit like
// the uninterrupted 3-server run. A job's servers must still agree on how
// many they are.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bitwise_compare.h"
#include "client_training.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server_process.h"
#include "training_data.h"

namespace depot::testing {
namespace {

constexpr uint64_t kSeed = 11;
constexpr uint64_t kSaveAt = 10;
constexpr uint64_t kSteps = 20;

class ServerCountTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 4; ++i) {
      absl::StatusOr<std::unique_ptr<ServerProcess>> server =
          ServerProcess::Start({absl::StrCat("--threads=", 1 + i % 2)});
      ASSERT_TRUE(server.ok()) << server.status();
      servers_.push_back(*std::move(server));
    }
  }

  // Job `name` of two workers on the first `count` servers, initialised.
  std::unique_ptr<ClientTraining> OpenJob(const std::string& name,
                                          uint32_t count) {
    std::vector<std::string> addresses;
    for (uint32_t s = 0; s < count; ++s) {
      addresses.push_back(servers_[s]->grpc_address());
    }
    absl::StatusOr<std::unique_ptr<ClientTraining>> training =
        ClientTraining::Open(addresses, SmallJobConfig(name, 2, count));
    EXPECT_TRUE(training.ok()) << training.status();
    if (!training.ok()) return nullptr;
    absl::Status init = (*training)->InitWeights(kSeed, DType::kFloat32);
    EXPECT_TRUE(init.ok()) << init;
    return *std::move(training);
  }

  static std::string Train(ClientTraining& training, uint64_t first,
                           uint64_t last) {
    absl::StatusOr<std::string> weights = training.Train(kSeed, first, last);
    EXPECT_TRUE(weights.ok()) << weights.status();
    return weights.ok() ? *std::move(weights) : std::string();
  }

  std::vector<std::unique_ptr<ServerProcess>> servers_;
};

TEST_F(ServerCountTest, AStateOfThreeServersResumesOnOneTwoAndFourBitwise) {
  std::unique_ptr<ClientTraining> whole = OpenJob("whole", 3);
  ASSERT_NE(whole, nullptr);
  const std::string whole_weights = Train(*whole, 1, kSteps);
  absl::StatusOr<std::vector<float>> whole_master = whole->PullMaster();
  ASSERT_TRUE(whole_master.ok()) << whole_master.status();

  std::unique_ptr<ClientTraining> first = OpenJob("first", 3);
  ASSERT_NE(first, nullptr);
  Train(*first, 1, kSaveAt);
  absl::StatusOr<std::string> blob = first->job(0).SaveState();
  ASSERT_TRUE(blob.ok()) << blob.status();

  for (uint32_t count : {1u, 2u, 4u}) {
    SCOPED_TRACE(absl::StrCat(count, " servers"));
    std::unique_ptr<ClientTraining> resumed =
        OpenJob(absl::StrCat("resumed-", count), count);
    ASSERT_NE(resumed, nullptr);
    absl::Status load = resumed->job(0).LoadState(*blob);
    ASSERT_TRUE(load.ok()) << load;
    const std::string weights = Train(*resumed, kSaveAt + 1, kSteps);
    absl::StatusOr<std::vector<float>> master = resumed->PullMaster();
    ASSERT_TRUE(master.ok()) << master.status();
    EXPECT_TRUE(BitwiseEqual(*whole_master, *master));
    EXPECT_TRUE(BitwiseEqual(whole_weights, weights, sizeof(float)));
    // And its state saved again loads back onto 3 servers.
    absl::StatusOr<std::string> again = resumed->job(0).SaveState();
    ASSERT_TRUE(again.ok()) << again.status();
    std::unique_ptr<ClientTraining> back =
        OpenJob(absl::StrCat("back-", count), 3);
    ASSERT_NE(back, nullptr);
    absl::Status reload = back->job(0).LoadState(*again);
    ASSERT_TRUE(reload.ok()) << reload;
    absl::StatusOr<std::vector<float>> back_master = back->PullMaster();
    ASSERT_TRUE(back_master.ok()) << back_master.status();
    EXPECT_TRUE(BitwiseEqual(*whole_master, *back_master));
  }
}

TEST_F(ServerCountTest, AJobsServersMustAgreeOnHowManyTheyAre) {
  std::unique_ptr<ClientTraining> two = OpenJob("count", 2);
  ASSERT_NE(two, nullptr);
  // The same name and config but three servers: the first two hold a job
  // "count" sharded over two.
  absl::StatusOr<std::unique_ptr<ClientTraining>> three = ClientTraining::Open(
      {servers_[0]->grpc_address(), servers_[1]->grpc_address(),
       servers_[2]->grpc_address()},
      SmallJobConfig("count", 2, 3));
  ASSERT_FALSE(three.ok());
  EXPECT_EQ(three.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(three.status().message(),
              ::testing::HasSubstr("sharded over 2 servers, the request says 3"));
}

}  // namespace
}  // namespace depot::testing
