// WatchedCollective (client/src/gpu/watched_collective.h) over two ranks of
// a HostCollective, each with its own HostDevice: a call the other rank
// never makes expires at the timeout (not before, not never), the clock
// starts when the stream reaches the call, a slow rank within the timeout
// costs nothing, and another rank's abort ends this rank's watch at once.
#include "gpu/watched_collective.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gpu/host_collective.h"
#include "gpu/host_device.h"
#include "gtest/gtest.h"

namespace depot::gpu {
namespace {

struct Rank {
  HostDevice device;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<Collective> inner;
  std::unique_ptr<Buffer> data;  // one float
};

// What on_expired saw: each call's status, and whether the inner collective
// was already aborted then (it must not be: the owner acts first).
struct Expiries {
  absl::Mutex mu;
  std::vector<absl::Status> seen ABSL_GUARDED_BY(mu);
  std::vector<bool> aborted_first ABSL_GUARDED_BY(mu);
  absl::Time first_at ABSL_GUARDED_BY(mu);

  std::vector<absl::Status> Seen() {
    absl::MutexLock lock(&mu);
    return seen;
  }
  // Waits up to `most` for a first expiry; its time, or InfiniteFuture.
  absl::Time AwaitFirst(absl::Duration most) {
    absl::MutexLock lock(&mu);
    const auto any = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return !seen.empty();
    };
    if (!mu.AwaitWithTimeout(absl::Condition(&any), most)) {
      return absl::InfiniteFuture();
    }
    return first_at;
  }
};

class WatchedCollectiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    group_ = HostCollectiveGroup::Create(2);
    for (int r = 0; r < 2; ++r) {
      ranks_[r].stream = ranks_[r].device.CreateStream().value();
      ranks_[r].inner = group_->Join(r, ranks_[r].device);
      ranks_[r].data = ranks_[r].device.Allocate(sizeof(float)).value();
      Set(r, 1.0f + r);
    }
  }

  void Set(int r, float value) {
    std::memcpy(ranks_[r].data->data(), &value, sizeof(float));
  }
  float Get(int r) {
    float value;
    std::memcpy(&value, ranks_[r].data->data(), sizeof(float));
    return value;
  }

  // Rank r's inner collective, watched with `timeout`.
  std::unique_ptr<WatchedCollective> Watch(int r, absl::Duration timeout,
                                           Expiries& expiries) {
    return WatchedCollective::Create(
               ranks_[r].device, *ranks_[r].inner, timeout,
               [this, &expiries](const absl::Status& status) {
                 absl::MutexLock lock(&expiries.mu);
                 if (expiries.seen.empty()) expiries.first_at = absl::Now();
                 expiries.seen.push_back(status);
                 expiries.aborted_first.push_back(group_->aborted());
               })
        .value();
  }

  absl::Status AllReduce(Collective& collective, int r) {
    return collective.AllReduceSum(static_cast<float*>(ranks_[r].data->data()),
                                   1, *ranks_[r].stream);
  }

  std::shared_ptr<HostCollectiveGroup> group_;
  Rank ranks_[2];
};

TEST_F(WatchedCollectiveTest, ACallTheOtherRankNeverMakesExpiresAtTheTimeout) {
  Expiries expiries;
  const absl::Duration timeout = absl::Milliseconds(400);
  std::unique_ptr<WatchedCollective> watched = Watch(0, timeout, expiries);
  const absl::Time start = absl::Now();
  ASSERT_TRUE(AllReduce(*watched, 0).ok());  // rank 1 never calls
  const absl::Time expired_at = expiries.AwaitFirst(absl::Seconds(30));
  ASSERT_NE(expired_at, absl::InfiniteFuture()) << "never expired";
  EXPECT_GE(expired_at - start, timeout);
  EXPECT_LT(expired_at - start, absl::Seconds(10));
  // The stream behind the call moves on once it is aborted.
  ASSERT_TRUE(ranks_[0].device.SynchronizeStream(*ranks_[0].stream).ok());
  EXPECT_EQ(Get(0), 1.0f);  // computed nothing
  const std::vector<absl::Status> seen = expiries.Seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].code(), absl::StatusCode::kDeadlineExceeded) << seen[0];
  EXPECT_NE(seen[0].message().find("collective call 0 (an all-reduce of 1 "
                                   "fp32 elements)"),
            std::string::npos)
      << seen[0];
  EXPECT_NE(seen[0].message().find("timeout of 0.4 s"), std::string::npos)
      << seen[0];
  {
    absl::MutexLock lock(&expiries.mu);
    EXPECT_FALSE(expiries.aborted_first[0]);  // told before the abort
  }
  EXPECT_TRUE(group_->aborted());
  // Later calls queue nothing and return the expiry.
  EXPECT_EQ(watched->AsyncError().code(), absl::StatusCode::kDeadlineExceeded);
  Set(0, 5.0f);
  EXPECT_EQ(AllReduce(*watched, 0).code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(ranks_[0].device.SynchronizeStream(*ranks_[0].stream).ok());
  EXPECT_EQ(Get(0), 5.0f);
  EXPECT_EQ(expiries.Seen().size(), 1u);  // once
}

// Rank 0's stream reaches the call only after 3 s of its own work; rank 1
// calls at 2 s. Timed from the call's queuing, 1 s would expire. (Rank 1
// would have to be more than a second late to make it expire: loaded
// machines are.)
TEST_F(WatchedCollectiveTest, TheClockStartsWhenTheStreamReachesTheCall) {
  Expiries expiries;
  std::unique_ptr<WatchedCollective> watched =
      Watch(0, absl::Seconds(1), expiries);
  ASSERT_TRUE(ranks_[0]
                  .device
                  .LaunchHostFunc(*ranks_[0].stream,
                                  [] { absl::SleepFor(absl::Seconds(3)); })
                  .ok());
  ASSERT_TRUE(AllReduce(*watched, 0).ok());
  absl::SleepFor(absl::Seconds(2));
  ASSERT_TRUE(AllReduce(*ranks_[1].inner, 1).ok());
  for (Rank& rank : ranks_) {
    ASSERT_TRUE(rank.device.SynchronizeStream(*rank.stream).ok());
  }
  EXPECT_EQ(Get(0), 3.0f);
  EXPECT_EQ(Get(1), 3.0f);
  absl::SleepFor(absl::Milliseconds(1200));  // past the timeout, done
  EXPECT_TRUE(expiries.Seen().empty());
  EXPECT_TRUE(watched->AsyncError().ok());
}

// Many calls, each rank watched, rank 1 late by a third of the timeout on
// some: every sum is right and nothing expires (the events go back to a
// pool).
TEST_F(WatchedCollectiveTest, ASlowRankWithinTheTimeoutCostsNothing) {
  Expiries expiries[2];
  std::unique_ptr<WatchedCollective> watched[2] = {
      Watch(0, absl::Seconds(3), expiries[0]),
      Watch(1, absl::Seconds(3), expiries[1])};
  for (int call = 0; call < 40; ++call) {
    Set(0, 1.0f);
    Set(1, 2.0f);
    std::thread late([&] {
      if (call % 10 == 0) absl::SleepFor(absl::Seconds(1));
      EXPECT_TRUE(AllReduce(*watched[1], 1).ok());
    });
    EXPECT_TRUE(AllReduce(*watched[0], 0).ok());
    late.join();
    for (Rank& rank : ranks_) {
      ASSERT_TRUE(rank.device.SynchronizeStream(*rank.stream).ok());
    }
    ASSERT_EQ(Get(0), 3.0f) << call;
    ASSERT_EQ(Get(1), 3.0f) << call;
  }
  for (Expiries& e : expiries) EXPECT_TRUE(e.Seen().empty());
}

// Rank 1 aborts (its own watch expired, or it gave up): rank 0, watched
// with a minute's timeout, learns it from the collective at its next poll.
TEST_F(WatchedCollectiveTest, AnotherRanksAbortEndsThisRanksWatchAtOnce) {
  Expiries expiries;
  std::unique_ptr<WatchedCollective> watched =
      Watch(0, absl::Seconds(60), expiries);
  ASSERT_TRUE(AllReduce(*watched, 0).ok());
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time start = absl::Now();
  ranks_[1].inner->Abort();
  const absl::Time expired_at = expiries.AwaitFirst(absl::Seconds(30));
  ASSERT_NE(expired_at, absl::InfiniteFuture()) << "never expired";
  EXPECT_LT(expired_at - start, absl::Seconds(10));
  ASSERT_TRUE(ranks_[0].device.SynchronizeStream(*ranks_[0].stream).ok());
  const std::vector<absl::Status> seen = expiries.Seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].code(), absl::StatusCode::kFailedPrecondition) << seen[0];
  EXPECT_NE(seen[0].message().find("local rank 1 aborted"), std::string::npos)
      << seen[0];
}

TEST_F(WatchedCollectiveTest, AbortExpiresAtOnceAndLaterCallsFail) {
  Expiries expiries;
  std::unique_ptr<WatchedCollective> watched =
      Watch(0, absl::Seconds(60), expiries);
  ASSERT_TRUE(AllReduce(*watched, 0).ok());
  watched->Abort();
  ASSERT_TRUE(ranks_[0].device.SynchronizeStream(*ranks_[0].stream).ok());
  ASSERT_EQ(expiries.Seen().size(), 1u);
  EXPECT_EQ(expiries.Seen()[0].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(AllReduce(*watched, 0).code(),
            absl::StatusCode::kFailedPrecondition);
  watched->Abort();  // once is enough; a second does nothing
  EXPECT_EQ(expiries.Seen().size(), 1u);
}

TEST_F(WatchedCollectiveTest, ATimeoutMustBePositive) {
  EXPECT_EQ(WatchedCollective::Create(ranks_[0].device, *ranks_[0].inner,
                                      absl::ZeroDuration(),
                                      [](const absl::Status&) {})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace depot::gpu
