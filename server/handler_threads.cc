#include "server/handler_threads.h"

#include <thread>
#include <utility>

namespace depot {

HandlerThreads::HandlerThreads(absl::Duration idle_timeout, int keep_idle)
    : state_(std::make_shared<State>()) {
  state_->idle_timeout = idle_timeout;
  state_->keep_idle = keep_idle;
}

HandlerThreads::~HandlerThreads() {
  State& state = *state_;
  absl::MutexLock lock(&state.mu);
  state.stopping = true;
  state.mu.Await(absl::Condition(
      +[](int* threads) { return *threads == 0; }, &state.threads));
}

void HandlerThreads::Run(std::function<void()> task) {
  bool start_thread = false;
  {
    absl::MutexLock lock(&state_->mu);
    state_->queue.push_back(std::move(task));
    // Each waiting thread takes one queued task; any more need a new thread.
    if (state_->queue.size() > static_cast<size_t>(state_->idle)) {
      ++state_->threads;
      start_thread = true;
    }
  }
  // The thread shares the state, so that its last unlock never touches a
  // mutex the destructor has freed.
  if (start_thread) std::thread(&HandlerThreads::Loop, state_).detach();
}

void HandlerThreads::Loop(std::shared_ptr<State> shared) {
  State& state = *shared;
  absl::MutexLock lock(&state.mu);
  const auto work_or_stop = [&state]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu) {
    return !state.queue.empty() || state.stopping;
  };
  while (true) {
    if (!state.queue.empty()) {
      std::function<void()> task = std::move(state.queue.front());
      state.queue.pop_front();
      state.mu.Unlock();
      task();
      task = nullptr;  // its captures go before the thread waits
      state.mu.Lock();
      continue;
    }
    if (state.stopping) break;
    ++state.idle;
    const bool woken = state.mu.AwaitWithTimeout(absl::Condition(&work_or_stop),
                                                 state.idle_timeout);
    --state.idle;
    if (!woken && state.idle >= state.keep_idle) break;
  }
  --state.threads;
}

int HandlerThreads::threads() const {
  absl::MutexLock lock(&state_->mu);
  return state_->threads;
}

int HandlerThreads::idle() const {
  absl::MutexLock lock(&state_->mu);
  return state_->idle;
}

}  // namespace depot
