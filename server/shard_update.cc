// ShardState's update path: the fused per-chunk update (the sum of a chunk's
// contributions, the step's numerics — loss-scale unscaling, clipping,
// skipping; docs/protocol.md — the optimizer update and the weights out), the
// two-phase sum, and the two-phase commit that releases the updates.
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "server/chunk_state.h"
#include "server/grad_stats.h"
#include "server/gradient_sum.h"
#include "server/optimizer/optimizer_kernel.h"
#include "server/shard_state.h"
#include "server/step_hparams.h"
#include "server/step_numerics.h"
#include "server/tensor_update.h"

namespace depot {
namespace {

std::vector<std::shared_ptr<StepReplySink>> LiveSinks(
    const std::vector<std::weak_ptr<StepReplySink>>& sinks) {
  std::vector<std::shared_ptr<StepReplySink>> live;
  for (const std::weak_ptr<StepReplySink>& weak : sinks) {
    if (std::shared_ptr<StepReplySink> sink = weak.lock()) live.push_back(sink);
  }
  return live;
}

}  // namespace

void ShardState::GiveBack(std::vector<std::string>& payloads) {
  for (std::string& payload : payloads) {
    // Empty ones were moved out (the noop answer) and own no buffer.
    if (!payload.empty()) payloads_->Give(std::move(payload));
  }
  payloads.clear();
}

ShardState::StepProgress ShardState::ProgressOf(uint64_t step) const {
  absl::MutexLock lock(&steps_mu_);
  auto it = steps_.find(step);
  if (it == steps_.end()) return StepProgress();
  return it->second;
}

std::shared_ptr<TwoPhaseStep> ShardState::TwoPhaseOf(uint64_t step) const {
  absl::MutexLock lock(&steps_mu_);
  auto it = steps_.find(step);
  if (it == steps_.end()) return nullptr;
  return it->second.two_phase;
}

void ShardState::RunSum(uint64_t chunk_index, uint64_t step) {
  const ChunkRange range = shape_.plan().chunk(chunk_index);
  ChunkState& chunk = chunk_state(chunk_index);
  const StepProgress settings = ProgressOf(step);
  std::vector<std::string> payloads;
  {
    absl::MutexLock lock(&chunk.mu);
    payloads = std::move(chunk.pending()->payloads);
  }
  const std::vector<Segment> segments =
      shape_.layout().SegmentsIn(range.begin, range.end);
  const std::vector<uint32_t> absent =
      CountAbsentWorkers(settings.no_grad, segments);
  ZeroAbsentParts(settings, range, segments, absent, payloads);
  std::string summed = payloads_->Take(range.size() * sizeof(float));
  // The pool's buffers come from operator new: aligned for float.
  float* sum = reinterpret_cast<float*>(summed.data());
  SumGradients(shape_.config().grad_dtype, payloads, sum, range.size(),
               UnscaleFactor(settings.numerics.loss_scale));
  // The sum is held until the update instead of the payloads.
  Hold(summed.size());
  payload_bytes_.fetch_sub(TotalBytes(payloads), std::memory_order_relaxed);
  Unhold(TotalBytes(payloads));
  GiveBack(payloads);
  // The norm is over the tensors that have a gradient (as clip_grad_norm_
  // over the parameters with a .grad): a tensor no worker has one for is left
  // out whatever its payloads hold.
  std::vector<Segment> with_gradient;
  for (size_t i = 0; i < segments.size(); ++i) {
    if (absent[i] < shape_.config().num_workers) {
      with_gradient.push_back(segments[i]);
    }
  }
  const GradStats stats = ComputeGradStats(with_gradient, range, sum);

  std::vector<std::shared_ptr<StepReplySink>> sinks;
  {
    absl::MutexLock lock(&chunk.mu);
    chunk.KeepSum(std::move(summed));
    sinks = LiveSinks(chunk.pending()->sinks);
  }
  for (const std::shared_ptr<StepReplySink>& sink : sinks) {
    sink->DeliverAck(chunk_index);
  }
  // Contribute saw the step's TwoPhaseStep, which lives until the step is
  // completed, so it is still there.
  settings.two_phase->AddChunk(chunk_index - shape_.shard().first_chunk, stats);
}

absl::Status ShardState::Commit(uint64_t step, const CommitDecision& commit) {
  if (absl::Status s = CheckNotDeleted(); !s.ok()) return s;
  const Accepting accepting(*this);
  if (absl::Status s = accepting.status(); !s.ok()) return s;
  std::shared_ptr<TwoPhaseStep> two_phase = TwoPhaseOf(step);
  if (two_phase == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step,
                     " is not a two-phase step on this server: its first "
                     "header did not set two_phase, or the step is long over"));
  }
  absl::StatusOr<bool> first = two_phase->Commit(commit);
  if (!first.ok()) return first.status();
  if (!*first) return absl::OkStatus();
  const ShardRange& shard = shape_.shard();
  for (uint64_t index = shard.first_chunk; index < shard.end_chunk; ++index) {
    ChunkState& chunk = chunk_state(index);
    absl::MutexLock lock(&chunk.mu);
    // Every chunk is summed once the shard's statistics exist (Commit checked
    // that); the test only guards the bookkeeping.
    if (chunk.phase() != ChunkPhase::kSummed ||
        chunk.applied_step + 1 != step) {
      continue;
    }
    chunk.StartUpdate();
    ScheduleTask([self = shared_from_this(), index, step] {
      self->RunUpdate(index, step);
    });
  }
  return absl::OkStatus();
}

void ShardState::RunUpdate(uint64_t chunk_index, uint64_t step) {
  const auto start = std::chrono::steady_clock::now();
  const JobConfig& config = shape_.config();
  const ChunkRange range = shape_.plan().chunk(chunk_index);
  ChunkState& chunk = chunk_state(chunk_index);
  const StepProgress settings = ProgressOf(step);
  const CommitDecision commit = settings.two_phase != nullptr
                                    ? settings.two_phase->commit()
                                    : settings.numerics.commit;
  std::vector<std::string> payloads;
  std::string summed;
  std::vector<uint64_t> tensor_steps;
  std::vector<std::vector<WeightsPiece>> overrides;
  uint64_t held = 0;  // what the payloads and the sum were charged
  uint64_t apart = 0;  // of that, the sum and the overrides
  bool history_missing = false;
  bool lacks_worker_state = false;
  {
    absl::MutexLock lock(&chunk.mu);
    tensor_steps = chunk.tensor_steps;
    lacks_worker_state = chunk.lacks_worker_state;
    PendingStep& pending = *chunk.pending();
    payloads = std::move(pending.payloads);
    summed = std::move(pending.summed);
    overrides = std::move(pending.overrides);
    apart = summed.size();
    for (const std::vector<WeightsPiece>& pieces : overrides) {
      for (const WeightsPiece& piece : pieces) apart += piece.payload.size();
    }
    held = TotalBytes(payloads) + apart;
    history_missing = !noop_update_ && (chunk.last.weights == nullptr ||
                                        chunk.last.step != step - 1);
  }
  // The chunk's weights of step - 1, which pulls at that step read once this
  // update is done (server/shard_pull.cc): the last update's answer, or, at
  // the chunk's first update since the job was created, restored or
  // imported, the master encoded now (once).
  std::shared_ptr<const std::string> weights_before;
  if (history_missing) {
    std::string encoded =
        payloads_->Take(range.size() * DTypeSize(config.weight_dtype));
    EncodeMasterInto(range.begin, range.end, config.weight_dtype,
                     encoded.data());
    weights_before = payloads_->Share(std::move(encoded));
  }
  // Weights the trainer changed outside the optimizer become the master
  // before anything reads it, whether the step updates or skips.
  if (!noop_update_) ApplyOverrides(range, overrides);
  const std::vector<Segment> segments =
      shape_.layout().SegmentsIn(range.begin, range.end);
  std::vector<uint32_t> absent = CountAbsentWorkers(settings.no_grad, segments);
  // One phase: the workers' payloads as they arrived, absent parts zeroed
  // (two phases: RunSum zeroed them before summing).
  if (!noop_update_ && settings.two_phase == nullptr) {
    ZeroAbsentParts(settings, range, segments, absent, payloads);
  }
  // Sum-only tensors: the workers update them from this sum.
  std::shared_ptr<const GradSumReply> grad_sum =
      settings.sum_only.empty()
          ? nullptr
          : SumOnlyGradients(settings, commit, range, segments, absent,
                             payloads, summed);

  std::shared_ptr<const std::string> weights;
  if (noop_update_ && config.grad_dtype == config.weight_dtype &&
      !payloads.empty()) {
    // Benchmarks only (Create): nothing changes; the answer costs no compute.
    weights = payloads_->Share(std::move(payloads[0]));
  } else {
    std::string out =
        payloads_->Take(range.size() * DTypeSize(config.weight_dtype));
    if (noop_update_ || commit.skip) {
      EncodeMasterInto(range.begin, range.end, config.weight_dtype, out.data());
    } else {
      // One phase: the workers' payloads (absent parts zeroed above); two
      // phases: the chunk's sum, already unscaled (RunSum).
      absl::InlinedVector<const void*, 8> parts;
      GradientInput grad;
      if (settings.two_phase == nullptr) {
        for (const std::string& payload : payloads) {
          parts.push_back(payload.data());
        }
        grad.dtype = config.grad_dtype;
        grad.unscale_factor = UnscaleFactor(settings.numerics.loss_scale);
        grad.unscale = grad.unscale_factor != 1.0f;
      } else {
        parts.push_back(summed.data());
        grad.dtype = DType::kFloat32;
      }
      grad.parts = parts.data();
      grad.num_parts = parts.size();
      // A sum-only tensor is not updated here, as one nobody has a
      // gradient for.
      for (size_t i = 0; i < segments.size(); ++i) {
        if (LacksGradient(settings.sum_only, segments[i].tensor_index)) {
          absent[i] = config.num_workers;
        }
      }
      // Megatron clips only when the coefficient is below 1.
      grad.clip = commit.clip_coef < 1.0;
      grad.clip_coef = static_cast<float>(commit.clip_coef);
      ChunkArrays arrays;
      arrays.master = master(range);
      for (int k = 0; k < shape_.slots(); ++k) {
        arrays.slots[k] = slot(k, range.begin);
        arrays.slot_elem_bytes[k] = slot_elem_bytes_[k];
      }
      UpdateChunkTensors(config, kernels_, range, segments, absent, grad,
                         settings.group_hparams, arrays, tensor_steps,
                         out.data());
    }
    weights = payloads_->Share(std::move(out));
  }
  GiveBack(payloads);
  payload_bytes_.fetch_sub(held - apart, std::memory_order_relaxed);
  if (!summed.empty()) payloads_->Give(std::move(summed));
  Unhold(held);
  // The workers applied this step to the chunk's sum-only tensors on their
  // own: the state here is theirs no longer.
  if (grad_sum != nullptr) lacks_worker_state = true;
  // Still the only owner of the chunk's arrays: its next step cannot start.
  bool capture_wanted = false;
  if (const uint64_t every = capture_every_.load(std::memory_order_relaxed);
      every != 0 && step % every == 0) {
    // Only a chunk whose answer carries a GradSum can ask for the state.
    capture_wanted = CaptureChunk(
        chunk_index, step, tensor_steps, lacks_worker_state,
        settings.fills_captures && grad_sum != nullptr, settings.sum_only);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();

  std::vector<std::shared_ptr<StepReplySink>> sinks;
  std::shared_ptr<StepReplySink> worker0;
  {
    absl::MutexLock lock(&chunk.mu);
    chunk.tensor_steps = std::move(tensor_steps);
    chunk.lacks_worker_state = lacks_worker_state;
    const std::unique_ptr<PendingStep> done = chunk.FinishUpdate(step);
    sinks = LiveSinks(done->sinks);
    if (capture_wanted) worker0 = done->sinks[0].lock();
    if (!noop_update_) {
      // The buffer of two updates ago goes back to the pool once its last
      // reader (a stream still sending it) lets go.
      chunk.before = history_missing
                         ? KeptWeights{step - 1, std::move(weights_before)}
                         : std::move(chunk.last);
      chunk.last = KeptWeights{step, weights};
    }
  }
  if (!commit.skip && !noop_update_) metrics_->chunks_updated.Increment();
  metrics_->chunk_update_seconds.Observe(seconds);
  // Before delivering, so that a worker that has all its weights sees the step
  // completed in GetJob.
  NoteChunkApplied(step);
  for (const std::shared_ptr<StepReplySink>& sink : sinks) {
    sink->Deliver({chunk_index, weights, seconds, false, grad_sum,
                   worker0 != nullptr && sink == worker0});
  }
}

std::shared_ptr<const GradSumReply> ShardState::SumOnlyGradients(
    const StepProgress& settings, const CommitDecision& commit,
    const ChunkRange& range, const std::vector<Segment>& segments,
    const std::vector<uint32_t>& absent,
    const std::vector<std::string>& payloads, const std::string& summed) {
  uint64_t elems = 0;
  for (const Segment& segment : segments) {
    if (LacksGradient(settings.sum_only, segment.tensor_index)) {
      elems += segment.end - segment.begin;
    }
  }
  if (elems == 0) return nullptr;
  // Charged to the budget, apart from the payloads, until the last stream
  // that sends it lets go (a client that does not read holds it).
  const uint64_t bytes = settings.omit_sums ? 0 : elems * sizeof(float);
  Hold(bytes);
  std::shared_ptr<GradSumReply> reply(
      new GradSumReply, [self = shared_from_this(), bytes](GradSumReply* p) {
        delete p;
        self->Unhold(bytes);
      });
  reply->commit = commit;
  reply->sums.assign(bytes, '\0');
  float* out = reinterpret_cast<float*>(reply->sums.data());
  absl::InlinedVector<const void*, 8> parts;
  for (const std::string& payload : payloads) parts.push_back(payload.data());
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& segment = segments[i];
    if (!LacksGradient(settings.sum_only, segment.tensor_index)) continue;
    const uint64_t n = segment.end - segment.begin;
    // No worker has a gradient: zeros, and the workers skip the tensor as
    // the server would. Else one phase: the sum of the parts (absent
    // workers' zeroed), not unscaled (the workers' update unscales and clips
    // it as the server's would); two phases: the chunk's sum, which RunSum
    // unscaled.
    // With omit_sums, no sums: the one worker holds them.
    if (absent[i] == shape_.config().num_workers) {
      reply->skipped_tensors.push_back(
          static_cast<uint32_t>(segment.tensor_index));
    } else if (settings.omit_sums) {
    } else if (settings.two_phase != nullptr) {
      std::memcpy(out,
                  summed.data() + (segment.begin - range.begin) * sizeof(float),
                  n * sizeof(float));
    } else {
      GradientInput grad;
      grad.dtype = shape_.config().grad_dtype;
      grad.parts = parts.data();
      grad.num_parts = parts.size();
      grad.offset = segment.begin - range.begin;
      SumGradientInput(grad, out, n);
    }
    if (!settings.omit_sums) out += n;
  }
  return reply;
}

void ShardState::ZeroAbsentParts(const StepProgress& settings,
                                 const ChunkRange& range,
                                 const std::vector<Segment>& segments,
                                 const std::vector<uint32_t>& absent_workers,
                                 std::vector<std::string>& payloads) const {
  const size_t elem_bytes = DTypeSize(shape_.config().grad_dtype);
  for (size_t w = 0; w < settings.no_grad.size() && w < payloads.size(); ++w) {
    const std::string& bitmap = settings.no_grad[w];
    if (bitmap.empty() || payloads[w].empty()) continue;
    for (size_t i = 0; i < segments.size(); ++i) {
      // A tensor nobody has a gradient for is not updated at all, so its
      // parts need no zeroing.
      if (!LacksGradient(bitmap, segments[i].tensor_index) ||
          absent_workers[i] == payloads.size()) {
        continue;
      }
      std::memset(payloads[w].data() + (segments[i].begin - range.begin) *
                                           elem_bytes,
                  0, (segments[i].end - segments[i].begin) * elem_bytes);
    }
  }
}

void ShardState::ApplyOverrides(
    const ChunkRange& range,
    std::vector<std::vector<WeightsPiece>>& overrides) {
  bool any = false;
  float* chunk_master = master(range);
  for (size_t w = overrides.size(); w > 0; --w) {
    for (const WeightsPiece& piece : overrides[w - 1]) {
      std::memcpy(chunk_master + piece.offset, piece.payload.data(),
                  piece.payload.size());
      any = true;
    }
  }
  if (any) ZeroPadding(shape_.layout(), range, chunk_master);
}

}  // namespace depot
