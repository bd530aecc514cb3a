// ShardState's checkpoint captures: the shard's state copied at a step
// boundary, chunk by chunk as each chunk applies the step (EnableCaptures).
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/chunk_state.h"

#include "server/shard_state.h"

namespace depot {

void ShardState::EnableCaptures(CaptureHooks hooks) {
  absl::MutexLock lock(&capture_mu_);
  capture_every_.store(hooks.every_steps, std::memory_order_relaxed);
  capture_hooks_ = std::move(hooks);
}

void ShardState::ReleaseCapture(std::unique_ptr<ShardCheckpoint> capture) {
  std::vector<std::function<void()>> waiters;
  {
    absl::MutexLock lock(&capture_mu_);
    capture_spare_ = std::move(capture);
    capture_out_ = false;
    gate_step_.reset();
    waiters.swap(gate_waiters_);
  }
  for (const std::function<void()>& on_open : waiters) on_open();
}

bool ShardState::MayFinishStep(uint64_t step, std::function<void()> on_open) {
  absl::MutexLock lock(&capture_mu_);
  if (!gate_step_.has_value() ||
      step <= *gate_step_ + *capture_hooks_.max_lag_steps) {
    return true;
  }
  gate_waiters_.push_back(std::move(on_open));
  return false;
}

absl::StatusOr<std::unique_ptr<ShardCheckpoint>> ShardState::CaptureNow() {
  if (absl::Status s = CheckNotDeleted(); !s.ok()) return s;
  std::unique_ptr<ShardCheckpoint> capture;
  {
    absl::MutexLock lock(&capture_mu_);
    if (capture_ != nullptr || capture_out_) {
      return absl::UnavailableError(
          "a checkpoint of this job is being taken or written; try again "
          "once it is done");
    }
    capture = capture_spare_ != nullptr ? std::move(capture_spare_)
                                        : std::make_unique<ShardCheckpoint>();
    // Periodic captures skip while this one is out.
    capture_out_ = true;
  }
  const ShardRange& shard = shape_.shard();
  capture->config = shape_.config();
  capture->tenant = shape_.tenant();
  capture->fingerprint = shape_.fingerprint();
  capture->server_index = shape_.server_index();
  capture->chunks.resize(shard.num_chunks());
  std::optional<uint64_t> step;
  absl::Status status;
  for (uint64_t index = shard.first_chunk; index < shard.end_chunk; ++index) {
    ChunkState& chunk = chunk_state(index);
    absl::MutexLock lock(&chunk.mu);
    chunk.mu.Await(absl::Condition(&chunk, &ChunkState::ArraysFree));
    // Weights overrides alone belong to the next step and are not in it.
    if (chunk.pending() != nullptr && chunk.pending()->count > 0) {
      status = absl::FailedPreconditionError(absl::StrCat(
          "step ", chunk.applied_step + 1, " is in flight (chunk ", index,
          " holds contributions): take a checkpoint between steps"));
      break;
    }
    if (step.has_value() && chunk.applied_step != *step) {
      status = absl::FailedPreconditionError(absl::StrCat(
          "a step is half applied (chunk ", index, " is at step ",
          chunk.applied_step, ", earlier ones at ", *step,
          "): take a checkpoint between steps"));
      break;
    }
    step = chunk.applied_step;
    CopyChunk(index, chunk.applied_step, chunk.tensor_steps,
              capture->chunks[index - shard.first_chunk]);
  }
  if (status.ok() && !step.has_value()) {
    status = absl::FailedPreconditionError(
        "this server's shard of the job has no chunks: nothing to checkpoint");
  }
  if (!status.ok()) {
    ReleaseCapture(std::move(capture));
    return status;
  }
  capture->step = *step;
  return capture;
}

void ShardState::DropCapture(uint64_t imported_step) {
  absl::MutexLock lock(&capture_mu_);
  if (capture_ != nullptr) capture_spare_ = std::move(capture_);
  captured_chunks_ = 0;
  // Steps up to the imported one are over; the next capture step is later.
  capture_decided_step_ = imported_step;
}

void ShardState::CaptureChunk(uint64_t chunk_index, uint64_t step,
                              const std::vector<uint64_t>& tensor_steps) {
  const ShardRange& shard = shape_.shard();
  ChunkSnapshot* target = nullptr;
  std::function<void(uint64_t)> on_skipped;
  {
    absl::MutexLock lock(&capture_mu_);
    if (capture_ != nullptr && capture_->step == step) {
      target = &capture_->chunks[chunk_index - shard.first_chunk];
    } else if (step > capture_decided_step_) {
      // The first chunk of the step decides for the whole shard.
      capture_decided_step_ = step;
      if (capture_ != nullptr || capture_out_) {
        on_skipped = capture_hooks_.on_skipped;
      } else {
        capture_ = capture_spare_ != nullptr
                       ? std::move(capture_spare_)
                       : std::make_unique<ShardCheckpoint>();
        capture_->config = shape_.config();
        capture_->tenant = shape_.tenant();
        capture_->fingerprint = shape_.fingerprint();
        capture_->server_index = shape_.server_index();
        capture_->step = step;
        capture_->chunks.resize(shard.num_chunks());
        captured_chunks_ = 0;
        target = &capture_->chunks[chunk_index - shard.first_chunk];
      }
    }
  }
  if (on_skipped) on_skipped(step);
  if (target == nullptr) return;
  // Outside the lock: chunks are copied in parallel, each into its own
  // entry, and the capture is not handed on before every copy is counted.
  CopyChunk(chunk_index, step, tensor_steps, *target);
  std::unique_ptr<ShardCheckpoint> complete;
  std::function<void(std::unique_ptr<ShardCheckpoint>)> on_captured;
  {
    absl::MutexLock lock(&capture_mu_);
    if (++captured_chunks_ < shard.num_chunks()) return;
    complete = std::move(capture_);
    capture_out_ = true;
    if (capture_hooks_.max_lag_steps.has_value()) gate_step_ = step;
    on_captured = capture_hooks_.on_captured;
  }
  on_captured(std::move(complete));
}

}  // namespace depot
