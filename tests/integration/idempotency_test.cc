// A worker that resends a step the servers have already applied (e.g. after
// losing the answer) gets that step's weights again and applies nothing twice.
#include <string>
#include <vector>

#include "bitwise_compare.h"
#include "client_training.h"
#include "gtest/gtest.h"
#include "reference_optimizer.h"
#include "training_data.h"
#include "two_servers.h"

namespace depot::testing {
namespace {

constexpr uint64_t kSeed = 5;
constexpr uint64_t kSteps = 3;

class IdempotencyTest : public TwoServers {};

TEST_F(IdempotencyTest, ResentAppliedStepReturnsSameWeightsAndChangesNoState) {
  const JobConfig config = SmallJobConfig("resend", /*num_workers=*/2, 2);
  absl::StatusOr<std::unique_ptr<ClientTraining>> training =
      ClientTraining::Open(Addresses(), config);
  ASSERT_TRUE(training.ok()) << training.status();
  absl::Status init = (*training)->InitWeights(kSeed, DType::kFloat32);
  ASSERT_TRUE(init.ok()) << init;
  std::vector<WorkerOutcome> outcomes = (*training)->RunSteps(kSeed, 1, kSteps);
  for (const WorkerOutcome& outcome : outcomes) {
    ASSERT_TRUE(outcome.status.ok()) << outcome.status;
  }
  absl::StatusOr<std::vector<uint64_t>> before = (*training)->StateChecksums();
  ASSERT_TRUE(before.ok()) << before.status();

  // Worker 0 alone resends the last step: nothing waits for worker 1.
  WorkerOutcome resent = (*training)->RunStep(kSeed, kSteps, /*rank=*/0);
  ASSERT_TRUE(resent.status.ok()) << resent.status;

  EXPECT_TRUE(BitwiseEqual(outcomes[0].last_weights, resent.last_weights,
                           sizeof(float)));
  const uint64_t chunks = (*training)->job(0).plan().num_chunks();
  EXPECT_EQ(resent.results[0].chunks, chunks);
  EXPECT_EQ(resent.results[0].chunks_replayed, chunks);
  absl::StatusOr<std::vector<uint64_t>> after = (*training)->StateChecksums();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*after, *before);
  absl::StatusOr<std::vector<float>> master = (*training)->PullMaster();
  ASSERT_TRUE(master.ok()) << master.status();
  EXPECT_TRUE(BitwiseEqual(
      TrainReference(config, DType::kFloat32, kSeed, kSteps).master(),
      *master));
}

}  // namespace
}  // namespace depot::testing
