// The benchmark-only noop update (ShardState::Create's noop_update, the
// server's --bench_noop_update): chunks travel, state never changes.
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
using ::depot::testing::PlainSgdConfig;
using ::depot::testing::RecordingSink;

class NoopUpdateTest : public ::testing::Test {
 protected:
  std::shared_ptr<ShardState> MakeShard(const JobConfig& config) {
    return ShardState::Create(/*job_id=*/1, JobShape::Create(config, 0).value(),
                              &pool_, PayloadPool::Create(1 << 20), &metrics_,
                              /*noop_update=*/true)
        .value();
  }

  static Contribution Grad(uint64_t step, uint32_t worker,
                           const std::vector<float>& values,
                           std::shared_ptr<StepReplySink> sink) {
    Contribution c;
    c.step = step;
    c.worker_rank = worker;
    c.chunk_index = 0;
    c.payload = Fp32Payload(values);
    c.sink = std::move(sink);
    return c;
  }

  prometheus::Registry registry_;
  ServerMetrics metrics_{registry_};
  ThreadPool pool_{2};
};

TEST_F(NoopUpdateTest, EchoesWorkerZeroPayloadAndChangesNoState) {
  // One chunk of 8 fp32 elements; fp32 grads and weights, so the answer is
  // worker 0's payload itself.
  const JobConfig config =
      PlainSgdConfig({{"a", 8, 0}}, /*num_workers=*/2, /*chunk_elems=*/8,
                     /*alignment_elems=*/4);
  std::shared_ptr<ShardState> shard = MakeShard(config);
  ASSERT_TRUE(shard->InitChunk(0, DType::kFloat32,
                               Fp32Payload({1, 2, 3, 4, 5, 6, 7, 8}))
                  .ok());
  const uint64_t before = shard->Checksum();
  auto sink0 = std::make_shared<RecordingSink>();
  auto sink1 = std::make_shared<RecordingSink>();
  const std::vector<float> g0 = {9, 8, 7, 6, 5, 4, 3, 2};
  ASSERT_TRUE(shard->BeginStep(1, 0, {{0, 0.5, 0.0}}).ok());
  ASSERT_TRUE(shard->BeginStep(1, 1, {{0, 0.5, 0.0}}).ok());
  ASSERT_TRUE(shard->Contribute(Grad(1, 0, g0, sink0)).ok());
  ASSERT_TRUE(
      shard->Contribute(Grad(1, 1, std::vector<float>(8, 100), sink1)).ok());
  sink0->WaitFor(1);
  sink1->WaitFor(1);
  ASSERT_EQ(sink0->received().size(), 1u);
  EXPECT_EQ(*sink0->received()[0].payload, Fp32Payload(g0));
  EXPECT_EQ(*sink1->received()[0].payload, Fp32Payload(g0));
  // The step is applied (the next one is accepted), yet nothing changed.
  EXPECT_EQ(shard->completed_step(), 1u);
  EXPECT_EQ(shard->Checksum(), before);
}

}  // namespace
}  // namespace depot
