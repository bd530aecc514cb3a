#include "server/job_store.h"

#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/metrics.h"
#include "server/tests/test_util.h"
#include "server/thread_pool.h"

namespace depot {
namespace {

using ::depot::testing::PlainSgdConfig;

// 64 elements in one tensor, two servers of 32 each; Adam keeps 2 slots, so a
// shard costs 32 * 4 * 3 = 384 bytes.
JobConfig AdamConfig(const std::string& name) {
  JobConfig config = PlainSgdConfig({{"w", 64, 0}}, 1, 16, 16);
  config.name = name;
  config.optimizer.kind = OptimizerKind::kAdam;
  config.num_servers = 2;
  return config;
}
// A job counts its state, the weights its chunks keep for pulls at a step
// (2 * 32 elements * 4 bytes of fp32 weights = 256) and its bookkeeping.
uint64_t AdamBookkeepingBytes() {
  return ShardState::BookkeepingBytes(*JobShape::Create(AdamConfig("a"), 0));
}
const uint64_t kShardBytes = 384 + 256 + AdamBookkeepingBytes();

class JobStoreTest : public ::testing::Test {
 protected:
  prometheus::Registry registry_;
  ServerMetrics metrics_{registry_};
  ThreadPool pool_{1};
  // Room for two such jobs, not three.
  JobStore store_{/*memory_limit_bytes=*/kShardBytes * 5 / 2, &pool_,
                  &metrics_};
};

TEST_F(JobStoreTest, CreatedJobsGetIdsOneTwoThree) {
  for (uint64_t id = 1; id <= 2; ++id) {
    auto opened = store_.CreateOrAttach(AdamConfig(absl::StrCat("j", id)), 0);
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_TRUE(opened->created);
    EXPECT_EQ(opened->shard->job_id(), id);
  }
  EXPECT_EQ(store_.state_bytes(), 2 * kShardBytes);
  EXPECT_EQ(metrics_.jobs.Value(), 2.0);
}

TEST_F(JobStoreTest, SameNameConfigAndServerIndexAttaches) {
  auto first = store_.CreateOrAttach(AdamConfig("run"), 1);
  auto second = store_.CreateOrAttach(AdamConfig("run"), 1);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->created);
  EXPECT_EQ(second->shard, first->shard);
  EXPECT_EQ(store_.state_bytes(), kShardBytes);
}

// The state is allocated outside the store's lock: requests for one name at
// once must still create it once, and each must get that one job.
TEST_F(JobStoreTest, ConcurrentRequestsForOneNameCreateItOnce) {
  constexpr int kThreads = 8;
  std::vector<absl::StatusOr<OpenedJob>> opened(
      kThreads, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back(
        [&, t] { opened[t] = store_.CreateOrAttach(AdamConfig("run"), 0); });
  }
  for (std::thread& thread : threads) thread.join();
  int created = 0;
  for (const absl::StatusOr<OpenedJob>& job : opened) {
    ASSERT_TRUE(job.ok()) << job.status();
    created += job->created ? 1 : 0;
    EXPECT_EQ(job->shard, opened[0]->shard);
  }
  EXPECT_EQ(created, 1);
  EXPECT_EQ(store_.state_bytes(), kShardBytes);
  EXPECT_EQ(metrics_.jobs.Value(), 1.0);
  // Only the one job holds budget: one more shard fits, a second does not.
  EXPECT_TRUE(store_.CreateOrAttach(AdamConfig("b"), 0).ok());
  EXPECT_EQ(store_.CreateOrAttach(AdamConfig("c"), 0).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// Job names are per tenant: two tenants' jobs of one name are two jobs,
// whatever their configs and server indexes, and each tenant attaches to its
// own.
TEST_F(JobStoreTest, TwoTenantsJobsOfOneNameAreTwoJobs) {
  auto alpha = store_.CreateOrAttach(AdamConfig("run"), 0, "alpha");
  ASSERT_TRUE(alpha.ok()) << alpha.status();
  JobConfig other = AdamConfig("run");
  other.optimizer.lr = 0.1;
  auto beta = store_.CreateOrAttach(other, 1, "beta");
  ASSERT_TRUE(beta.ok()) << beta.status();
  EXPECT_TRUE(beta->created);
  EXPECT_NE(beta->shard, alpha->shard);
  EXPECT_EQ(beta->shard->shape().tenant(), "beta");
  EXPECT_EQ(beta->shard->shape().key(), (JobKey{"beta", "run"}));
  auto again = store_.CreateOrAttach(AdamConfig("run"), 0, "alpha");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->shard, alpha->shard);
  // The implicit tenant's "run" would be a third job: the budget (two
  // shards) says so, not a clash of names.
  EXPECT_EQ(store_.CreateOrAttach(AdamConfig("run"), 0).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(
      store_.Delete(beta->shard->job_id(), beta->shard->shape().fingerprint())
          .ok());
  EXPECT_TRUE(store_.Find(alpha->shard->job_id()).ok());
  auto fresh = store_.CreateOrAttach(AdamConfig("run"), 0, "beta");
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE(fresh->created);
}

TEST_F(JobStoreTest, SameNameWithOtherConfigIsFailedPrecondition) {
  ASSERT_TRUE(store_.CreateOrAttach(AdamConfig("run"), 0).ok());
  JobConfig other = AdamConfig("run");
  other.optimizer.lr = 0.1;
  auto opened = store_.CreateOrAttach(other, 0);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobStoreTest, ConfigMismatchListsTheFieldsThatDifferWithBothSides) {
  JobConfig existing = AdamConfig("run");
  existing.optimizer.lr = 0.001;
  ASSERT_TRUE(store_.CreateOrAttach(existing, 0).ok());
  JobConfig request = AdamConfig("run");
  request.optimizer.lr = 0.0003;
  request.grad_dtype = DType::kBFloat16;
  const absl::Status status = store_.CreateOrAttach(request, 0).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find(
                "optimizer.lr: 0.001 (existing job) vs 0.0003 (this request); "
                "grad_dtype: fp32 (existing job) vs bf16 (this request)"),
            std::string::npos)
      << status;
  EXPECT_NE(status.message().find("job \"run\" already exists (id 1)"),
            std::string::npos)
      << status;
}

TEST_F(JobStoreTest, SameNameWithOtherServerIndexIsFailedPrecondition) {
  ASSERT_TRUE(store_.CreateOrAttach(AdamConfig("run"), 0).ok());
  auto opened = store_.CreateOrAttach(AdamConfig("run"), 1);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(opened.status().message().find("server index"), std::string::npos);
}

TEST_F(JobStoreTest, ServerIndexBeyondTheServerCountIsInvalidArgument) {
  EXPECT_EQ(store_.CreateOrAttach(AdamConfig("run"), 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(JobStoreTest, JobOverTheBudgetIsResourceExhaustedAndAllocatesNothing) {
  ASSERT_TRUE(store_.CreateOrAttach(AdamConfig("a"), 0).ok());
  ASSERT_TRUE(store_.CreateOrAttach(AdamConfig("b"), 0).ok());
  auto third = store_.CreateOrAttach(AdamConfig("c"), 0);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store_.state_bytes(), 2 * kShardBytes);
  // The failed attempt used no id.
  store_.Delete(1, store_.Find(1).value()->shape().fingerprint()).IgnoreError();
  EXPECT_EQ(store_.CreateOrAttach(AdamConfig("c"), 0).value().shard->job_id(),
            3u);
}

TEST_F(JobStoreTest, KeptWeightsCountAgainstTheBudgetAndTheErrorSaysSo) {
  // Room for the state (384 bytes) and the bookkeeping, not for the kept
  // weights too.
  JobStore store(/*memory_limit_bytes=*/kShardBytes - 1, &pool_, &metrics_);
  auto opened = store.CreateOrAttach(AdamConfig("run"), 0);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(opened.status().message().find(absl::StrCat(
                "needs ", kShardBytes,
                " bytes: 384 of state, 256 of weights kept for pulls at a "
                "step (2 x 32 elements x 4 bytes of fp32) and ",
                AdamBookkeepingBytes(), " of bookkeeping")),
            std::string::npos)
      << opened.status();
  EXPECT_EQ(store.state_bytes(), 0u);
}

// Issue 13: a job of 100 elements with 2^27 servers grew the server by 5.2
// GB (a shard plan entry per server), and per-worker bookkeeping was
// allocated outside the budget. Both are counted now: a job whose
// bookkeeping does not fit is refused before anything is allocated.
TEST_F(JobStoreTest, PerWorkerAndPerServerBookkeepingCountsAgainstTheBudget) {
  JobConfig many = AdamConfig("many");
  many.num_workers = kMaxWorkers;
  many.num_servers = kMaxServers;
  // The last server holds a chunk (most of the 65536 hold none).
  const uint32_t last = kMaxServers - 1;
  const JobShape shape = *JobShape::Create(many, last);
  ASSERT_EQ(shape.shard().num_chunks(), 1u);
  const uint64_t bookkeeping = ShardState::BookkeepingBytes(shape);
  // Every chunk's next step has a slot per worker (tens of bytes each), and
  // the plan an entry per server.
  EXPECT_GT(bookkeeping, uint64_t{kMaxWorkers} * 32 + uint64_t{kMaxServers} * 32);
  JobStore store(/*memory_limit_bytes=*/bookkeeping, &pool_, &metrics_);
  auto opened = store.CreateOrAttach(many, last);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(opened.status().message().find(
                absl::StrCat(bookkeeping, " of bookkeeping (for its ",
                             kMaxServers, " servers, ", kMaxWorkers,
                             " workers, 1 tensors")),
            std::string::npos)
      << opened.status();
  EXPECT_EQ(store.state_bytes(), 0u);
  // With room for it, the job is created and charged all of it.
  JobStore roomy(/*memory_limit_bytes=*/uint64_t{1} << 30, &pool_, &metrics_);
  ASSERT_TRUE(roomy.CreateOrAttach(many, last).ok());
  EXPECT_EQ(roomy.state_bytes(),
            shape.state_bytes() + shape.kept_weights_bytes() + bookkeeping);
}

// A listener that throws when told of a new job.
class ThrowingListener : public JobListener {
 public:
  void JobAdded(const std::shared_ptr<ShardState>&, bool) override {
    throw std::runtime_error("listener failed");
  }
  void JobDeleted(const std::shared_ptr<ShardState>&) override {}
  void JobStateReplaced(const std::shared_ptr<ShardState>&) override {}
};

// CreateOrAttach allocates and announces a job with the store's lock
// released: an exception there used to escape with the lock released (the
// caller's lock then released twice) and the name left "being created" for
// ever, every later request for it waiting. It is a status now, and the name
// and the budget are free again.
TEST_F(JobStoreTest, AnExceptionWhileCreatingIsAStatusAndLeavesNothingHeld) {
  ThrowingListener listener;
  store_.SetListener(&listener, 0);
  auto opened = store_.CreateOrAttach(AdamConfig("run"), 0);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(opened.status().message().find("listener failed"),
            std::string::npos)
      << opened.status();
  EXPECT_EQ(store_.state_bytes(), 0u);
  EXPECT_EQ(store_.budget()->used(), 0u);
  // The same name again does not wait for a creation that is over.
  EXPECT_EQ(store_.CreateOrAttach(AdamConfig("run"), 0).status().code(),
            absl::StatusCode::kInternal);
}

TEST_F(JobStoreTest, SizeFieldsAboveTheirBoundsAreInvalidArgument) {
  JobConfig servers = AdamConfig("servers");
  servers.num_servers = uint32_t{1} << 27;
  auto opened = store_.CreateOrAttach(servers, 0);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(opened.status().message().find("num_servers: must be at most"),
            std::string::npos)
      << opened.status();
  JobConfig workers = AdamConfig("workers");
  workers.num_workers = uint32_t{1} << 31;
  opened = store_.CreateOrAttach(workers, 0);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(opened.status().message().find("num_workers: must be at most"),
            std::string::npos)
      << opened.status();
  EXPECT_EQ(store_.state_bytes(), 0u);
}

TEST_F(JobStoreTest, DeleteFreesTheBudgetAndForgetsTheJob) {
  auto opened = store_.CreateOrAttach(AdamConfig("run"), 0);
  const uint64_t fingerprint = opened->shard->shape().fingerprint();
  ASSERT_TRUE(store_.Delete(1, fingerprint).ok());
  EXPECT_EQ(store_.state_bytes(), 0u);
  EXPECT_EQ(store_.Find(1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(opened->shard->BeginStep(1, 0, {}).code(),
            absl::StatusCode::kAborted);
}

TEST_F(JobStoreTest, UnknownJobIsNotFound) {
  absl::Status s = store_.Find(7).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "job 7 not found");
}

TEST_F(JobStoreTest, WrongFingerprintIsFailedPreconditionNamingBoth) {
  auto opened = store_.CreateOrAttach(AdamConfig("run"), 0);
  const uint64_t fingerprint = opened->shard->shape().fingerprint();
  absl::Status s = store_.Find(1, 0xabcdef).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("0000000000abcdef"), std::string::npos) << s;
  EXPECT_NE(s.message().find(absl::StrFormat("%016x", fingerprint)),
            std::string::npos)
      << s;
}

}  // namespace
}  // namespace depot
