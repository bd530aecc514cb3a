#include "server/shard_state.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "server/checksum.h"
#include "server/chunk_state.h"
#include "server/step_hparams.h"

namespace depot {
namespace {

// Bytes from the start of a state array of `elems` elements of `elem_size`
// bytes to the next array: rounded up so that every array starts on a 64-byte
// boundary. REQUIRES: no overflow (Create checks).
size_t ArrayBytes(uint64_t elems, size_t elem_size) {
  constexpr size_t kLine = AlignedBuffer::kAlignment;
  return (elems * elem_size + kLine - 1) / kLine * kLine;
}

// The byte offset of each state array in the job's one buffer: the fp32 master
// weights first, then each slot in its own dtype (OptimizerSlotDType).
struct StateArrays {
  size_t slot_offset[2] = {0, 0};
  size_t total_bytes = 0;
};

StateArrays PlanStateArrays(uint64_t shard_elems,
                            const OptimizerConfig& config) {
  StateArrays arrays;
  arrays.total_bytes = ArrayBytes(shard_elems, sizeof(float));
  for (int k = 0; k < OptimizerStateSlots(config); ++k) {
    arrays.slot_offset[k] = arrays.total_bytes;
    arrays.total_bytes +=
        ArrayBytes(shard_elems, DTypeSize(OptimizerSlotDType(config, k)));
  }
  return arrays;
}

// Writes zeros to the elements of [range.begin, range.end) that belong to no
// tensor. `data` holds the range's elements.
void ZeroPadding(const Layout& layout, const ChunkRange& range, float* data) {
  uint64_t pos = range.begin;
  for (const Segment& segment : layout.SegmentsIn(range.begin, range.end)) {
    std::fill(data + (pos - range.begin), data + (segment.begin - range.begin),
              0.0f);
    pos = segment.end;
  }
  std::fill(data + (pos - range.begin), data + range.size(), 0.0f);
}

}  // namespace

absl::StatusOr<std::shared_ptr<ShardState>> ShardState::Create(
    uint64_t job_id, JobShape shape, ThreadPool* pool,
    std::shared_ptr<PayloadPool> payloads, ServerMetrics* metrics,
    bool noop_update) {
  const uint64_t arrays = 1 + static_cast<uint64_t>(shape.slots());
  const uint64_t shard_elems = shape.shard().size();
  // Each array may round up by less than a line.
  const uint64_t max_elems =
      (std::numeric_limits<size_t>::max() -
       arrays * AlignedBuffer::kAlignment) /
      OptimizerStateBytesPerParam(shape.config().optimizer);
  if (shard_elems > max_elems) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a shard of ", shard_elems, " elements does not fit in memory"));
  }
  absl::StatusOr<AlignedBuffer> state = AlignedBuffer::Allocate(
      PlanStateArrays(shard_elems, shape.config().optimizer).total_bytes);
  if (!state.ok()) return state.status();
  std::shared_ptr<ShardState> shard(
      new ShardState(job_id, std::move(shape), *std::move(state), pool,
                     std::move(payloads), metrics, noop_update));
  // Before any other method can run: InitChunk and the updates then only ever
  // see the initial values (Adagrad's state_sum starts at its accumulator).
  const ShardRange& range = shard->shape_.shard();
  absl::BlockingCounter touched(static_cast<int>(range.num_chunks()));
  for (uint64_t index = range.first_chunk; index < range.end_chunk; ++index) {
    pool->Schedule([&shard = *shard, &touched, index] {
      shard.InitChunkState(index);
      touched.DecrementCount();
    });
  }
  touched.Wait();
  return shard;
}

ShardState::ShardState(uint64_t job_id, JobShape shape, AlignedBuffer state,
                       ThreadPool* pool, std::shared_ptr<PayloadPool> payloads,
                       ServerMetrics* metrics, bool noop_update)
    : job_id_(job_id),
      shape_(std::move(shape)),
      state_(std::move(state)),
      kernel_(MakeOptimizerKernel(shape_.config().optimizer)),
      pool_(pool),
      payloads_(std::move(payloads)),
      metrics_(metrics),
      noop_update_(noop_update),
      chunks_(new ChunkState[shape_.shard().num_chunks()]) {
  const OptimizerConfig& optimizer = shape_.config().optimizer;
  const StateArrays arrays = PlanStateArrays(shape_.shard().size(), optimizer);
  for (int k = 0; k < shape_.slots(); ++k) {
    slot_begin_[k] =
        static_cast<unsigned char*>(state_.data()) + arrays.slot_offset[k];
    slot_elem_bytes_[k] = DTypeSize(OptimizerSlotDType(optimizer, k));
  }
}

void ShardState::InitChunkState(uint64_t chunk_index) {
  const ChunkRange range = shape_.plan().chunk(chunk_index);
  ParamRun run;
  run.master = master(range);
  std::fill(run.master, run.master + range.size(), 0.0f);
  for (int k = 0; k < shape_.slots(); ++k) {
    run.slots[k] = slot(k, range.begin);
    std::memset(run.slots[k], 0, range.size() * slot_elem_bytes_[k]);
  }
  run.n = range.size();
  InitOptimizerSlots(shape_.config().optimizer, run);
}

ShardState::~ShardState() = default;

absl::Status ShardState::CheckNotDeleted() const {
  if (deleted_.load(std::memory_order_acquire)) {
    return absl::AbortedError(absl::StrCat("job ", job_id_, " was deleted"));
  }
  return absl::OkStatus();
}

absl::Status ShardState::CheckChunkPayload(uint64_t chunk_index,
                                           size_t payload_bytes,
                                           size_t dtype_size) const {
  const ShardRange& shard = shape_.shard();
  if (chunk_index < shard.first_chunk || chunk_index >= shard.end_chunk) {
    return absl::OutOfRangeError(absl::StrCat(
        "chunk ", chunk_index, " is not in this server's shard: chunks [",
        shard.first_chunk, ", ", shard.end_chunk, ")"));
  }
  const uint64_t expected =
      shape_.plan().chunk(chunk_index).size() * dtype_size;
  if (payload_bytes != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", chunk_index, ": payload has ", payload_bytes,
                     " bytes, expected ", expected));
  }
  return absl::OkStatus();
}

ShardState::ChunkState& ShardState::chunk_state(uint64_t chunk_index) const {
  return chunks_[chunk_index - shape_.shard().first_chunk];
}

float* ShardState::master(const ChunkRange& chunk) const {
  return static_cast<float*>(state_.data()) +
         (chunk.begin - shape_.shard().begin);
}

void* ShardState::slot(int k, uint64_t index) const {
  return slot_begin_[k] + (index - shape_.shard().begin) * slot_elem_bytes_[k];
}

std::string ShardState::EncodeMaster(uint64_t begin, uint64_t end,
                                     DType dtype) const {
  std::string payload((end - begin) * DTypeSize(dtype), '\0');
  EncodeMasterInto(begin, end, dtype, payload.data());
  return payload;
}

void ShardState::EncodeMasterInto(uint64_t begin, uint64_t end, DType dtype,
                                  void* out) const {
  const float* src =
      static_cast<const float*>(state_.data()) + (begin - shape_.shard().begin);
  EncodeWeights(src, end - begin, {dtype, out});
}

absl::Status ShardState::InitChunk(uint64_t chunk_index, DType dtype,
                                   std::string_view payload) {
  if (absl::Status s = CheckNotDeleted(); !s.ok()) return s;
  if (absl::Status s =
          CheckChunkPayload(chunk_index, payload.size(), DTypeSize(dtype));
      !s.ok()) {
    return s;
  }
  const ChunkRange range = shape_.plan().chunk(chunk_index);
  ChunkState& chunk = chunk_state(chunk_index);
  absl::MutexLock lock(&chunk.mu);
  if (chunk.updating || chunk.pending != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("chunk ", chunk_index,
                     " cannot be initialised: it has contributions for step ",
                     chunk.applied_step + 1));
  }
  if (chunk.applied_step > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("chunk ", chunk_index, " cannot be initialised: step ",
                     chunk.applied_step, " was already applied to it"));
  }
  float* dst = master(range);
  ConvertToFloat(dtype, payload.data(), dst, range.size());
  ZeroPadding(shape_.layout(), range, dst);
  return absl::OkStatus();
}

absl::Status ShardState::BeginStep(
    uint64_t step, uint32_t worker_rank,
    std::vector<GroupHyperParams> group_hparams, const StepNumerics& numerics,
    const std::shared_ptr<WeightsSink>& stats_sink) {
  if (absl::Status s = CheckNotDeleted(); !s.ok()) return s;
  const uint32_t workers = shape_.config().num_workers;
  if (worker_rank >= workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker_rank ", worker_rank,
                     " is out of range: the job has ", workers, " workers"));
  }
  if (step == 0) {
    return absl::InvalidArgumentError("step must be >= 1");
  }
  if (absl::Status s = ValidateGroupHyperParams(shape_.layout(), group_hparams);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidateStepNumerics(numerics); !s.ok()) return s;
  if (numerics.two_phase && stats_sink == nullptr) {
    return absl::InvalidArgumentError(
        "a two-phase step needs a stream to send its GradStats to");
  }
  std::sort(group_hparams.begin(), group_hparams.end(),
            [](const GroupHyperParams& a, const GroupHyperParams& b) {
              return a.param_group < b.param_group;
            });
  std::shared_ptr<TwoPhaseStep> two_phase;
  {
    absl::MutexLock lock(&steps_mu_);
    // Every chunk's applied step is completed_step_ or one more, so only these
    // steps can be replayed or applied; the chunks of any other step are
    // ABORTED one by one, and remembering it would only grow the map.
    if (step < completed_step_ || step > completed_step_ + 2) {
      return absl::OkStatus();
    }
    auto [it, inserted] = steps_.try_emplace(step);
    StepProgress& progress = it->second;
    if (inserted) {
      progress.group_hparams = std::move(group_hparams);
      progress.numerics = numerics;
      if (numerics.two_phase) {
        progress.two_phase =
            std::make_shared<TwoPhaseStep>(step, shape_.shard().num_chunks());
      }
    } else if (!SameGroupHyperParams(progress.group_hparams, group_hparams)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "group_hparams of step ", step,
          " differ from those of the step's first header on this server"));
    } else if (!SameStepNumerics(progress.numerics, numerics)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "loss_scale, two_phase or commit of step ", step,
          " differ from those of the step's first header on this server: "
          "every worker must send the same"));
    }
    two_phase = progress.two_phase;
  }
  // Outside steps_mu_: the stats may be delivered at once.
  if (two_phase != nullptr) two_phase->Subscribe(stats_sink);
  return absl::OkStatus();
}

absl::Status ShardState::Contribute(Contribution contribution) {
  if (absl::Status s = CheckNotDeleted(); !s.ok()) return s;
  const uint64_t index = contribution.chunk_index;
  const uint64_t step = contribution.step;
  const uint32_t worker = contribution.worker_rank;
  const JobConfig& config = shape_.config();
  if (absl::Status s = CheckChunkPayload(index, contribution.payload.size(),
                                         DTypeSize(config.grad_dtype));
      !s.ok()) {
    return s;
  }
  if (worker >= config.num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker_rank ", worker, " is out of range: the job has ",
                     config.num_workers, " workers"));
  }
  // Looked up before the chunk's lock, which is never held while taking
  // steps_mu_.
  const bool two_phase = TwoPhaseOf(step) != nullptr;
  ChunkState& chunk = chunk_state(index);
  std::optional<ChunkWeights> replay;
  bool first_of_chunk = false;
  bool ack_retry = false;
  {
    absl::MutexLock lock(&chunk.mu);
    const uint64_t applied = chunk.applied_step;
    if (step == applied + 1) {
      if (chunk.pending == nullptr) {
        chunk.pending = std::make_unique<PendingStep>(config.num_workers);
        first_of_chunk = true;
      }
      PendingStep& pending = *chunk.pending;
      if (pending.present[worker]) {
        std::shared_ptr<WeightsSink> previous = pending.sinks[worker].lock();
        if (previous != nullptr && previous->IsOpen()) {
          return absl::AlreadyExistsError(
              absl::StrCat("duplicate contribution: worker ", worker,
                           " already sent chunk ", index, " of step ", step));
        }
        // The worker's earlier stream has ended and it is retrying: the retry
        // takes that stream's place. Once the sum has started it owns the
        // earlier payload, which a correct retry repeats anyway.
        pending.sinks[worker] = contribution.sink;
        if (!pending.complete) {
          pending.payloads[worker] = std::move(contribution.payload);
        }
        // A summed chunk was acknowledged to the earlier stream only.
        ack_retry = pending.summed_ready;
      } else {
        pending.present[worker] = true;
        pending.payloads[worker] = std::move(contribution.payload);
        pending.sinks[worker] = contribution.sink;
        if (++pending.count == config.num_workers) {
          pending.complete = true;
          if (two_phase) {
            pool_->Schedule([self = shared_from_this(), index, step] {
              self->RunSum(index, step);
            });
          } else {
            chunk.updating = true;
            pool_->Schedule([self = shared_from_this(), index, step] {
              self->RunUpdate(index, step);
            });
          }
        }
      }
    } else if (step == applied && applied > 0) {
      if (chunk.updating) {
        return absl::AbortedError(
            absl::StrCat("step ", step, " can no longer be replayed for chunk ",
                         index, ": step ", step + 1, " is being applied"));
      }
      const ChunkRange range = shape_.plan().chunk(index);
      replay = ChunkWeights{index,
                            std::make_shared<const std::string>(EncodeMaster(
                                range.begin, range.end, config.weight_dtype)),
                            0.0, true};
    } else {
      return absl::AbortedError(
          absl::StrCat("step ", step, " is out of order for chunk ", index,
                       ": its last applied step is ", applied));
    }
  }
  if (first_of_chunk) NoteContributionStart(step);
  if (replay.has_value()) contribution.sink->Deliver(*std::move(replay));
  if (ack_retry) contribution.sink->DeliverAck(index);
  return absl::OkStatus();
}

void ShardState::NoteContributionStart(uint64_t step) {
  absl::MutexLock lock(&steps_mu_);
  auto it = steps_.find(step);
  if (it == steps_.end() || it->second.started) return;
  it->second.started = true;
  it->second.first_contribution = std::chrono::steady_clock::now();
}

void ShardState::NoteChunkApplied(uint64_t step) {
  absl::MutexLock lock(&steps_mu_);
  StepProgress& progress = steps_[step];
  if (++progress.chunks_applied < shape_.shard().num_chunks()) return;
  if (progress.started) {
    metrics_->step_seconds.Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                      progress.first_contribution)
            .count());
  }
  metrics_->steps_completed.Increment();
  completed_step_ = std::max(completed_step_, step);
  // Steps before the completed one can no longer be replayed by any chunk.
  steps_.erase(steps_.begin(), steps_.lower_bound(completed_step_));
}

absl::Status ShardState::ReadWeights(
    uint64_t begin, uint64_t end, DType dtype,
    const std::function<bool(uint64_t offset, std::string payload)>& emit)
    const {
  const ShardRange& shard = shape_.shard();
  if (begin > end || begin < shard.begin || end > shard.end) {
    return absl::OutOfRangeError(absl::StrCat(
        "range [", begin, ", ", end, ") is not inside this server's shard [",
        shard.begin, ", ", shard.end, ")"));
  }
  const ShardPlan& plan = shape_.plan();
  for (uint64_t pos = begin; pos < end;) {
    const uint64_t index = pos / plan.chunk_elems();
    const uint64_t piece_end = std::min(end, plan.chunk(index).end);
    std::string payload;
    {
      ChunkState& chunk = chunk_state(index);
      absl::MutexLock lock(&chunk.mu);
      chunk.mu.Await(absl::Condition(&chunk, &ChunkState::Idle));
      payload = EncodeMaster(pos, piece_end, dtype);
    }
    if (!emit(pos, std::move(payload))) {
      return absl::CancelledError("the client stopped reading the weights");
    }
    pos = piece_end;
  }
  return absl::OkStatus();
}

uint64_t ShardState::completed_step() const {
  absl::MutexLock lock(&steps_mu_);
  return completed_step_;
}

uint64_t ShardState::Checksum() const {
  Checksum64 hash;
  const ShardRange& shard = shape_.shard();
  for (uint64_t index = shard.first_chunk; index < shard.end_chunk; ++index) {
    const ChunkRange range = shape_.plan().chunk(index);
    ChunkState& chunk = chunk_state(index);
    absl::MutexLock lock(&chunk.mu);
    chunk.mu.Await(absl::Condition(&chunk, &ChunkState::Idle));
    hash.Update(master(range), range.size() * sizeof(float));
    for (int k = 0; k < shape_.slots(); ++k) {
      hash.Update(slot(k, range.begin), range.size() * slot_elem_bytes_[k]);
    }
    hash.UpdateU64(chunk.optimizer_step);
  }
  return hash.Digest();
}

void ShardState::MarkDeleted() {
  deleted_.store(true, std::memory_order_release);
}

}  // namespace depot
