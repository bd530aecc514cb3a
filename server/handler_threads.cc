#include "server/handler_threads.h"

#include <system_error>
#include <thread>
#include <utility>

namespace depot {

HandlerThreads::HandlerThreads(int max_threads, absl::Duration idle_timeout,
                               int keep_idle)
    : state_(std::make_shared<State>()) {
  state_->idle_timeout = idle_timeout;
  state_->keep_idle = keep_idle;
  state_->max_threads = max_threads;
}

HandlerThreads::~HandlerThreads() {
  State& state = *state_;
  absl::MutexLock lock(&state.mu);
  state.stopping = true;
  state.mu.Await(absl::Condition(
      +[](int* threads) { return *threads == 0; }, &state.threads));
}

bool HandlerThreads::Run(std::function<void()> task) {
  {
    absl::MutexLock lock(&state_->mu);
    // An idle thread not yet promised a queued task takes this one.
    if (state_->queue.size() < static_cast<size_t>(state_->idle)) {
      state_->queue.push_back(std::move(task));
      return true;
    }
    if (state_->threads >= state_->max_threads) return false;
    ++state_->threads;
  }
  // A new thread starts with this task, which is never queued. It shares the
  // state, so that its last unlock never touches a mutex the destructor has
  // freed.
  try {
    std::thread(&HandlerThreads::Loop, state_, std::move(task)).detach();
  } catch (const std::system_error&) {
    absl::MutexLock lock(&state_->mu);
    --state_->threads;
    return false;
  }
  return true;
}

void HandlerThreads::Loop(std::shared_ptr<State> shared,
                          std::function<void()> first) {
  first();
  first = nullptr;  // its captures go before the thread waits
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
      task = nullptr;
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
