// ShardState's update path: the sum of a chunk's contributions, the step's
// numerics (loss-scale unscaling, clipping, skipping; docs/protocol.md), the
// optimizer update, and the two-phase commit that releases the updates.
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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
  std::vector<float> summed(range.size());
  SumGradients(shape_.config().grad_dtype, payloads, summed.data(),
               range.size(), UnscaleFactor(settings.numerics.loss_scale));
  payloads = {};
  const GradStats stats =
      ComputeGradStats(shape_.layout(), range, summed.data());

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
  std::vector<float> summed;
  uint64_t optimizer_step = 0;
  {
    absl::MutexLock lock(&chunk.mu);
    optimizer_step = chunk.optimizer_step;
    payloads = std::move(chunk.pending->payloads);
    summed = std::move(chunk.pending->summed);
  }

  std::shared_ptr<const std::string> weights;
  if (noop_update_) {
    // Benchmarks only (Create): nothing changes; the answer costs no compute.
    if (config.grad_dtype == config.weight_dtype && !payloads.empty()) {
      weights = std::make_shared<const std::string>(std::move(payloads[0]));
    }
  } else if (!commit.skip) {
    float* grad = summed.data();
    if (settings.two_phase == nullptr) {
      // Reused across updates: a pool thread keeps one chunk-sized buffer.
      thread_local std::vector<float> sum;
      sum.resize(range.size());
      SumGradients(config.grad_dtype, payloads, sum.data(), range.size(),
                   UnscaleFactor(settings.numerics.loss_scale));
      grad = sum.data();
    }
    // Megatron clips only when the coefficient is below 1.
    if (commit.clip_coef < 1.0) {
      ScaleGradient(static_cast<float>(commit.clip_coef), grad, range.size());
    }
    ++optimizer_step;
    ApplyOptimizer(range, grad, settings.group_hparams, optimizer_step);
  }
  payloads = {};
  summed = {};
  if (weights == nullptr) {
    weights = std::make_shared<const std::string>(
        EncodeMaster(range.begin, range.end, config.weight_dtype));
  }
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
    const ChunkRange& range, const float* grad,
    const std::vector<GroupHyperParams>& step_groups, uint64_t optimizer_step) {
  const OptimizerConfig& optimizer = shape_.config().optimizer;
  float* chunk_master = master(range);
  for (const Segment& segment :
       shape_.layout().SegmentsIn(range.begin, range.end)) {
    const size_t offset = segment.begin - range.begin;
    ParamRun run;
    run.master = chunk_master + offset;
    for (int k = 0; k < shape_.slots(); ++k)
      run.slots[k] = slot(k, segment.begin);
    run.n = segment.end - segment.begin;
    kernel_->Update(grad + offset, run,
                    ResolveHyperParams(optimizer, step_groups,
                                       segment.param_group, optimizer_step));
  }
}

}  // namespace depot
