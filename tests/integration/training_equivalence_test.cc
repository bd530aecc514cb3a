// Two workers train a >1M-parameter job over two servers through the client
// library; the servers' master weights must equal, bit for bit, the same math
// done in-process over the whole flat space (ReferenceOptimizer).
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

constexpr uint64_t kSeed = 20240611;
constexpr uint64_t kSteps = 5;

class TrainingEquivalenceTest : public TwoServers {
 protected:
  // Trains with init weights, gradients and returned weights in the given
  // dtypes, then compares the pulled fp32 master weights and every worker's
  // last returned weights with the reference.
  void TrainAndCompare(DType init_dtype, DType grad_dtype, DType weight_dtype) {
    const JobConfig config =
        LargeJobConfig("equivalence", grad_dtype, weight_dtype, 2);
    absl::StatusOr<std::unique_ptr<ClientTraining>> training =
        ClientTraining::Open(Addresses(), config);
    ASSERT_TRUE(training.ok()) << training.status();
    ASSERT_GE((*training)->layout().param_elems(), 1000000u);
    absl::Status init = (*training)->InitWeights(kSeed, init_dtype);
    ASSERT_TRUE(init.ok()) << init;

    std::vector<WorkerOutcome> outcomes =
        (*training)->RunSteps(kSeed, 1, kSteps);
    for (size_t rank = 0; rank < outcomes.size(); ++rank) {
      ASSERT_TRUE(outcomes[rank].status.ok())
          << "worker " << rank << ": " << outcomes[rank].status;
    }

    const ReferenceOptimizer reference =
        TrainReference(config, init_dtype, kSeed, kSteps);
    absl::StatusOr<std::vector<float>> master = (*training)->PullMaster();
    ASSERT_TRUE(master.ok()) << master.status();
    EXPECT_TRUE(BitwiseEqual(reference.master(), *master));
    const std::string expected_weights = reference.WeightsAs(weight_dtype);
    for (size_t rank = 0; rank < outcomes.size(); ++rank) {
      EXPECT_TRUE(BitwiseEqual(expected_weights, outcomes[rank].last_weights,
                               DTypeSize(weight_dtype)))
          << "weights returned to worker " << rank << " by step " << kSteps;
    }
  }
};

TEST_F(TrainingEquivalenceTest,
       Fp32MasterWeightsEqualInProcessReferenceBitForBit) {
  TrainAndCompare(DType::kFloat32, DType::kFloat32, DType::kFloat32);
}

TEST_F(TrainingEquivalenceTest,
       Bf16GradsAndWeightsEqualInProcessReferenceBitForBit) {
  TrainAndCompare(DType::kBFloat16, DType::kBFloat16, DType::kBFloat16);
}

TEST_F(TrainingEquivalenceTest,
       Fp16GradsWithFp32WeightsEqualInProcessReference) {
  TrainAndCompare(DType::kFloat32, DType::kFloat16, DType::kFloat32);
}

}  // namespace
}  // namespace depot::testing
