// ShardState's reads of the weights (PullWeights) at one step.
//
// A shard's chunks cross a step boundary one by one: while a step waits for a
// worker, the chunks every worker has sent are already updated and the others
// are not. A pull that read each chunk as it stands would mix two steps. A
// worker restarted in the middle of a step (docs/protocol.md, "A worker that
// rejoins") computes its gradient of the step from what it pulls, and the
// gradient of a chunk depends on the whole model: a mixed pull made it
// diverge from its peers (issue 12).
//
// So a pull names a step and reads every chunk at it: a chunk at the step
// from its master weights, a chunk one step ahead from the weights its update
// of the step produced. Those are the answer buffers the updates already
// write (weight dtype) and share with the Step streams; each chunk keeps the
// last two (RunUpdate), which costs no copy and no memory traffic in the
// update, only their memory: 2 * weight dtype size bytes per element, counted
// in the job's budget (JobShape::kept_weights_bytes).
#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/chunk_state.h"
#include "server/shard_state.h"

namespace depot {

absl::StatusOr<std::string> ShardState::EncodeWeightsAt(uint64_t index,
                                                        uint64_t begin,
                                                        uint64_t end,
                                                        DType dtype,
                                                        uint64_t at) const {
  const ChunkState& chunk = chunk_state(index);
  chunk.mu.AssertHeld();
  // noop_update: the master weights never change, and none are kept.
  if (chunk.applied_step == at || noop_update_) {
    return EncodeMaster(begin, end, dtype);
  }
  if (chunk.applied_step < at) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", at, " has not been applied yet: chunk ", index,
                     " is at step ", chunk.applied_step,
                     " (pull at a step every server reports in GetJob)"));
  }
  const KeptWeights& kept = chunk.before;
  if (chunk.applied_step != at + 1 || kept.weights == nullptr ||
      kept.step != at) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", at, " is no longer held: the job is at step ",
        chunk.applied_step, " on chunk ", index,
        " (a server keeps each chunk's weights of the step before its last "
        "one, and none from before a restore or an import)"));
  }
  const DType weight_dtype = shape_.config().weight_dtype;
  const uint64_t first = begin - shape_.plan().chunk(index).begin;
  if (dtype == weight_dtype) {
    const size_t size = DTypeSize(dtype);
    return kept.weights->substr(first * size, (end - begin) * size);
  }
  if (weight_dtype != DType::kFloat32) {
    const std::string name(DTypeName(weight_dtype));
    return absl::FailedPreconditionError(
        absl::StrCat("chunk ", index, " holds step ", at, " only as ", name,
                     " (the job's weight dtype; it is at step ",
                     chunk.applied_step, "): pull that step as ", name));
  }
  // fp32 weights are the master weights: any dtype encodes from them as
  // from the master.
  std::string payload((end - begin) * DTypeSize(dtype), '\0');
  EncodeWeights(reinterpret_cast<const float*>(kept.weights->data()) + first,
                end - begin, {dtype, payload.data()});
  return payload;
}

absl::Status ShardState::ReadWeights(
    uint64_t begin, uint64_t end, DType dtype, uint64_t step,
    const std::function<bool(uint64_t offset, std::string payload)>& emit)
    const {
  const ShardRange& shard = shape_.shard();
  if (begin > end || begin < shard.begin || end > shard.end) {
    return absl::OutOfRangeError(absl::StrCat(
        "range [", begin, ", ", end, ") is not inside this server's shard [",
        shard.begin, ", ", shard.end, ")"));
  }
  const uint64_t at = step != 0 ? step : completed_step();
  const ShardPlan& plan = shape_.plan();
  for (uint64_t pos = begin; pos < end;) {
    const uint64_t index = pos / plan.chunk_elems();
    const uint64_t piece_end = std::min(end, plan.chunk(index).end);
    absl::StatusOr<std::string> payload;
    {
      ChunkState& chunk = chunk_state(index);
      absl::MutexLock lock(&chunk.mu);
      chunk.mu.Await(absl::Condition(&chunk, &ChunkState::ArraysFree));
      payload = EncodeWeightsAt(index, pos, piece_end, dtype, at);
    }
    if (!payload.ok()) return payload.status();
    if (!emit(pos, *std::move(payload))) {
      return absl::CancelledError("the client stopped reading the weights");
    }
    pos = piece_end;
  }
  return absl::OkStatus();
}

}  // namespace depot
