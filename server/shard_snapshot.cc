// ShardState's whole-state export and import (ExportState / ImportState).
#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/chunk_state.h"
#include "server/crc32c.h"
#include "server/shard_state.h"

namespace depot {

absl::Status ShardState::ExportChunks(
    const std::function<bool(ChunkSnapshot)>& emit) const {
  return ExportChunks({}, emit);
}

absl::Status ShardState::ExportChunks(
    const std::vector<uint64_t>& only,
    const std::function<bool(ChunkSnapshot)>& emit) const {
  if (absl::Status s = CheckNotDeleted(); !s.ok()) return s;
  const ShardRange& shard = shape_.shard();
  std::vector<uint64_t> indices = only;
  if (indices.empty()) {
    for (uint64_t index = shard.first_chunk; index < shard.end_chunk; ++index) {
      indices.push_back(index);
    }
  }
  // Checked whole before the first chunk goes out.
  std::vector<bool> listed(shard.num_chunks(), false);
  for (const uint64_t index : indices) {
    if (index < shard.first_chunk || index >= shard.end_chunk) {
      return absl::OutOfRangeError(absl::StrCat(
          "chunk ", index, " is not in this server's shard: chunks [",
          shard.first_chunk, ", ", shard.end_chunk, ")"));
    }
    if (listed[index - shard.first_chunk]) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", index, " is listed twice"));
    }
    listed[index - shard.first_chunk] = true;
  }
  for (const uint64_t index : indices) {
    ChunkSnapshot snapshot;
    {
      ChunkState& chunk = chunk_state(index);
      absl::MutexLock lock(&chunk.mu);
      chunk.mu.Await(absl::Condition(&chunk, &ChunkState::ArraysFree));
      CopyChunk(index, chunk.applied_step, chunk.tensor_steps, snapshot);
      snapshot.lacks_worker_state = chunk.lacks_worker_state;
    }
    if (!emit(std::move(snapshot))) {
      return absl::CancelledError("the client stopped reading the state");
    }
  }
  return absl::OkStatus();
}

void ShardState::CopyChunk(uint64_t index, uint64_t applied_step,
                           const std::vector<uint64_t>& tensor_steps,
                           ChunkSnapshot& out) const {
  const ChunkRange range = shape_.plan().chunk(index);
  out.index = index;
  out.applied_step = applied_step;
  out.tensor_steps = tensor_steps;
  out.optimizer_step = 0;
  for (const uint64_t count : tensor_steps) {
    out.optimizer_step = std::max(out.optimizer_step, count);
  }
  // Copied and checksummed in one pass: the checkpoint writer then only
  // streams the bytes to the file.
  out.master.resize(range.size() * sizeof(float));
  uint32_t crc =
      Crc32cCopyExtend(0, out.master.data(), master(range), out.master.size());
  out.slots.resize(shape_.slots());
  for (int k = 0; k < shape_.slots(); ++k) {
    out.slots[k].resize(range.size() * slot_elem_bytes_[k]);
    crc = Crc32cCopyExtend(crc, out.slots[k].data(), slot(k, range.begin),
                           out.slots[k].size());
  }
  out.payload_crc = crc;
}

absl::Status ShardState::CheckSnapshot(ChunkSnapshot& snapshot) const {
  if (absl::Status s = CheckChunkPayload(snapshot.index, snapshot.master.size(),
                                         sizeof(float));
      !s.ok()) {
    return s;
  }
  if (snapshot.slots.size() != static_cast<size_t>(shape_.slots())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", snapshot.index, " has ", snapshot.slots.size(),
        " optimizer slots, the job's optimizer has ", shape_.slots()));
  }
  for (int k = 0; k < shape_.slots(); ++k) {
    if (absl::Status s = CheckChunkPayload(
            snapshot.index, snapshot.slots[k].size(), slot_elem_bytes_[k]);
        !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer slot ", k, ": ", s.message()));
    }
  }
  const size_t segments =
      shape_.layout()
          .SegmentsIn(shape_.plan().chunk(snapshot.index).begin,
                      shape_.plan().chunk(snapshot.index).end)
          .size();
  if (snapshot.tensor_steps.empty()) {
    // A state saved before per-tensor counts: one count for the chunk.
    snapshot.tensor_steps.assign(segments, snapshot.optimizer_step);
  } else if (snapshot.tensor_steps.size() != segments) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", snapshot.index, " has ", snapshot.tensor_steps.size(),
        " tensor step counts, it holds ", segments, " tensor segments"));
  }
  if (snapshot.applied_step > kMaxStep) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", snapshot.index, " is at step ", snapshot.applied_step,
        ", beyond the largest step a job may reach (", kMaxStep, ")"));
  }
  for (const uint64_t count : snapshot.tensor_steps) {
    if (count > snapshot.applied_step) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", snapshot.index, ": optimizer step ", count,
                       " is above its applied step ", snapshot.applied_step));
    }
  }
  return absl::OkStatus();
}

absl::Status ShardState::StageSnapshots(
    std::vector<ChunkSnapshot>& chunks,
    std::vector<ChunkSnapshot*>& staged) const {
  const ShardRange& shard = shape_.shard();
  staged.assign(shard.num_chunks(), nullptr);
  for (ChunkSnapshot& snapshot : chunks) {
    if (absl::Status s = CheckSnapshot(snapshot); !s.ok()) return s;
    ChunkSnapshot*& slot_for_chunk = staged[snapshot.index - shard.first_chunk];
    if (slot_for_chunk != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", snapshot.index, " was sent twice"));
    }
    slot_for_chunk = &snapshot;
  }
  return absl::OkStatus();
}

absl::Status ShardState::ImportChunks(std::vector<ChunkSnapshot> chunks) {
  if (absl::Status s = CheckNotDeleted(); !s.ok()) return s;
  const ShardRange& shard = shape_.shard();
  // Staged by chunk: every chunk must come exactly once.
  std::vector<ChunkSnapshot*> staged;
  if (absl::Status s = StageSnapshots(chunks, staged); !s.ok()) return s;
  if (chunks.size() != shard.num_chunks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the state has ", chunks.size(), " chunks, the shard ",
                     shard.num_chunks(), ": every chunk must be sent"));
  }
  // A step is applied to every chunk before the next starts, so a state saved
  // between steps has one applied step.
  const uint64_t step = chunks.empty() ? 0 : chunks.front().applied_step;
  for (const ChunkSnapshot& snapshot : chunks) {
    if (snapshot.applied_step != step) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", snapshot.index, " is at step ",
                       snapshot.applied_step, ", chunk ", chunks.front().index,
                       " at step ", step, ": save the state between steps"));
    }
  }

  // The check of pending contributions and the replacement are one atomic
  // change.
  const absl::Status status = WithEveryChunkIdle("import", [&] {
    for (uint64_t index = shard.first_chunk; index < shard.end_chunk; ++index) {
      const ChunkSnapshot& snapshot = *staged[index - shard.first_chunk];
      ChunkState& chunk = chunk_state(index);
      WriteChunk(snapshot);
      chunk.applied_step = snapshot.applied_step;
      // Weights of the history the import replaced: pulls read the imported
      // step from the master, and the chunk's next update starts a history.
      chunk.last = KeptWeights();
      chunk.before = KeptWeights();
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  DropCapture(step);
  absl::MutexLock lock(&steps_mu_);
  completed_step_ = step;
  // Headers of steps the imported state has passed or not yet reached no
  // longer describe it.
  steps_.clear();
  return absl::OkStatus();
}

absl::Status ShardState::PatchChunks(std::vector<ChunkSnapshot> chunks) {
  if (absl::Status s = CheckNotDeleted(); !s.ok()) return s;
  const ShardRange& shard = shape_.shard();
  std::vector<ChunkSnapshot*> staged;
  if (absl::Status s = StageSnapshots(chunks, staged); !s.ok()) return s;
  if (shard.num_chunks() == 0) return absl::OkStatus();  // nothing was sent
  // As for an import; and the shard's step is the step of all its chunks
  // only while none can move.
  return WithEveryChunkIdle("patch", [&] {
    const uint64_t step = chunk_state(shard.first_chunk).applied_step;
    for (uint64_t index = shard.first_chunk; index < shard.end_chunk; ++index) {
      if (chunk_state(index).applied_step != step) {
        return absl::FailedPreconditionError(absl::StrCat(
            "chunk ", index, " is at step ", chunk_state(index).applied_step,
            ", chunk ", shard.first_chunk, " at step ", step,
            ": patch the state only while no step is in flight"));
      }
    }
    for (const ChunkSnapshot& snapshot : chunks) {
      if (snapshot.applied_step != step) {
        return absl::FailedPreconditionError(absl::StrCat(
            "chunk ", snapshot.index, " of the patch is of step ",
            snapshot.applied_step, " and the shard is at step ", step,
            ": a patch replaces the state at the shard's own step"));
      }
    }
    // The step and the weights kept for pulls of earlier steps stay: the
    // history is the same, only the state at its last step changed.
    for (const ChunkSnapshot& snapshot : chunks) WriteChunk(snapshot);
    return absl::OkStatus();
  });
}

absl::Status ShardState::WithEveryChunkIdle(
    absl::string_view verb, const std::function<absl::Status()>& body) {
  const ShardRange& shard = shape_.shard();
  for (uint64_t index = shard.first_chunk; index < shard.end_chunk; ++index) {
    chunk_state(index).mu.Lock();
  }
  absl::Status status;
  for (uint64_t index = shard.first_chunk; index < shard.end_chunk; ++index) {
    const ChunkState& chunk = chunk_state(index);
    if (chunk.phase() != ChunkPhase::kIdle) {
      status = absl::FailedPreconditionError(
          absl::StrCat("chunk ", index, " has contributions for step ",
                       chunk.applied_step + 1, ": ", verb,
                       " the state only while no step is in flight"));
      break;
    }
  }
  if (status.ok()) status = body();
  for (uint64_t index = shard.end_chunk; index > shard.first_chunk; --index) {
    chunk_state(index - 1).mu.Unlock();
  }
  return status;
}

void ShardState::WriteChunk(const ChunkSnapshot& snapshot) {
  const ChunkRange range = shape_.plan().chunk(snapshot.index);
  std::memcpy(master(range), snapshot.master.data(), snapshot.master.size());
  for (int k = 0; k < shape_.slots(); ++k) {
    std::memcpy(slot(k, range.begin), snapshot.slots[k].data(),
                snapshot.slots[k].size());
  }
  chunk_state(snapshot.index).tensor_steps = snapshot.tensor_steps;
  chunk_state(snapshot.index).lacks_worker_state = snapshot.lacks_worker_state;
}

}  // namespace depot
