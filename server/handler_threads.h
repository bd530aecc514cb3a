// HandlerThreads: the threads that run the blocking handlers of the Depot
// methods other than Step (server/blocking_call.h). Every task starts at once
// on a thread of its own: an idle thread if there is one, else a new one, so
// a handler that waits for its client (an import reading, a pull writing)
// never holds up another call, as with gRPC's synchronous server. A thread
// left idle for `idle_timeout` exits unless only `keep_idle` are left, so a
// burst of calls leaves no crowd of threads behind. At most `max_threads`
// run at once: a client that opens call after call and never finishes them
// cannot make the server start threads without end.
//
// Thread safety: Run may be called from any thread, gRPC's callback threads
// included; it never waits for a task.
#ifndef DEPOT_SERVER_HANDLER_THREADS_H_
#define DEPOT_SERVER_HANDLER_THREADS_H_

#include <deque>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace depot {

class HandlerThreads {
 public:
  // The server's default (--max_handler_threads).
  static constexpr int kDefaultMaxThreads = 4096;

  explicit HandlerThreads(int max_threads = kDefaultMaxThreads,
                          absl::Duration idle_timeout = absl::Seconds(30),
                          int keep_idle = 4);
  // Waits for the running tasks to return and the threads to exit.
  // REQUIRES: no Run after it starts.
  ~HandlerThreads();

  HandlerThreads(const HandlerThreads&) = delete;
  HandlerThreads& operator=(const HandlerThreads&) = delete;

  // Runs `task` on a thread of its own now: true. False, and `task` is
  // dropped unrun, when max_threads tasks are running, or the system refused
  // a new thread. Tasks must not throw.
  [[nodiscard]] bool Run(std::function<void()> task);

  // Threads alive (running a task or idle), and those idle: for tests.
  int threads() const;
  int idle() const;

 private:
  struct State {
    absl::Duration idle_timeout;
    int keep_idle = 0;
    int max_threads = 0;
    absl::Mutex mu;
    std::deque<std::function<void()>> queue ABSL_GUARDED_BY(mu);
    int threads ABSL_GUARDED_BY(mu) = 0;  // alive: running a task or waiting
    int idle ABSL_GUARDED_BY(mu) = 0;     // waiting for a task
    bool stopping ABSL_GUARDED_BY(mu) = false;
  };
  // Runs `first`, then the queued tasks, until it is idle too long or the
  // pool stops.
  static void Loop(std::shared_ptr<State> state, std::function<void()> first);

  const std::shared_ptr<State> state_;
};

}  // namespace depot

#endif  // DEPOT_SERVER_HANDLER_THREADS_H_
