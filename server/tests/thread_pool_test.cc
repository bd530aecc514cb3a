#include "server/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "server/optimizer/cpu_affinity.h"

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

// The CPUs the calling thread may run on.
std::vector<int> ThreadCpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  pthread_getaffinity_np(pthread_self(), sizeof(mask), &mask);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &mask)) cpus.push_back(cpu);
  }
  return cpus;
}

// Runs one task on every thread of `pool` at once (each task waits until all
// have started, so no thread can take two) and returns each one's CPUs.
std::vector<std::vector<int>> CpusOfEveryThread(ThreadPool& pool) {
  const size_t threads = static_cast<size_t>(pool.num_threads());
  absl::Mutex mu;
  std::vector<std::vector<int>> seen;
  absl::BlockingCounter done(pool.num_threads());
  for (size_t i = 0; i < threads; ++i) {
    pool.Schedule([&] {
      absl::MutexLock lock(&mu);
      seen.push_back(ThreadCpus());
      auto all_started = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
        return seen.size() == threads;
      };
      mu.Await(absl::Condition(&all_started));
      done.DecrementCount();
    });
  }
  done.Wait();
  absl::MutexLock lock(&mu);
  return seen;
}

TEST(ThreadPoolTest, PinnedThreadsEachRunOnOneAllowedCpuSpreadRoundRobin) {
  const std::vector<int> allowed = AllowedCpus();
  ASSERT_FALSE(allowed.empty());
  // One thread more than CPUs: the last one wraps round to the first CPU.
  const int threads = static_cast<int>(allowed.size()) + 1;
  ThreadPool pool(threads, /*pin_threads=*/true);
  std::vector<int> used;
  for (const std::vector<int>& cpus : CpusOfEveryThread(pool)) {
    ASSERT_EQ(cpus.size(), 1u);
    EXPECT_NE(std::find(allowed.begin(), allowed.end(), cpus[0]),
              allowed.end());
    used.push_back(cpus[0]);
  }
  std::sort(used.begin(), used.end());
  std::vector<int> expected = allowed;
  expected.push_back(allowed[0]);
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(used, expected);
}

TEST(ThreadPoolTest, UnpinnedThreadsKeepTheProcessMask) {
  ThreadPool pool(2, /*pin_threads=*/false);
  for (const std::vector<int>& cpus : CpusOfEveryThread(pool)) {
    EXPECT_EQ(cpus, AllowedCpus());
  }
}

}  // namespace
}  // namespace depot
