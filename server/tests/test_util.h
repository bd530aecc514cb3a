// Helpers shared by the server's unit tests: small job configs, fp32 payloads,
// a StepReplySink that records what it receives, and a way to wait for the
// update pool.
#ifndef DEPOT_SERVER_TESTS_TEST_UTIL_H_
#define DEPOT_SERVER_TESTS_TEST_UTIL_H_

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "depot/job_config.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/job_shape.h"
#include "server/metrics.h"
#include "server/payload_pool.h"
#include "server/shard_state.h"
#include "server/step_reply_sink.h"
#include "server/thread_pool.h"

namespace depot::testing {

// Long enough for any update in a test; reaching it means a bug, not a slow
// run.
inline constexpr absl::Duration kWaitLimit = absl::Seconds(30);

// SGD without momentum or weight decay, lr 0.5: the update is w - 0.5 * g,
// exact in fp32 for the values the tests use, so expected weights are easy to
// state.
inline JobConfig PlainSgdConfig(std::vector<TensorSpec> tensors,
                                uint32_t num_workers, uint64_t chunk_elems,
                                uint64_t alignment_elems) {
  JobConfig config;
  config.name = "test-job";
  config.tensors = std::move(tensors);
  config.num_workers = num_workers;
  config.optimizer.kind = OptimizerKind::kSgd;
  config.optimizer.lr = 0.5;
  config.optimizer.weight_decay = 0.0;
  config.optimizer.sgd_momentum = 0.0;
  config.chunk_elems = chunk_elems;
  config.alignment_elems = alignment_elems;
  return config;
}

inline std::string Fp32Payload(const std::vector<float>& values) {
  std::string payload(values.size() * sizeof(float), '\0');
  std::memcpy(payload.data(), values.data(), payload.size());
  return payload;
}

inline std::vector<float> Fp32Values(const std::string& payload) {
  std::vector<float> values(payload.size() / sizeof(float));
  std::memcpy(values.data(), payload.data(), values.size() * sizeof(float));
  return values;
}

// Records deliveries; its openness is set by the test.
class RecordingSink : public StepReplySink {
 public:
  void Deliver(ChunkWeights weights) override {
    absl::MutexLock lock(&mu_);
    received_.push_back(std::move(weights));
  }
  void DeliverAck(uint64_t chunk_index) override {
    absl::MutexLock lock(&mu_);
    acks_.push_back(chunk_index);
  }
  void DeliverGradStats(const GradStats& stats) override {
    absl::MutexLock lock(&mu_);
    grad_stats_.push_back(stats);
  }
  bool IsOpen() const override {
    absl::MutexLock lock(&mu_);
    return open_;
  }
  void set_open(bool open) {
    absl::MutexLock lock(&mu_);
    open_ = open;
  }

  // What has arrived so far, in arrival order.
  std::vector<ChunkWeights> received() const {
    absl::MutexLock lock(&mu_);
    return received_;
  }

  // The acks and GradStats received so far, in arrival order.
  std::vector<uint64_t> acks() const {
    absl::MutexLock lock(&mu_);
    return acks_;
  }
  std::vector<GradStats> grad_stats() const {
    absl::MutexLock lock(&mu_);
    return grad_stats_;
  }

  // Waits until the shard's GradStats have arrived (fails the test after
  // kWaitLimit) and returns the first.
  GradStats WaitForGradStats() const {
    absl::MutexLock lock(&mu_);
    auto arrived = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !grad_stats_.empty();
    };
    const bool ok = mu_.AwaitWithTimeout(absl::Condition(&arrived), kWaitLimit);
    EXPECT_TRUE(ok) << "no GradStats arrived";
    return ok ? grad_stats_.front() : GradStats();
  }

  // Waits until `count` deliveries have arrived (fails the test after
  // kWaitLimit) and returns them.
  std::vector<ChunkWeights> WaitFor(size_t count) const {
    absl::MutexLock lock(&mu_);
    auto arrived = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return received_.size() >= count;
    };
    const bool ok = mu_.AwaitWithTimeout(absl::Condition(&arrived), kWaitLimit);
    EXPECT_TRUE(ok) << "only " << received_.size() << " of " << count
                    << " deliveries arrived";
    return received_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<ChunkWeights> received_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> acks_ ABSL_GUARDED_BY(mu_);
  std::vector<GradStats> grad_stats_ ABSL_GUARDED_BY(mu_);
  bool open_ ABSL_GUARDED_BY(mu_) = true;
};

// Returns once every task scheduled on `pool` before the call has run.
// REQUIRES: pool has one thread (tasks then run in FIFO order).
inline void DrainPool(ThreadPool& pool) {
  absl::Notification done;
  pool.Schedule([&done] { done.Notify(); });
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(kWaitLimit));
}

// The fixture of ShardState tests: metrics, a one-thread update pool, a
// payload pool, and helpers to make a shard and contributions.
class ShardTest : public ::testing::Test {
 protected:
  std::shared_ptr<ShardState> MakeShard(const JobConfig& config,
                                        uint32_t server_index = 0) {
    return ShardState::Create(/*job_id=*/1,
                              JobShape::Create(config, server_index).value(),
                              &pool_, payloads_, &metrics_)
        .value();
  }

  // Worker `worker`'s gradient `values` for chunk `chunk` of step `step`.
  static Contribution Grad(uint64_t step, uint32_t worker, uint64_t chunk,
                           const std::vector<float>& values,
                           std::shared_ptr<StepReplySink> sink) {
    Contribution c;
    c.step = step;
    c.worker_rank = worker;
    c.chunk_index = chunk;
    c.payload = Fp32Payload(values);
    c.sink = std::move(sink);
    return c;
  }

  prometheus::Registry registry_;
  ServerMetrics metrics_{registry_};
  ThreadPool pool_{1};
  std::shared_ptr<PayloadPool> payloads_ = PayloadPool::Create(1 << 20);
};

}  // namespace depot::testing

#endif  // DEPOT_SERVER_TESTS_TEST_UTIL_H_
