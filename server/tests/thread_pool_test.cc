#include "server/thread_pool.h"

#include <atomic>

#include "gtest/gtest.h"

namespace depot {
namespace {

TEST(ThreadPoolTest, DestructorRunsEveryScheduledTask) {
  std::atomic<int> ran{0};
  {
    ThreadPool pool(3);
    for (int i = 0; i < 100; ++i) pool.Schedule([&ran] { ++ran; });
  }
  EXPECT_EQ(ran.load(), 100);
}

}  // namespace
}  // namespace depot
