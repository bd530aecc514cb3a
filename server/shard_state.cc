// ShardState: creating a shard's state, its memory accounting and
// bookkeeping bounds, InitChunk, and the step counters and checksum. The rest
// by concept: shard_contribute.cc (headers, overrides and contributions),
// shard_update.cc (sums and updates), shard_pull.cc, shard_snapshot.cc,
// shard_capture.cc, shard_rollback.cc and pending_step_report.cc.
#include "server/shard_state.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "server/checksum.h"
#include "server/chunk_state.h"

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
  size_t slot_offset[3] = {0, 0, 0};
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

}  // namespace

void ZeroPadding(const Layout& layout, const ChunkRange& range, float* data) {
  uint64_t pos = range.begin;
  for (const Segment& segment : layout.SegmentsIn(range.begin, range.end)) {
    std::fill(data + (pos - range.begin), data + (segment.begin - range.begin),
              0.0f);
    pos = segment.end;
  }
  std::fill(data + (pos - range.begin), data + range.size(), 0.0f);
}

absl::StatusOr<std::shared_ptr<ShardState>> ShardState::Create(
    uint64_t job_id, JobShape shape, ThreadPool* pool,
    std::shared_ptr<PayloadPool> payloads, ServerMetrics* metrics,
    bool noop_update, std::shared_ptr<MemoryBudget> budget) {
  const uint64_t arrays = 1 + static_cast<uint64_t>(shape.slots());
  const uint64_t shard_elems = shape.shard().size();
  // Each array may round up by less than a line.
  const uint64_t max_elems =
      (std::numeric_limits<size_t>::max() -
       arrays * AlignedBuffer::kAlignment) /
      OptimizerStateBytesPerParam(shape.slot_config());
  if (shard_elems > max_elems) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a shard of ", shard_elems, " elements does not fit in memory"));
  }
  absl::StatusOr<AlignedBuffer> state = AlignedBuffer::Allocate(
      PlanStateArrays(shard_elems, shape.slot_config()).total_bytes);
  if (!state.ok()) return state.status();
  std::shared_ptr<ShardState> shard(
      new ShardState(job_id, std::move(shape), *std::move(state), pool,
                     std::move(payloads), metrics, noop_update,
                     std::move(budget)));
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
                       ServerMetrics* metrics, bool noop_update,
                       std::shared_ptr<MemoryBudget> budget)
    : job_id_(job_id),
      shape_(std::move(shape)),
      state_(std::move(state)),
      kernels_(shape_.config()),
      pool_(pool),
      payloads_(std::move(payloads)),
      metrics_(metrics),
      noop_update_(noop_update),
      budget_(std::move(budget)),
      max_held_bytes_(MaxHeldBytes(shape_)),
      chunks_(new ChunkState[shape_.shard().num_chunks()]) {
  const OptimizerConfig& slots = shape_.slot_config();
  const StateArrays arrays = PlanStateArrays(shape_.shard().size(), slots);
  for (int k = 0; k < shape_.slots(); ++k) {
    slot_begin_[k] =
        static_cast<unsigned char*>(state_.data()) + arrays.slot_offset[k];
    slot_elem_bytes_[k] = DTypeSize(OptimizerSlotDType(slots, k));
  }
}

void ShardState::InitChunkState(uint64_t chunk_index) {
  const ChunkRange range = shape_.plan().chunk(chunk_index);
  float* chunk_master = master(range);
  std::fill(chunk_master, chunk_master + range.size(), 0.0f);
  for (int k = 0; k < shape_.slots(); ++k) {
    std::memset(slot(k, range.begin), 0, range.size() * slot_elem_bytes_[k]);
  }
  // Each tensor's slots start at its group's initial values (Adagrad's
  // initial accumulator); padding stays zero.
  const std::vector<Segment> segments =
      shape_.layout().SegmentsIn(range.begin, range.end);
  for (const Segment& segment : segments) {
    ParamRun run;
    run.master = chunk_master + (segment.begin - range.begin);
    const OptimizerConfig& group =
        GroupOptimizer(shape_.config(), segment.param_group);
    for (int k = 0; k < OptimizerStateSlots(group); ++k) {
      run.slots[k] = slot(k, segment.begin);
    }
    run.n = segment.end - segment.begin;
    InitOptimizerSlots(group, run);
  }
  ChunkState& chunk = chunk_state(chunk_index);
  absl::MutexLock lock(&chunk.mu);
  chunk.tensor_steps.assign(segments.size(), 0);
}

ShardState::~ShardState() {
  // Payloads still waiting (a deleted job's) leave the budget with the job.
  Unhold(held_bytes_.load(std::memory_order_relaxed));
}

bool ShardState::TryHold(uint64_t bytes) {
  if (budget_ != nullptr && !budget_->TryReserve(bytes)) return false;
  held_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  return true;
}

uint64_t ShardState::HeldPayloadBytes() const {
  return payload_bytes_.load(std::memory_order_relaxed);
}

bool ShardState::WithinHeldLimit(uint64_t bytes) const {
  return bytes <= max_held_bytes_ &&
         HeldPayloadBytes() <= max_held_bytes_ - bytes;
}

absl::Status ShardState::HeldLimitError(uint64_t bytes,
                                        absl::string_view what) const {
  return absl::ResourceExhaustedError(absl::StrCat(
      what, ": job ", job_id_, " holds ", HeldPayloadBytes(),
      " bytes of gradient payloads in flight on this server, and its ", bytes,
      " more would pass the job's limit of ", max_held_bytes_, " bytes (",
      kHeldChunksPerWorker,
      " chunks per worker); send it again once its earlier chunks are "
      "answered (keep fewer chunks in flight)"));
}

void ShardState::Hold(uint64_t bytes) {
  if (budget_ != nullptr) budget_->Charge(bytes);
  held_bytes_.fetch_add(bytes, std::memory_order_relaxed);
}

void ShardState::Unhold(uint64_t bytes) {
  if (bytes == 0) return;
  if (budget_ != nullptr) budget_->Release(bytes);
  held_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
}

uint64_t ShardState::TotalBytes(const std::vector<std::string>& payloads) {
  uint64_t bytes = 0;
  for (const std::string& payload : payloads) bytes += payload.size();
  return bytes;
}

namespace {

uint64_t SaturatingMul(uint64_t a, uint64_t b) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) {
    return std::numeric_limits<uint64_t>::max();
  }
  return a * b;
}

uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  return b > std::numeric_limits<uint64_t>::max() - a
             ? std::numeric_limits<uint64_t>::max()
             : a + b;
}

}  // namespace

uint64_t ShardState::MaxHeldBytes(const JobShape& shape) {
  const JobConfig& config = shape.config();
  const uint64_t chunk_bytes =
      SaturatingMul(config.chunk_elems, DTypeSize(config.grad_dtype));
  return SaturatingMul(
      SaturatingMul(
          config.num_workers,
          std::min<uint64_t>(shape.shard().num_chunks(), kHeldChunksPerWorker)),
      chunk_bytes);
}

uint64_t ShardState::BookkeepingBytes(const JobShape& shape) {
  const JobConfig& config = shape.config();
  const uint64_t workers = config.num_workers;
  const uint64_t tensors = config.tensors.size();
  const uint64_t chunks = shape.shard().num_chunks();
  uint64_t bytes = sizeof(ShardState);
  // The config and the layout each hold the tensor list; the layout adds an
  // offset per tensor.
  uint64_t names = 0;
  for (const TensorSpec& tensor : config.tensors) names += tensor.name.size();
  bytes = SaturatingAdd(
      bytes, 2 * (tensors * sizeof(TensorSpec) + names) +
                 tensors * sizeof(uint64_t) +
                 config.group_optimizers.size() * sizeof(OptimizerConfig));
  // The shard plan: one range per server.
  bytes = SaturatingAdd(bytes, uint64_t{config.num_servers} * sizeof(ShardRange));
  // Per chunk: its state and its next step's PendingStep with a slot per
  // worker (payload, sink, presence, overrides).
  const uint64_t per_worker_pending = sizeof(std::string) +
                                      sizeof(std::weak_ptr<StepReplySink>) + 1 +
                                      sizeof(std::vector<WeightsPiece>);
  const uint64_t per_chunk =
      SaturatingAdd(sizeof(ChunkState) + sizeof(PendingStep),
                    SaturatingMul(workers, per_worker_pending));
  bytes = SaturatingAdd(bytes, SaturatingMul(chunks, per_chunk));
  // Each chunk's tensor step counts: one per tensor segment, and a chunk
  // holds one segment per tensor it touches (at most chunks + tensors in
  // all).
  bytes = SaturatingAdd(
      bytes, SaturatingMul(SaturatingAdd(chunks, tensors), sizeof(uint64_t)));
  // The steps' headers: per worker a no_grad_tensors bitmap (ceil(T / 8)
  // bytes at most), a node shape and a seen flag.
  const uint64_t per_worker_step =
      sizeof(std::string) + (tensors + 7) / 8 + sizeof(NodeShape) + 1;
  bytes = SaturatingAdd(
      bytes, SaturatingMul(kTrackedSteps * workers, per_worker_step));
  return bytes;
}

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

uint64_t ShardState::StepReceiveBytes() const {
  return shape_.plan().chunk_elems() * sizeof(float) + kStepMessageFramingBytes;
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
  if (chunk.phase() != ChunkPhase::kIdle) {
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
    chunk.mu.Await(absl::Condition(&chunk, &ChunkState::ArraysFree));
    hash.Update(master(range), range.size() * sizeof(float));
    for (int k = 0; k < shape_.slots(); ++k) {
      hash.Update(slot(k, range.begin), range.size() * slot_elem_bytes_[k]);
    }
    for (const uint64_t count : chunk.tensor_steps) hash.UpdateU64(count);
  }
  return hash.Digest();
}

void ShardState::MarkDeleted() {
  deleted_.store(true, std::memory_order_release);
}

}  // namespace depot
