#include "server/thread_pool.h"

#include <utility>

#include "server/optimizer/cpu_affinity.h"

namespace depot {

ThreadPool::ThreadPool(int num_threads, bool pin_threads) {
  const std::vector<int> cpus =
      pin_threads ? AllowedCpus() : std::vector<int>();
  threads_.reserve(num_threads);
  for (int i = 0; i < num_threads; ++i) {
    threads_.emplace_back([this, i, cpus] {
      // Best effort: an unpinned thread computes the same results.
      if (!cpus.empty()) PinCurrentThread(i, cpus).IgnoreError();
      WorkerLoop();
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void ThreadPool::Schedule(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
}

bool ThreadPool::HasWorkOrStopping() const {
  return stopping_ || !queue_.empty();
}

void ThreadPool::WorkerLoop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &ThreadPool::HasWorkOrStopping));
      // Drain the queue before stopping: a queued update owns contributions
      // that must not be dropped.
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace depot
