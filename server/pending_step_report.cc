// ShardState::OldestPendingStep: which step a shard waits on and for which
// workers, for GetJob and the server's stalled-step check (stall_monitor.h).
#include <cstdint>
#include <vector>

#include "server/chunk_state.h"
#include "server/shard_state.h"

namespace depot {

PendingStepReport ShardState::OldestPendingStep() const {
  const uint32_t workers = shape_.config().num_workers;
  PendingStepReport report;
  std::vector<bool> missing(workers, false);
  const ShardRange& shard = shape_.shard();
  for (uint64_t index = shard.first_chunk; index < shard.end_chunk; ++index) {
    ChunkState& chunk = chunk_state(index);
    absl::MutexLock lock(&chunk.mu);
    const PendingStep* pending = chunk.pending();
    if (pending == nullptr) continue;
    // A chunk's contributions are always for the step after its applied one.
    const uint64_t step = chunk.applied_step + 1;
    if (report.step != 0 && step > report.step) continue;
    if (step < report.step || report.step == 0) {
      report.step = step;
      missing.assign(workers, false);
    }
    for (uint32_t rank = 0; rank < workers; ++rank) {
      if (!pending->present[rank]) missing[rank] = true;
    }
  }
  if (report.step == 0) return report;
  for (uint32_t rank = 0; rank < workers; ++rank) {
    if (missing[rank]) report.missing_workers.push_back(rank);
  }
  absl::MutexLock lock(&steps_mu_);
  auto it = steps_.find(report.step);
  // Every contribution's step had a header, which recorded the step, and a
  // pending step is never forgotten; "now" only guards that bookkeeping.
  report.since = it != steps_.end() && it->second.started
                     ? it->second.first_contribution
                     : std::chrono::steady_clock::now();
  return report;
}

}  // namespace depot
