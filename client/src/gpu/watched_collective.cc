#include "gpu/watched_collective.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "depot/dtype.h"

namespace depot::gpu {
namespace {

std::string Elements(size_t count, DType dtype) {
  return absl::StrCat(count, " ", std::string(DTypeName(dtype)), " elements");
}

}  // namespace

absl::StatusOr<std::unique_ptr<WatchedCollective>> WatchedCollective::Create(
    Device& device, Collective& inner, absl::Duration timeout,
    std::function<void(const absl::Status&)> on_expired) {
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "WatchedCollective: the timeout must be positive");
  }
  return std::unique_ptr<WatchedCollective>(
      new WatchedCollective(device, inner, timeout, std::move(on_expired)));
}

WatchedCollective::WatchedCollective(
    Device& device, Collective& inner, absl::Duration timeout,
    std::function<void(const absl::Status&)> on_expired)
    : device_(device),
      inner_(inner),
      timeout_(timeout),
      // A tenth of the timeout, within [1 ms, 100 ms]: an expiry comes at
      // most that late, and a poll costs two event queries per stream.
      poll_(std::clamp(timeout / 10, absl::Milliseconds(1),
                       absl::Milliseconds(100))),
      on_expired_(std::move(on_expired)) {
  thread_ = std::thread([this] { Run(); });
}

WatchedCollective::~WatchedCollective() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

absl::Status WatchedCollective::ReduceScatterSum(const void* send, void* recv,
                                                 size_t count, DType dtype,
                                                 Stream& stream) {
  return Watch(
      stream, "a reduce-scatter of " + Elements(count, dtype) + " per rank",
      [&] {
        return inner_.ReduceScatterSum(send, recv, count, dtype, stream);
      });
}

absl::Status WatchedCollective::AllGather(const void* send, void* recv,
                                          size_t count, DType dtype,
                                          Stream& stream) {
  return Watch(
      stream, "an all-gather of " + Elements(count, dtype) + " per rank",
      [&] { return inner_.AllGather(send, recv, count, dtype, stream); });
}

absl::Status WatchedCollective::AllReduceSum(float* data, size_t count,
                                             Stream& stream) {
  return Watch(stream, "an all-reduce of " + Elements(count, DType::kFloat32),
               [&] { return inner_.AllReduceSum(data, count, stream); });
}

void WatchedCollective::Abort() {
  Expire(absl::FailedPreconditionError(
      "the node's collectives were aborted on this rank"));
}

absl::Status WatchedCollective::AsyncError() {
  absl::MutexLock lock(&mu_);
  return expired_;
}

absl::Status WatchedCollective::Watch(
    Stream& stream, std::string what,
    const std::function<absl::Status()>& call) {
  Watched* watched;
  {
    absl::MutexLock lock(&mu_);
    if (!expired_.ok()) return expired_;
    absl::StatusOr<std::unique_ptr<Event>> before = TakeEvent();
    if (!before.ok()) return before.status();
    absl::StatusOr<std::unique_ptr<Event>> after = TakeEvent();
    if (!after.ok()) {
      free_events_.push_back(*std::move(before));
      return after.status();
    }
    // In the list before the call: a first NCCL call can block the host
    // (its connections to a dead peer), and that is watched too.
    std::deque<Watched>& list = pending_[&stream];
    list.emplace_back();
    watched = &list.back();  // a deque's elements stay where they are
    watched->before = *std::move(before);
    watched->after = *std::move(after);
    watched->sequence = next_sequence_++;
    watched->what = std::move(what);
    watched->called_at = absl::Now();
  }
  absl::Status s = device_.Record(*watched->before, stream);
  if (s.ok()) s = call();
  if (s.ok()) s = device_.Record(*watched->after, stream);
  absl::MutexLock lock(&mu_);
  // Not queued: nothing to wait for (the events may be reached or not;
  // they go back to the pool once this entry reaches the front).
  watched->queued = s.ok();
  watched->done = !s.ok();
  return s;
}

absl::StatusOr<std::unique_ptr<Event>> WatchedCollective::TakeEvent() {
  if (!free_events_.empty()) {
    std::unique_ptr<Event> event = std::move(free_events_.back());
    free_events_.pop_back();
    return event;
  }
  return device_.CreateEvent();
}

void WatchedCollective::Run() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_), poll_);
    if (stop_) return;
    if (!expired_.ok()) continue;  // nothing left to watch
    std::optional<absl::Status> error = Check();
    if (!error.has_value()) continue;
    mu_.Unlock();
    Expire(*error);
    mu_.Lock();
  }
}

std::optional<absl::Status> WatchedCollective::Check() {
  if (absl::Status async = inner_.AsyncError(); !async.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "local rank ", inner_.rank(),
        ": the node's collectives ended elsewhere (", async.message(),
        "). This rank's collectives are aborted; every rank's engine must "
        "be made anew"));
  }
  const absl::Time now = absl::Now();
  for (auto& [stream, list] : pending_) {
    while (!list.empty()) {
      Watched& front = list.front();
      if (!front.done && front.queued) {
        absl::StatusOr<bool> after = device_.Query(*front.after);
        if (!after.ok()) return after.status();
        front.done = *after;
      }
      if (front.done) {
        free_events_.push_back(std::move(front.before));
        free_events_.push_back(std::move(front.after));
        list.pop_front();
        continue;
      }
      absl::Duration waited = absl::ZeroDuration();
      if (!front.queued) {
        // Still in the host call.
        waited = now - front.called_at;
      } else {
        absl::StatusOr<bool> before = device_.Query(*front.before);
        if (!before.ok()) return before.status();
        if (*before && !front.running_since.has_value()) {
          front.running_since = now;
        }
        if (front.running_since.has_value()) {
          waited = now - *front.running_since;
        }
      }
      if (waited > timeout_) {
        return absl::DeadlineExceededError(absl::StrFormat(
            "local rank %d's collective call %d (%s) waited %.1f s for "
            "the node's other %d local rank(s), more than the collective "
            "timeout of %.1f s: a rank died, hung, or stopped stepping. "
            "This rank's collectives are aborted; every rank's engine must "
            "be made anew",
            inner_.rank(), front.sequence, front.what,
            absl::ToDoubleSeconds(waited), inner_.size() - 1,
            absl::ToDoubleSeconds(timeout_)));
      }
      break;  // a stream runs in order: its later calls wait behind this
    }
  }
  return std::nullopt;
}

void WatchedCollective::Expire(const absl::Status& status) {
  absl::MutexLock serial(&expire_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (!expired_.ok()) return;
    expired_ = status;
  }
  on_expired_(status);
  inner_.Abort();
}

}  // namespace depot::gpu
