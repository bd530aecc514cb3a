#include "server/stall_monitor.h"

#include <algorithm>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "depot/step_wait.h"

namespace depot {

StallMonitor::StallMonitor(JobStore* jobs, ServerMetrics* metrics,
                           absl::Duration threshold,
                           std::function<void(const std::string&)> log)
    : jobs_(jobs),
      metrics_(metrics),
      threshold_(threshold),
      log_(std::move(log)) {}

StallMonitor::~StallMonitor() { Stop(); }

absl::Duration StallMonitor::CheckInterval() const {
  return std::clamp(threshold_ / 4, absl::Milliseconds(10), absl::Seconds(1));
}

void StallMonitor::Check(std::chrono::steady_clock::time_point now) {
  absl::MutexLock lock(&check_mu_);
  double stalled = 0;
  double missing = 0;
  double longest_wait = 0;
  std::set<uint64_t> live_jobs;
  for (const std::shared_ptr<ShardState>& shard : jobs_->Jobs()) {
    live_jobs.insert(shard->job_id());
    const PendingStepReport pending = shard->OldestPendingStep();
    if (pending.step == 0 || pending.missing_workers.empty()) continue;
    const double waited =
        std::chrono::duration<double>(now - pending.since).count();
    if (waited < absl::ToDoubleSeconds(threshold_)) continue;
    ++stalled;
    missing += static_cast<double>(pending.missing_workers.size());
    longest_wait = std::max(longest_wait, waited);
    auto [it, first_time] = reported_.try_emplace(shard->job_id(), 0);
    if (!first_time && it->second == pending.step) continue;
    it->second = pending.step;
    const JobConfig& config = shard->shape().config();
    log_(absl::StrFormat(
        "job %d \"%s\": step %d is stalled: it has waited %.1f s for %s to "
        "send their gradients (is every worker running, each with its own "
        "rank? A worker that is a node needs every one of its local ranks)",
        shard->job_id(), config.name, pending.step, waited,
        DescribeWorkerRanks(pending.missing_workers, config.num_workers)));
    // After the log: whoever sees the count can find the line.
    metrics_->step_stalls.Increment();
  }
  // Deleted jobs need no memory of their last report.
  std::erase_if(reported_, [&](const std::pair<const uint64_t, uint64_t>& e) {
    return live_jobs.count(e.first) == 0;
  });
  metrics_->stalled_steps.Set(stalled);
  metrics_->stalled_step_missing_workers.Set(missing);
  metrics_->stalled_step_wait_seconds.Set(longest_wait);
}

void StallMonitor::Start() {
  {
    absl::MutexLock lock(&stop_mu_);
    stop_ = false;
  }
  thread_ = std::thread([this] { Run(); });
}

void StallMonitor::Stop() {
  {
    absl::MutexLock lock(&stop_mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void StallMonitor::Run() {
  const absl::Duration interval = CheckInterval();
  while (true) {
    {
      absl::MutexLock lock(&stop_mu_);
      if (stop_mu_.AwaitWithTimeout(absl::Condition(&stop_), interval)) return;
    }
    Check(std::chrono::steady_clock::now());
  }
}

}  // namespace depot
