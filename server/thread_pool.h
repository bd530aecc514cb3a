// ThreadPool: a fixed set of threads running queued tasks in FIFO order. The
// server runs chunk updates on it so that the threads reading gRPC streams
// never wait for the optimizer.
#ifndef DEPOT_SERVER_THREAD_POOL_H_
#define DEPOT_SERVER_THREAD_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace depot {

class ThreadPool {
 public:
  // With pin_threads, thread i runs only on the i-th CPU of the process's
  // affinity mask at construction (wrapping round when there are more threads
  // than CPUs): a chunk's update then stays on one core, and the threads
  // spread over distinct cores. A thread that cannot be pinned runs unpinned.
  // REQUIRES: num_threads >= 1.
  explicit ThreadPool(int num_threads, bool pin_threads = false);
  // Runs every task already scheduled, then joins the threads.
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `task` to run on one of the threads. Tasks must not throw.
  // REQUIRES: called before the destructor starts.
  void Schedule(std::function<void()> task);

  int num_threads() const { return static_cast<int>(threads_.size()); }

 private:
  void WorkerLoop();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace depot

#endif  // DEPOT_SERVER_THREAD_POOL_H_
