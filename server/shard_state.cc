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
  // Sums and overrides are bounded by the shard's size, per worker.
  const uint64_t all = held_bytes_.load(std::memory_order_relaxed);
  const uint64_t sums = apart_bytes_.load(std::memory_order_relaxed);
  return all > sums ? all - sums : 0;
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

absl::Status ShardState::BeginStep(
    uint64_t step, uint32_t worker_rank,
    std::vector<GroupHyperParams> group_hparams, const StepNumerics& numerics,
    const std::shared_ptr<StepReplySink>& stats_sink,
    std::string no_grad_tensors, NodeShape node_shape) {
  if (absl::Status s = CheckNotDeleted(); !s.ok()) return s;
  const Accepting accepting(*this);
  if (absl::Status s = accepting.status(); !s.ok()) return s;
  const uint32_t workers = shape_.config().num_workers;
  if (worker_rank >= workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker_rank ", worker_rank,
                     " is out of range: the job has ", workers, " workers"));
  }
  if (step == 0 || step > kMaxStep) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", step, " is out of range: steps run from 1 to ", kMaxStep));
  }
  if (absl::Status s = ValidateGroupHyperParams(shape_.layout(), group_hparams);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidateStepNumerics(numerics); !s.ok()) return s;
  if (absl::Status s = ValidateNoGradTensors(no_grad_tensors); !s.ok()) {
    return s;
  }
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
    // steps can be replayed or applied; the chunks of an earlier step are
    // ABORTED one by one, and remembering it would only grow the map.
    if (step < completed_step_) return absl::OkStatus();
    // A later one is refused now: its chunks could become applicable while
    // the stream is open, and would then be updated with the settings of a
    // header that was never recorded (the defaults, not its lr or phases).
    if (step > completed_step_ + 2) {
      return absl::AbortedError(absl::StrCat(
          "step ", step, " is out of order for this server: it has completed "
          "step ", completed_step_, ", and a step starts only once the step "
          "two before it is complete"));
    }
    auto it = steps_.find(step);
    const bool inserted = it == steps_.end();
    if (inserted) {
      // Made whole before it enters the map: if an allocation throws (the
      // per-worker vectors of a job with billions of workers), no half-made
      // step is left for the next header to index into.
      StepProgress fresh;
      fresh.group_hparams = std::move(group_hparams);
      fresh.numerics = numerics;
      fresh.no_grad.resize(workers);
      fresh.node_shapes.resize(workers);
      fresh.header_seen.resize(workers, false);
      if (numerics.two_phase) {
        fresh.two_phase =
            std::make_shared<TwoPhaseStep>(step, shape_.shard().num_chunks());
      }
      it = steps_.emplace(step, std::move(fresh)).first;
    }
    StepProgress& progress = it->second;
    if (!inserted &&
        !SameGroupHyperParams(progress.group_hparams, group_hparams)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "group_hparams of step ", step,
          " differ from those of the step's first header on this server"));
    }
    if (!inserted && !SameStepNumerics(progress.numerics, numerics)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "loss_scale, two_phase or commit of step ", step,
          " differ from those of the step's first header on this server: "
          "every worker must send the same"));
    }
    if (!progress.header_seen[worker_rank]) {
      progress.header_seen[worker_rank] = true;
      progress.no_grad[worker_rank] = std::move(no_grad_tensors);
      progress.node_shapes[worker_rank] = node_shape;
    } else if (progress.node_shapes[worker_rank] != node_shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", worker_rank, " in step ", step, " declares itself ",
          DescribeNodeShape(node_shape), " but its earlier Step stream of the "
          "step declared ", DescribeNodeShape(progress.node_shapes[worker_rank]),
          ": every stream of a worker's step must send the same local_ranks "
          "and bucket_chunks"));
    } else if (progress.no_grad[worker_rank] != no_grad_tensors) {
      return absl::FailedPreconditionError(absl::StrCat(
          "no_grad_tensors of worker ", worker_rank, " in step ", step,
          " differ from those of its earlier Step stream: every stream of a "
          "worker's step must send the same"));
    }
    two_phase = progress.two_phase;
  }
  // Outside steps_mu_: the stats may be delivered at once.
  if (two_phase != nullptr) two_phase->Subscribe(stats_sink);
  return absl::OkStatus();
}

absl::Status ShardState::ValidateNoGradTensors(
    const std::string& bitmap) const {
  if (bitmap.empty()) return absl::OkStatus();
  const uint64_t tensors = shape_.layout().tensors().size();
  const uint64_t bytes = (tensors + 7) / 8;
  if (bitmap.size() != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no_grad_tensors: has ", bitmap.size(), " bytes, the job's ", tensors,
        " tensors need ", bytes, " (or none: every tensor has a gradient)"));
  }
  const unsigned last = static_cast<unsigned char>(bitmap.back());
  const unsigned used_bits = tensors % 8 == 0 ? 8 : tensors % 8;
  if (used_bits < 8 && (last >> used_bits) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no_grad_tensors: bits past tensor ", tensors - 1,
        " are set; the job has ", tensors, " tensors"));
  }
  return absl::OkStatus();
}

absl::Status ShardState::OverrideWeights(uint64_t step, uint32_t worker_rank,
                                         uint64_t chunk_index,
                                         WeightsPiece piece,
                                         const NodeSender& sender) {
  if (absl::Status s = CheckNotDeleted(); !s.ok()) return s;
  const Accepting accepting(*this);
  if (absl::Status s = accepting.status(); !s.ok()) return s;
  const ShardRange& shard = shape_.shard();
  if (chunk_index < shard.first_chunk || chunk_index >= shard.end_chunk) {
    return absl::OutOfRangeError(absl::StrCat(
        "weights override: chunk ", chunk_index,
        " is not in this server's shard: chunks [", shard.first_chunk, ", ",
        shard.end_chunk, ")"));
  }
  const uint32_t workers = shape_.config().num_workers;
  if (worker_rank >= workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker_rank ", worker_rank,
                     " is out of range: the job has ", workers, " workers"));
  }
  if (absl::Status s = sender.CheckOwns("weights override: chunk", chunk_index,
                                        step, worker_rank);
      !s.ok()) {
    return s;
  }
  if (piece.payload.empty() || piece.payload.size() % sizeof(float) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights override of chunk ", chunk_index, ": payload of ",
        piece.payload.size(), " bytes is not a positive number of fp32 values"));
  }
  const uint64_t chunk_elems = shape_.plan().chunk(chunk_index).size();
  const uint64_t values = piece.payload.size() / sizeof(float);
  if (piece.offset > chunk_elems || values > chunk_elems - piece.offset) {
    return absl::OutOfRangeError(absl::StrCat(
        "weights override of chunk ", chunk_index, ": elements [",
        piece.offset, ", ", piece.offset + values, ") are past its ",
        chunk_elems, " elements"));
  }
  ChunkState& chunk = chunk_state(chunk_index);
  absl::MutexLock lock(&chunk.mu);
  const uint64_t applied = chunk.applied_step;
  if (step == applied && applied > 0) return absl::OkStatus();
  if (step != applied + 1) {
    return absl::AbortedError(
        absl::StrCat("weights override of step ", step,
                     " is out of order for chunk ", chunk_index,
                     ": its last applied step is ", applied));
  }
  bool created = false;
  PendingStep& pending = chunk.Collect(workers, &created);
  if (pending.present[worker_rank]) {
    return absl::FailedPreconditionError(absl::StrCat(
        "weights override of chunk ", chunk_index, " in step ", step,
        " after worker ", worker_rank,
        "'s gradient for it: send overrides before the chunk"));
  }
  // At most a chunk's worth of values per worker: a client that sends
  // overrides over and over must not grow the server's memory.
  std::vector<WeightsPiece>& pieces = pending.overrides[worker_rank];
  uint64_t held = 0;
  for (const WeightsPiece& earlier : pieces) held += earlier.payload.size();
  if (held + piece.payload.size() > chunk_elems * sizeof(float)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "weights overrides of chunk ", chunk_index, " in step ", step,
        " from worker ", worker_rank, ": ", held + piece.payload.size(),
        " bytes in all, more than the chunk's ", chunk_elems * sizeof(float),
        " (send each element once)"));
  }
  if (!TryHold(piece.payload.size())) {
    if (created) chunk.ForgetNew();  // no trace of the refused piece
    return absl::ResourceExhaustedError(absl::StrCat(
        "weights override of chunk ", chunk_index, " in step ", step,
        ": the server's memory budget (", budget_->limit(), " bytes, ",
        budget_->used(), " in use) has no room for its ",
        piece.payload.size(), " bytes"));
  }
  apart_bytes_.fetch_add(piece.payload.size(), std::memory_order_relaxed);
  pieces.push_back(std::move(piece));
  return absl::OkStatus();
}

absl::Status ShardState::Contribute(Contribution contribution) {
  if (absl::Status s = CheckNotDeleted(); !s.ok()) return s;
  const Accepting accepting(*this);
  if (absl::Status s = accepting.status(); !s.ok()) return s;
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
  if (absl::Status s =
          contribution.sender.CheckOwns("chunk", index, step, worker);
      !s.ok()) {
    return s;
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
      bool created = false;
      PendingStep& pending = chunk.Collect(config.num_workers, &created);
      if (pending.present[worker]) {
        std::shared_ptr<StepReplySink> previous = pending.sinks[worker].lock();
        if (previous != nullptr && previous->IsOpen()) {
          return absl::AlreadyExistsError(
              absl::StrCat("duplicate contribution: worker ", worker,
                           " already sent chunk ", index, " of step ", step));
        }
        // The worker's earlier stream has ended and it is retrying: the retry
        // takes that stream's place. Once the sum or the update has started
        // it owns the earlier payload, which a correct retry repeats anyway.
        pending.sinks[worker] = contribution.sink;
        if (chunk.phase() == ChunkPhase::kCollecting) {
          pending.payloads[worker] = std::move(contribution.payload);
        }
        // A summed chunk was acknowledged to the earlier stream only (in a
        // two-phase step an updating chunk was summed first).
        ack_retry = two_phase && (chunk.phase() == ChunkPhase::kSummed ||
                                  chunk.phase() == ChunkPhase::kUpdating);
      } else {
        // Charged to the server's budget while it waits for the other
        // workers (a retry above takes its earlier payload's place and
        // charge): a client that sends more than the budget holds is
        // refused, never allowed to grow the server's memory.
        if (!WithinHeldLimit(contribution.payload.size())) {
          if (created) chunk.ForgetNew();
          return HeldLimitError(contribution.payload.size(),
                                absl::StrCat("chunk ", index, " of step ", step,
                                             " from worker ", worker));
        }
        if (!TryHold(contribution.payload.size())) {
          // Refused, it leaves no trace (an empty PendingStep would make the
          // chunk look busy to InitChunk).
          if (created) chunk.ForgetNew();
          return absl::ResourceExhaustedError(absl::StrCat(
              "chunk ", index, " of step ", step, " from worker ", worker,
              ": the server's memory budget (", budget_->limit(),
              " bytes, ", budget_->used(),
              " in use by jobs and the payloads of steps in flight) has no "
              "room for its ", contribution.payload.size(),
              " bytes; send it again once the step's other chunks are "
              "answered (keep fewer chunks in flight)"));
        }
        // The chunk's first gradient (a weights override may have made its
        // PendingStep already).
        first_of_chunk = pending.count == 0;
        pending.present[worker] = true;
        pending.payloads[worker] = std::move(contribution.payload);
        pending.sinks[worker] = contribution.sink;
        if (++pending.count == config.num_workers) {
          chunk.Complete(two_phase);
          if (two_phase) {
            ScheduleTask([self = shared_from_this(), index, step] {
              self->RunSum(index, step);
            });
          } else {
            ScheduleTask([self = shared_from_this(), index, step] {
              self->RunUpdate(index, step);
            });
          }
        }
      }
    } else if (step == applied && applied > 0) {
      if (!chunk.ArraysFree()) {
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
