// ShardState's checkpoint captures: the shard's state copied at a step
// boundary, chunk by chunk as each chunk applies the step (EnableCaptures).
#include <algorithm>
#include <cstring>
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
    if (capture_ != nullptr && capture_waiting_ > 0 &&
        captured_chunks_ == shape_.shard().num_chunks()) {
      // Whole but for the workers' state: this capture, of the shard's
      // step now, takes its place.
      capture_spare_ = std::move(capture_);
      capture_waiting_ = 0;
    }
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
    ChunkSnapshot& copy = capture->chunks[index - shard.first_chunk];
    CopyChunk(index, chunk.applied_step, chunk.tensor_steps, copy);
    copy.lacks_worker_state = chunk.lacks_worker_state;
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
  std::vector<std::function<void()>> waiters;
  {
    absl::MutexLock lock(&capture_mu_);
    if (capture_ != nullptr) capture_spare_ = std::move(capture_);
    captured_chunks_ = 0;
    capture_waiting_ = 0;
    // Steps up to the imported one are over; the next capture step is later.
    capture_decided_step_ = imported_step;
    // A capture that waited for the workers' state held the gate.
    if (!capture_out_) {
      gate_step_.reset();
      waiters.swap(gate_waiters_);
    }
  }
  for (const std::function<void()>& on_open : waiters) on_open();
}

bool ShardState::CaptureChunk(uint64_t chunk_index, uint64_t step,
                              const std::vector<uint64_t>& tensor_steps,
                              bool lacks_worker_state, bool waits,
                              const std::string& sum_only) {
  const ShardRange& shard = shape_.shard();
  ChunkSnapshot* target = nullptr;
  std::function<void(uint64_t)> on_skipped;
  std::function<void()> hand_on;
  {
    absl::MutexLock lock(&capture_mu_);
    if (capture_ != nullptr && capture_->step == step) {
      target = &capture_->chunks[chunk_index - shard.first_chunk];
    } else if (step > capture_decided_step_) {
      // The first chunk of the step decides for the whole shard.
      capture_decided_step_ = step;
      if (capture_ != nullptr && capture_waiting_ > 0 &&
          captured_chunks_ == shard.num_chunks()) {
        // The workers' state of the last capture never came: it goes as
        // it is, its waiting chunks marked as lacking it (they are).
        capture_waiting_ = 0;
        hand_on = HandOnIfWhole();
      }
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
        capture_waits_.assign(shard.num_chunks(), false);
        capture_waiting_ = 0;
        capture_sum_only_ = sum_only;
        target = &capture_->chunks[chunk_index - shard.first_chunk];
      }
    }
  }
  if (hand_on) hand_on();
  if (on_skipped) on_skipped(step);
  if (target == nullptr) return false;
  // Outside the lock: chunks are copied in parallel, each into its own
  // entry, and the capture is not handed on before every copy is counted.
  CopyChunk(chunk_index, step, tensor_steps, *target);
  target->lacks_worker_state = lacks_worker_state;
  {
    absl::MutexLock lock(&capture_mu_);
    if (waits) {
      capture_waits_[chunk_index - shard.first_chunk] = true;
      ++capture_waiting_;
    }
    // Complete: the gate holds later steps from now on, also while the
    // capture waits for the workers' state (MayFinishStep).
    if (++captured_chunks_ == shard.num_chunks() &&
        capture_hooks_.max_lag_steps.has_value()) {
      gate_step_ = step;
    }
    hand_on = HandOnIfWhole();
  }
  if (hand_on) hand_on();
  return waits;
}

std::function<void()> ShardState::HandOnIfWhole() {
  if (capture_ == nullptr || capture_waiting_ > 0 ||
      captured_chunks_ < shape_.shard().num_chunks()) {
    return nullptr;
  }
  capture_out_ = true;
  auto complete =
      std::make_shared<std::unique_ptr<ShardCheckpoint>>(std::move(capture_));
  return [on_captured = capture_hooks_.on_captured, complete] {
    on_captured(std::move(*complete));
  };
}

absl::Status ShardState::PatchCapture(uint64_t step,
                                      std::vector<ChunkSnapshot> chunks) {
  if (absl::Status s = CheckNotDeleted(); !s.ok()) return s;
  const ShardRange& shard = shape_.shard();
  std::vector<ChunkSnapshot*> staged;
  if (absl::Status s = StageSnapshots(chunks, staged); !s.ok()) return s;
  std::function<void()> hand_on;
  {
    absl::MutexLock lock(&capture_mu_);
    if (capture_ == nullptr || capture_->step != step ||
        (capture_waiting_ == 0 && !chunks.empty())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "no checkpoint capture of step ", step,
          " waits for the workers' state on this server (it was written "
          "without it, dropped, or never taken)"));
    }
    for (const ChunkSnapshot& snapshot : chunks) {
      if (!capture_waits_[snapshot.index - shard.first_chunk]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the capture of step ", step, " does not wait for chunk ",
            snapshot.index,
            ": it holds none of the step's sum-only tensors, or was sent "
            "already"));
      }
      if (snapshot.applied_step != step) {
        return absl::InvalidArgumentError(absl::StrCat(
            "chunk ", snapshot.index, " of the capture's patch is of step ",
            snapshot.applied_step, ", the capture of step ", step));
      }
    }
    // Checked whole: now the elements of the sum-only tensors, and their
    // counts, into the capture's copies.
    for (const ChunkSnapshot& snapshot : chunks) {
      const ChunkRange range = shape_.plan().chunk(snapshot.index);
      ChunkSnapshot& copy =
          capture_->chunks[snapshot.index - shard.first_chunk];
      const std::vector<Segment> segments =
          shape_.layout().SegmentsIn(range.begin, range.end);
      for (size_t i = 0; i < segments.size(); ++i) {
        if (!LacksGradient(capture_sum_only_, segments[i].tensor_index)) {
          continue;
        }
        const uint64_t at = segments[i].begin - range.begin;
        const uint64_t n = segments[i].end - segments[i].begin;
        std::memcpy(copy.master.data() + at * sizeof(float),
                    snapshot.master.data() + at * sizeof(float),
                    n * sizeof(float));
        for (int k = 0; k < shape_.slots(); ++k) {
          std::memcpy(copy.slots[k].data() + at * slot_elem_bytes_[k],
                      snapshot.slots[k].data() + at * slot_elem_bytes_[k],
                      n * slot_elem_bytes_[k]);
        }
        copy.tensor_steps[i] = snapshot.tensor_steps[i];
      }
      copy.optimizer_step = 0;
      for (const uint64_t count : copy.tensor_steps) {
        copy.optimizer_step = std::max(copy.optimizer_step, count);
      }
      copy.payload_crc.reset();  // the bytes changed: the writer sums them
      copy.lacks_worker_state = false;
      capture_waits_[snapshot.index - shard.first_chunk] = false;
      --capture_waiting_;
    }
    hand_on = HandOnIfWhole();
  }
  if (hand_on) hand_on();
  return absl::OkStatus();
}

}  // namespace depot
