// bf16 moments (Megatron's exp_avg_dtype / exp_avg_sq_dtype) through real
// servers: the state takes the memory it should, the servers' bf16 state
// equals the in-process kernel's bit for bit, and an AdamW run with bf16
// moments stays within a stated distance of the same run with fp32 moments.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "bitwise_compare.h"
#include "client_training.h"
#include "gtest/gtest.h"
#include "metrics_scrape.h"
#include "reference_optimizer.h"
#include "training_data.h"
#include "two_servers.h"

namespace depot::testing {
namespace {

constexpr uint64_t kSeed = 77;

JobConfig AdamWJob(std::string name, DType moment_dtype) {
  JobConfig config = SmallJobConfig(std::move(name), /*num_workers=*/2,
                                    /*num_servers=*/2);
  config.optimizer.exp_avg_dtype = moment_dtype;
  config.optimizer.exp_avg_sq_dtype = moment_dtype;
  return config;
}

class MomentPrecisionTest : public TwoServers {
 protected:
  // Opens `config` on both servers, initialises it and trains steps 1..steps
  // with both workers.
  std::unique_ptr<ClientTraining> Train(const JobConfig& config,
                                        uint64_t steps) {
    absl::StatusOr<std::unique_ptr<ClientTraining>> training =
        ClientTraining::Open(Addresses(), config);
    EXPECT_TRUE(training.ok()) << training.status();
    if (!training.ok()) return nullptr;
    absl::Status init = (*training)->InitWeights(kSeed, DType::kFloat32);
    EXPECT_TRUE(init.ok()) << init;
    for (const WorkerOutcome& outcome :
         (*training)->RunSteps(kSeed, 1, steps)) {
      EXPECT_TRUE(outcome.status.ok()) << outcome.status;
    }
    return *std::move(training);
  }
};

// Every server reports shard elements * bytes per element (padding included),
// and its depot_state_bytes gauge is the sum over the jobs it holds, with the
// fp32 weights each job keeps of two steps (8 bytes per element) and the
// jobs' bookkeeping.
TEST_F(MomentPrecisionTest, StateBytesAreTwelvePerParamForFp32AndEightForBf16) {
  absl::StatusOr<std::unique_ptr<ClientTraining>> fp32 = ClientTraining::Open(
      Addresses(), AdamWJob("fp32-moments", DType::kFloat32));
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  absl::StatusOr<std::unique_ptr<ClientTraining>> bf16 = ClientTraining::Open(
      Addresses(), AdamWJob("bf16-moments", DType::kBFloat16));
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  absl::StatusOr<std::vector<ServerJobStatus>> fp32_status =
      (*fp32)->job(0).Status(false);
  ASSERT_TRUE(fp32_status.ok()) << fp32_status.status();
  absl::StatusOr<std::vector<ServerJobStatus>> bf16_status =
      (*bf16)->job(0).Status(false);
  ASSERT_TRUE(bf16_status.ok()) << bf16_status.status();
  ASSERT_EQ(fp32_status->size(), 2u);
  ASSERT_EQ(bf16_status->size(), 2u);
  for (int s = 0; s < 2; ++s) {
    const ServerJobStatus& a = (*fp32_status)[s];
    const ServerJobStatus& b = (*bf16_status)[s];
    ASSERT_GT(a.shard_end, a.shard_begin);
    EXPECT_EQ(a.state_bytes, 12 * (a.shard_end - a.shard_begin)) << s;
    EXPECT_EQ(b.state_bytes, 8 * (b.shard_end - b.shard_begin)) << s;
    absl::StatusOr<std::string> metrics =
        ScrapeMetrics(server(s).metrics_address());
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    const uint64_t kept =
        8 * (a.shard_end - a.shard_begin) + 8 * (b.shard_end - b.shard_begin);
    // Besides, each job's bookkeeping (ShardState::BookkeepingBytes: its
    // config, plan and per-chunk records), a few KiB for these small jobs.
    const double counted =
        MetricValue(*metrics, "depot_state_bytes").value_or(-1);
    const double data = static_cast<double>(a.state_bytes + b.state_bytes + kept);
    EXPECT_GT(counted, data) << s;
    EXPECT_LT(counted, data + 2 * 64 * 1024) << s;
  }
}

// The servers store bf16 moments exactly as the kernel does in-process over
// the whole flat space (ReferenceOptimizer), so their master weights agree bit
// for bit: nothing of the chunking, threads or slot layout shows.
TEST_F(MomentPrecisionTest, Bf16MomentsEqualInProcessReferenceBitForBit) {
  constexpr uint64_t kSteps = 8;
  const JobConfig config = AdamWJob("bf16-equivalence", DType::kBFloat16);
  std::unique_ptr<ClientTraining> training = Train(config, kSteps);
  ASSERT_NE(training, nullptr);
  absl::StatusOr<std::vector<float>> master = training->PullMaster();
  ASSERT_TRUE(master.ok()) << master.status();
  EXPECT_TRUE(BitwiseEqual(
      TrainReference(config, DType::kFloat32, kSeed, kSteps).master(),
      *master));
}

// The bound. Storing a moment in bf16 rounds it with a relative error of at
// most 2^-9 each step; the error of exp_avg decays with beta1 and that of
// exp_avg_sq with beta2, so, over T = 50 steps, exp_avg carries at most about
// 2^-9 / (1 - beta1) = 2% and exp_avg_sq at most 2^-9 * T = 10% (5% in its
// square root) in the worst case, where every rounding goes the same way.
// Each step's move lr * m_hat / (sqrt(v_hat) + eps) then differs by at most
// about 7% of itself, so after T steps a weight lies within 7% of the path it
// travelled, sum_t |p_t - p_(t-1)|, from the fp32-moment weight. Roundings
// go both ways, so the typical distance is far below that: this run sees at
// most 0.33% of a weight's path, and an L2 distance of 0.11% of the whole
// model's displacement. We assert the first-order worst case for every
// weight, 7% of its path, plus 2^-20 absolute for the fp32 rounding of weights
// that barely move, and 5% for the model's distance relative to its
// displacement. A broken bf16 path (a wrong byte offset, moments never stored
// back or zeroed) moves weights by whole steps; subtler errors (rounding mode)
// are the bitwise tests' to catch.
TEST_F(MomentPrecisionTest, Bf16MomentTrajectoryStaysNearTheFp32One) {
  constexpr uint64_t kSteps = 50;
  const JobConfig bf16_config = AdamWJob("bf16-trajectory", DType::kBFloat16);
  std::unique_ptr<ClientTraining> training = Train(bf16_config, kSteps);
  ASSERT_NE(training, nullptr);
  absl::StatusOr<std::vector<float>> bf16_master = training->PullMaster();
  ASSERT_TRUE(bf16_master.ok()) << bf16_master.status();

  // The fp32-moment run, in-process (training_equivalence_test holds the
  // servers to it bit for bit), with each weight's path length.
  const JobConfig fp32_config = AdamWJob("fp32-trajectory", DType::kFloat32);
  const Layout layout =
      *Layout::Create(fp32_config.tensors, fp32_config.alignment_elems);
  ReferenceOptimizer fp32(fp32_config);
  const std::string init = MakeInitialWeights(layout, DType::kFloat32, kSeed);
  fp32.InitWeights(init.data(), DType::kFloat32);
  const std::vector<float> initial = fp32.master();
  std::vector<double> path(initial.size(), 0.0);
  for (uint64_t step = 1; step <= kSteps; ++step) {
    const std::vector<float> before = fp32.master();
    std::vector<std::string> grads;
    std::vector<const void*> pointers;
    for (uint32_t rank = 0; rank < fp32_config.num_workers; ++rank) {
      grads.push_back(
          MakeGradients(layout, DType::kFloat32, kSeed, step, rank));
      pointers.push_back(grads.back().data());
    }
    fp32.Step(step, pointers, StepHyperParams(step));
    for (size_t i = 0; i < path.size(); ++i) {
      path[i] += std::fabs(static_cast<double>(fp32.master()[i]) - before[i]);
    }
  }

  ASSERT_EQ(bf16_master->size(), fp32.master().size());
  double distance_squared = 0;
  double displacement_squared = 0;
  double worst_path_fraction = 0;
  int reports = 0;
  for (size_t i = 0; i < path.size(); ++i) {
    const double diff =
        std::fabs(static_cast<double>((*bf16_master)[i]) - fp32.master()[i]);
    const double moved = static_cast<double>(fp32.master()[i]) - initial[i];
    distance_squared += diff * diff;
    displacement_squared += moved * moved;
    if (path[i] > 0) {
      worst_path_fraction = std::max(worst_path_fraction, diff / path[i]);
    }
    if (diff > 0.07 * path[i] + std::ldexp(1.0, -20) && ++reports <= 5) {
      ADD_FAILURE() << "weight " << i << ": bf16 moments " << (*bf16_master)[i]
                    << ", fp32 moments " << fp32.master()[i] << ", path "
                    << path[i];
    }
  }
  const double relative_distance =
      std::sqrt(distance_squared / displacement_squared);
  EXPECT_LT(relative_distance, 0.05);
  RecordProperty("relative_distance", std::to_string(relative_distance));
  RecordProperty("worst_path_fraction", std::to_string(worst_path_fraction));
  // Not identical either: the bf16 moments must actually be in use.
  EXPECT_GT(relative_distance, 0.0);
}

}  // namespace
}  // namespace depot::testing
