// The optimizer state a job's shard holds: its size per parameter for each
// moment dtype (what the memory budget, depot_state_bytes and
// JobStatus.state_bytes count), and slots that start at their configured
// values.
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/job_shape.h"
#include "server/metrics.h"
#include "server/shard_state.h"
#include "server/tests/test_util.h"
#include "server/thread_pool.h"

namespace depot {
namespace {

using ::depot::testing::Fp32Payload;
using ::depot::testing::Fp32Values;
using ::depot::testing::RecordingSink;

// One tensor of 1000 elements, aligned to 64, in chunks of 256: one server's
// shard of 1024 elements, the last 24 padding (which hold state too).
JobConfig AdamWJob(DType exp_avg_dtype, DType exp_avg_sq_dtype) {
  JobConfig config;
  config.name = "moments";
  config.tensors = {{"w", 1000, 0}};
  config.chunk_elems = 256;
  config.alignment_elems = 64;
  config.optimizer.kind = OptimizerKind::kAdamW;
  config.optimizer.exp_avg_dtype = exp_avg_dtype;
  config.optimizer.exp_avg_sq_dtype = exp_avg_sq_dtype;
  return config;
}

TEST(JobShapeStateBytesTest, AdamWWithFp32MomentsKeepsTwelveBytesPerElement) {
  const JobShape shape =
      JobShape::Create(AdamWJob(DType::kFloat32, DType::kFloat32), 0).value();
  ASSERT_EQ(shape.shard().size(), 1024u);
  EXPECT_EQ(shape.state_bytes(), 12u * 1024u);
}

TEST(JobShapeStateBytesTest, AdamWWithBf16MomentsKeepsEightBytesPerElement) {
  const JobShape shape =
      JobShape::Create(AdamWJob(DType::kBFloat16, DType::kBFloat16), 0).value();
  EXPECT_EQ(shape.state_bytes(), 8u * 1024u);
}

TEST(JobShapeStateBytesTest, OneBf16MomentKeepsTenBytesPerElement) {
  const JobShape shape =
      JobShape::Create(AdamWJob(DType::kBFloat16, DType::kFloat32), 0).value();
  EXPECT_EQ(shape.state_bytes(), 10u * 1024u);
}

class OptimizerStateTest : public ::testing::Test {
 protected:
  std::shared_ptr<ShardState> MakeShard(const JobConfig& config) {
    return ShardState::Create(/*job_id=*/1, JobShape::Create(config, 0).value(),
                              &pool_, PayloadPool::Create(1 << 20), &metrics_)
        .value();
  }

  prometheus::Registry registry_;
  ServerMetrics metrics_{registry_};
  ThreadPool pool_{1};
};

// Adagrad with lr 1 and an initial accumulator of 3: a gradient of 1 makes the
// sum 4 and moves each weight by 1 / sqrt(4) = 0.5, exactly; an accumulator
// left at 0 (or overwritten by InitChunk) would move it by 1.
TEST_F(OptimizerStateTest, AdagradSumStartsAtTheInitialAccumulatorValue) {
  JobConfig config;
  config.name = "adagrad";
  config.tensors = {{"w", 8, 0}};
  config.chunk_elems = 8;
  config.alignment_elems = 8;
  config.optimizer.kind = OptimizerKind::kAdagrad;
  config.optimizer.lr = 1.0;
  config.optimizer.weight_decay = 0.0;
  config.optimizer.adagrad_initial_accumulator_value = 3.0;
  config.optimizer.adagrad_eps = 1e-30;
  auto shard = MakeShard(config);
  ASSERT_TRUE(
      shard
          ->InitChunk(0, DType::kFloat32, Fp32Payload({1, 2, 3, 4, 5, 6, 7, 8}))
          .ok());
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(shard->BeginStep(1, 0, {}).ok());
  Contribution grad;
  grad.step = 1;
  grad.payload = Fp32Payload(std::vector<float>(8, 1.0f));
  grad.sink = sink;
  ASSERT_TRUE(shard->Contribute(std::move(grad)).ok());
  const std::vector<ChunkWeights> got = sink->WaitFor(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(Fp32Values(*got[0].payload),
            (std::vector<float>{0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5}));
}

// The checksum hashes each slot as stored, so a bf16-moment job's checksum
// differs from the fp32 one's though their weights start equal.
TEST_F(OptimizerStateTest, ChecksumCoversTheSlotsInTheirDType) {
  JobConfig fp32 = AdamWJob(DType::kFloat32, DType::kFloat32);
  JobConfig bf16 = AdamWJob(DType::kBFloat16, DType::kBFloat16);
  // Zero moments hash as zero bytes either way; only their count differs.
  EXPECT_NE(MakeShard(fp32)->Checksum(), MakeShard(bf16)->Checksum());
  EXPECT_EQ(MakeShard(bf16)->Checksum(), MakeShard(bf16)->Checksum());
}

}  // namespace
}  // namespace depot
