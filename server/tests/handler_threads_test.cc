// HandlerThreads: every task starts at once on a thread of its own, idle
// threads beyond the ones kept leave, and the destructor waits for what runs.
#include "server/handler_threads.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace depot {
namespace {

// Waits (a bounded time) until `condition` holds.
template <typename Condition>
bool Eventually(Condition condition) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST(HandlerThreadsTest, TasksThatWaitForEachOtherAllRun) {
  // Each task waits until all have started: a pool that queued any behind
  // a running one would never finish them.
  constexpr int kTasks = 32;
  HandlerThreads threads;
  absl::BlockingCounter started(kTasks);
  absl::Notification all_started;
  std::atomic<int> finished{0};
  for (int i = 0; i < kTasks; ++i) {
    ASSERT_TRUE(threads.Run([&] {
      started.DecrementCount();
      all_started.WaitForNotification();
      finished.fetch_add(1);
    }));
  }
  started.Wait();
  all_started.Notify();
  ASSERT_TRUE(Eventually([&] { return finished.load() == kTasks; }));
  EXPECT_GE(threads.threads(), kTasks);
}

TEST(HandlerThreadsTest, AnIdleThreadTakesTheNextTask) {
  HandlerThreads threads;
  std::atomic<int> runs{0};
  ASSERT_TRUE(threads.Run([&] { runs.fetch_add(1); }));
  ASSERT_TRUE(Eventually([&] { return threads.idle() == 1; }));
  for (int i = 0; i < 10; ++i) {
    const int before = runs.load();
    ASSERT_TRUE(threads.Run([&] { runs.fetch_add(1); }));
    ASSERT_TRUE(Eventually(
        [&] { return runs.load() == before + 1 && threads.idle() == 1; }));
  }
  EXPECT_EQ(threads.threads(), 1);
}

TEST(HandlerThreadsTest, IdleThreadsBeyondThoseKeptLeave) {
  constexpr int kTasks = 8;
  HandlerThreads threads(HandlerThreads::kDefaultMaxThreads,
                         absl::Milliseconds(50), /*keep_idle=*/2);
  absl::BlockingCounter started(kTasks);
  absl::Notification release;
  for (int i = 0; i < kTasks; ++i) {
    ASSERT_TRUE(threads.Run([&] {
      started.DecrementCount();
      release.WaitForNotification();
    }));
  }
  started.Wait();
  EXPECT_EQ(threads.threads(), kTasks);
  release.Notify();
  EXPECT_TRUE(Eventually([&] { return threads.threads() == 2; }))
      << threads.threads() << " threads are left";
  EXPECT_EQ(threads.idle(), 2);
}

TEST(HandlerThreadsTest, NoMoreThanMaxThreadsRunAtOnce) {
  HandlerThreads threads(/*max_threads=*/3);
  absl::BlockingCounter started(3);
  absl::Notification release;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(threads.Run([&] {
      started.DecrementCount();
      release.WaitForNotification();
    }));
  }
  started.Wait();
  bool ran = false;
  EXPECT_FALSE(threads.Run([&] { ran = true; }));
  EXPECT_EQ(threads.threads(), 3);
  release.Notify();
  // Once a thread is free again it takes the next task.
  ASSERT_TRUE(Eventually([&] { return threads.idle() == 3; }));
  std::atomic<bool> later{false};
  EXPECT_TRUE(threads.Run([&] { later.store(true); }));
  EXPECT_TRUE(Eventually([&] { return later.load(); }));
  EXPECT_FALSE(ran);
}

TEST(HandlerThreadsTest, TheDestructorWaitsForRunningTasks) {
  std::atomic<bool> done{false};
  absl::Notification started;
  {
    HandlerThreads threads;
    ASSERT_TRUE(threads.Run([&] {
      started.Notify();
      absl::SleepFor(absl::Milliseconds(100));
      done.store(true);
    }));
    started.WaitForNotification();
  }
  EXPECT_TRUE(done.load());
}

}  // namespace
}  // namespace depot
