// ShardState's update path: the fused per-chunk update (the sum of a chunk's
// contributions, the step's numerics — loss-scale unscaling, clipping,
// skipping; docs/protocol.md — the optimizer update and the weights out), the
// two-phase sum, and the two-phase commit that releases the updates.
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "server/chunk_state.h"
#include "server/grad_stats.h"
#include "server/gradient_sum.h"
#include "server/shard_state.h"
#include "server/step_hparams.h"
#include "server/step_numerics.h"

namespace depot {
namespace {

std::vector<std::shared_ptr<WeightsSink>> LiveSinks(
    const std::vector<std::weak_ptr<WeightsSink>>& sinks) {
  std::vector<std::shared_ptr<WeightsSink>> live;
  for (const std::weak_ptr<WeightsSink>& weak : sinks) {
    if (std::shared_ptr<WeightsSink> sink = weak.lock()) live.push_back(sink);
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

ShardState::StepProgress ShardState::StepSettings(uint64_t step) const {
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
  const StepProgress settings = StepSettings(step);
  std::vector<std::string> payloads;
  {
    absl::MutexLock lock(&chunk.mu);
    payloads = std::move(chunk.pending->payloads);
  }
  std::string summed = payloads_->Take(range.size() * sizeof(float));
  // The pool's buffers come from operator new: aligned for float.
  float* sum = reinterpret_cast<float*>(summed.data());
  SumGradients(shape_.config().grad_dtype, payloads, sum, range.size(),
               UnscaleFactor(settings.numerics.loss_scale));
  GiveBack(payloads);
  const GradStats stats = ComputeGradStats(shape_.layout(), range, sum);

  std::vector<std::shared_ptr<WeightsSink>> sinks;
  {
    absl::MutexLock lock(&chunk.mu);
    chunk.pending->summed = std::move(summed);
    chunk.pending->summed_ready = true;
    sinks = LiveSinks(chunk.pending->sinks);
  }
  for (const std::shared_ptr<WeightsSink>& sink : sinks) {
    sink->DeliverAck(chunk_index);
  }
  // Contribute saw the step's TwoPhaseStep, which lives until the step is
  // completed, so it is still there.
  settings.two_phase->AddChunk(chunk_index - shape_.shard().first_chunk, stats);
}

absl::Status ShardState::Commit(uint64_t step, const CommitDecision& commit) {
  if (absl::Status s = CheckNotDeleted(); !s.ok()) return s;
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
    if (chunk.pending == nullptr || !chunk.pending->summed_ready ||
        chunk.updating || chunk.applied_step + 1 != step) {
      continue;
    }
    chunk.updating = true;
    pool_->Schedule([self = shared_from_this(), index, step] {
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
  const StepProgress settings = StepSettings(step);
  const CommitDecision commit = settings.two_phase != nullptr
                                    ? settings.two_phase->commit()
                                    : settings.numerics.commit;
  std::vector<std::string> payloads;
  std::string summed;
  uint64_t optimizer_step = 0;
  {
    absl::MutexLock lock(&chunk.mu);
    optimizer_step = chunk.optimizer_step;
    payloads = std::move(chunk.pending->payloads);
    summed = std::move(chunk.pending->summed);
  }

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
      // One phase: the workers' payloads as they arrived; two phases: the
      // chunk's sum, already unscaled (RunSum).
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
      // Megatron clips only when the coefficient is below 1.
      grad.clip = commit.clip_coef < 1.0;
      grad.clip_coef = static_cast<float>(commit.clip_coef);
      ++optimizer_step;
      ApplyOptimizer(range, grad, settings.group_hparams, optimizer_step,
                     out.data());
    }
    weights = payloads_->Share(std::move(out));
  }
  GiveBack(payloads);
  if (!summed.empty()) payloads_->Give(std::move(summed));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();

  std::vector<std::shared_ptr<WeightsSink>> sinks;
  {
    absl::MutexLock lock(&chunk.mu);
    chunk.applied_step = step;
    chunk.optimizer_step = optimizer_step;
    chunk.updating = false;
    sinks = LiveSinks(chunk.pending->sinks);
    chunk.pending.reset();
  }
  if (!commit.skip && !noop_update_) metrics_->chunks_updated.Increment();
  metrics_->chunk_update_seconds.Observe(seconds);
  // Before delivering, so that a worker that has all its weights sees the step
  // completed in GetJob.
  NoteChunkApplied(step);
  for (const std::shared_ptr<WeightsSink>& sink : sinks) {
    sink->Deliver({chunk_index, weights, seconds, false});
  }
}

void ShardState::ApplyOptimizer(
    const ChunkRange& range, const GradientInput& grad,
    const std::vector<GroupHyperParams>& step_groups, uint64_t optimizer_step,
    void* weights) {
  const OptimizerConfig& optimizer = shape_.config().optimizer;
  const DType weight_dtype = shape_.config().weight_dtype;
  unsigned char* out = static_cast<unsigned char*>(weights);
  const size_t weight_bytes = DTypeSize(weight_dtype);
  float* chunk_master = master(range);
  // Padding between the segments is not updated (it stays zero), but the
  // answer covers the whole chunk.
  uint64_t pos = range.begin;
  const auto encode_padding = [&](uint64_t end) {
    EncodeMasterInto(pos, end, weight_dtype,
                     out + (pos - range.begin) * weight_bytes);
  };
  for (const Segment& segment :
       shape_.layout().SegmentsIn(range.begin, range.end)) {
    encode_padding(segment.begin);
    const size_t offset = segment.begin - range.begin;
    GradientInput segment_grad = grad;
    segment_grad.offset = offset;
    ParamRun run;
    run.master = chunk_master + offset;
    for (int k = 0; k < shape_.slots(); ++k)
      run.slots[k] = slot(k, segment.begin);
    run.n = segment.end - segment.begin;
    kernel_->FusedUpdate(
        segment_grad, run,
        ResolveHyperParams(optimizer, step_groups, segment.param_group,
                           optimizer_step),
        {weight_dtype, out + offset * weight_bytes});
    pos = segment.end;
  }
  encode_padding(range.end);
}

}  // namespace depot
