// ShardState's part of a rollback (the RollBack RPC, docs/checkpoints.md
// "Rolling back"): keep new contributions out, drop those in flight, report
// where the chunks stand. Restoring a checkpoint is ImportChunks
// (shard_snapshot.cc).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/chunk_state.h"
#include "server/shard_state.h"

namespace depot {

void ShardState::BeginRollBack() { rollback_mu_.Lock(); }

void ShardState::EndRollBack() { rollback_mu_.Unlock(); }

void ShardState::ScheduleTask(std::function<void()> task) {
  {
    absl::MutexLock lock(&tasks_mu_);
    ++tasks_running_;
  }
  pool_->Schedule([this, task = std::move(task)] {
    task();
    absl::MutexLock lock(&tasks_mu_);
    --tasks_running_;
  });
}

uint64_t ShardState::DropInFlight() {
  const ShardRange& shard = shape_.shard();
  uint64_t dropped = 0;
  {
    // Nothing new is scheduled while the rollback holds rollback_mu_.
    absl::MutexLock lock(&tasks_mu_);
    const auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(tasks_mu_) {
      return tasks_running_ == 0;
    };
    tasks_mu_.Await(absl::Condition(&idle));
  }
  for (uint64_t index = shard.first_chunk; index < shard.end_chunk; ++index) {
    ChunkState& chunk = chunk_state(index);
    std::unique_ptr<PendingStep> pending;
    {
      absl::MutexLock lock(&chunk.mu);
      // An update owns the chunk until it is done, and a two-phase sum owns
      // the payloads until its sum is kept (server/chunk_phase.h).
      chunk.mu.Await(absl::Condition(&chunk, &ChunkState::NoTaskOwnsIt));
      pending = chunk.Drop();
    }
    if (pending == nullptr) continue;
    dropped += pending->count;
    uint64_t held = TotalBytes(pending->payloads) + pending->summed.size();
    for (const std::vector<WeightsPiece>& pieces : pending->overrides) {
      for (const WeightsPiece& piece : pieces) held += piece.payload.size();
    }
    Unhold(held);
    payload_bytes_.fetch_sub(TotalBytes(pending->payloads),
                             std::memory_order_relaxed);
    GiveBack(pending->payloads);
    if (!pending->summed.empty()) payloads_->Give(std::move(pending->summed));
  }
  absl::MutexLock lock(&steps_mu_);
  // The headers of the steps in flight no longer describe anything.
  steps_.erase(steps_.upper_bound(completed_step_), steps_.end());
  return dropped;
}

uint64_t ShardState::newest_step() const {
  const ShardRange& shard = shape_.shard();
  uint64_t newest = 0;
  for (uint64_t index = shard.first_chunk; index < shard.end_chunk; ++index) {
    ChunkState& chunk = chunk_state(index);
    absl::MutexLock lock(&chunk.mu);
    newest = std::max(newest, chunk.applied_step);
  }
  return newest;
}

}  // namespace depot
