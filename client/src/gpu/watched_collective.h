// WatchedCollective: a Collective (collective.h) whose calls may not wait
// for the node's other ranks for ever (docs/gpu.md, "A rank that dies").
//
// A collective waits on the device until every rank has queued the same
// call. A rank that died, hung, or stopped stepping never does, and NCCL
// cannot tell it from a slow one: its peers' kernels spin for ever, and
// every stream and host wait behind them with them. WatchedCollective
// records an event before and after each call on the call's stream, and a
// thread of its own looks at them every poll interval: once a call has
// been running (its first event reached, its second not) for longer than
// the timeout, or the inner collective reports an error of the node
// (AsyncError: a peer aborted), it expires: it calls `on_expired` with the
// error (DEADLINE_EXCEEDED naming the call and how long it waited, or
// FAILED_PRECONDITION with the peer's error), then aborts the inner
// collective, so that the calls
// waiting end at once and the streams behind them move on. Every later
// call returns that error and queues nothing. `on_expired` runs before the
// abort, so that its owner can stop using what the aborted calls produce
// (their buffers hold whatever they held).
//
// The clock of a call starts when its stream reaches it, not when it is
// queued: a call queued behind this rank's own work (a bucket's gradients
// still being computed) is not counted as waiting for the others.
#ifndef DEPOT_CLIENT_SRC_GPU_WATCHED_COLLECTIVE_H_
#define DEPOT_CLIENT_SRC_GPU_WATCHED_COLLECTIVE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gpu/collective.h"

namespace depot::gpu {

class WatchedCollective : public Collective {
 public:
  // Watches `inner` (which outlives this), whose calls are queued on streams
  // of `device`. `timeout` > 0. `on_expired` runs once, on the watch thread,
  // and must not call into this collective.
  static absl::StatusOr<std::unique_ptr<WatchedCollective>> Create(
      Device& device, Collective& inner, absl::Duration timeout,
      std::function<void(const absl::Status&)> on_expired);
  // Stops the watch thread (an expiry in progress completes first).
  ~WatchedCollective() override;

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  absl::Status ReduceScatterSum(const void* send, void* recv, size_t count,
                                DType dtype, Stream& stream) override;
  absl::Status AllGather(const void* send, void* recv, size_t count,
                         DType dtype, Stream& stream) override;
  absl::Status AllReduceSum(float* data, size_t count, Stream& stream) override;
  // Expires now, with FAILED_PRECONDITION saying so.
  void Abort() override;
  // The error it expired with, OK before.
  absl::Status AsyncError() override;

 private:
  // One call: the events around it, what it was, when the host called it,
  // whether it was queued (the host call returned OK) or is done (its
  // second event reached, or not queued), and since when its stream has
  // been in it (the watch thread's).
  struct Watched {
    std::unique_ptr<Event> before, after;
    uint64_t sequence = 0;
    std::string what;
    absl::Time called_at;
    bool queued = false;
    bool done = false;
    std::optional<absl::Time> running_since;
  };

  WatchedCollective(Device& device, Collective& inner, absl::Duration timeout,
                    std::function<void(const absl::Status&)> on_expired);

  // Queues `call` (one of inner_'s) between two events on `stream`.
  absl::Status Watch(Stream& stream, std::string what,
                     const std::function<absl::Status()>& call);
  // An event from the pool, or a new one.
  absl::StatusOr<std::unique_ptr<Event>> TakeEvent()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The watch thread: every poll interval, Check.
  void Run();
  // The error to expire with now, if any: the inner collective's, or a call
  // running past the timeout. Completed calls go back to the pool.
  std::optional<absl::Status> Check() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls on_expired_ once with `status`, then aborts inner_.
  void Expire(const absl::Status& status);

  Device& device_;
  Collective& inner_;
  const absl::Duration timeout_;
  const absl::Duration poll_;
  const std::function<void(const absl::Status&)> on_expired_;

  absl::Mutex mu_;
  // Per stream, its calls not yet known to be done, oldest first (a stream
  // runs in order: only its first can be running).
  std::map<Stream*, std::deque<Watched>> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Event>> free_events_ ABSL_GUARDED_BY(mu_);
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status expired_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Serializes Expire (the watch thread's and Abort's).
  absl::Mutex expire_mu_;
  std::thread thread_;
};

}  // namespace depot::gpu

#endif  // DEPOT_CLIENT_SRC_GPU_WATCHED_COLLECTIVE_H_
