// StallMonitor: notices steps that wait for workers who never come. A step
// applies only once all W workers have contributed each chunk, so one worker
// that crashed, was never started, or runs with the wrong rank leaves the
// others waiting until their step deadline, and they only learn "deadline
// exceeded". The monitor looks at every job's oldest pending step
// (ShardState::OldestPendingStep) at a fixed interval; a step that has waited
// `threshold` or longer for missing workers is *stalled*: it is logged once,
// naming the job, the step and the missing ranks, counted in
// depot_step_stalls_total, and shown in the depot_stalled_* gauges until it
// moves on. (GetJob reports the same pending step to clients at any time.)
//
// Thread safety: Check and Stop may be called from any thread; Check calls are
// serialised.
#ifndef DEPOT_SERVER_STALL_MONITOR_H_
#define DEPOT_SERVER_STALL_MONITOR_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/job_store.h"
#include "server/metrics.h"

namespace depot {

class StallMonitor {
 public:
  // `jobs` and `metrics` must outlive the monitor. `log` receives one line
  // per stalled step (without a trailing newline). REQUIRES: threshold > 0.
  StallMonitor(JobStore* jobs, ServerMetrics* metrics, absl::Duration threshold,
               std::function<void(const std::string&)> log);
  // Stops the thread if it runs.
  ~StallMonitor();

  StallMonitor(const StallMonitor&) = delete;
  StallMonitor& operator=(const StallMonitor&) = delete;

  // Looks at every job once, as of `now`: sets the gauges, and logs and
  // counts each step that is newly stalled.
  void Check(std::chrono::steady_clock::time_point now);

  // Runs Check on a thread of its own every CheckInterval() until Stop.
  // REQUIRES: not running.
  void Start();
  // Ends that thread; idempotent.
  void Stop();

  // A quarter of the threshold, within [10 ms, 1 s]: a stall is noticed at
  // most a quarter threshold (or a second) late.
  absl::Duration CheckInterval() const;

 private:
  void Run();

  JobStore* const jobs_;
  ServerMetrics* const metrics_;
  const absl::Duration threshold_;
  const std::function<void(const std::string&)> log_;

  absl::Mutex check_mu_;
  // The step last reported stalled, by job id: each is logged once.
  std::map<uint64_t, uint64_t> reported_ ABSL_GUARDED_BY(check_mu_);

  absl::Mutex stop_mu_;
  bool stop_ ABSL_GUARDED_BY(stop_mu_) = false;
  std::thread thread_;
};

}  // namespace depot

#endif  // DEPOT_SERVER_STALL_MONITOR_H_
