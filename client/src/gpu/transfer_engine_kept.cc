// TransferEngine::Impl: the tensors whose optimizer stays on the GPU
// (offload fraction, docs/gpu.md): their state, and their update each step.
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "gpu/transfer_engine_impl.h"

namespace depot::gpu {

TransferEngine::Impl::KeptBlock TransferEngine::Impl::KeptBlockOf(
    uint32_t rank) const {
  const Layout& layout = job_.layout();
  const ShardPlan& plan = job_.plan();
  KeptBlock block;
  block.in_bucket.assign(partition_.num_buckets(), {});
  for (uint64_t b = 0; b < partition_.num_buckets(); ++b) {
    const ChunkSpan owned = partition_.owned(b, rank);
    if (owned.empty()) continue;
    const uint64_t begin = plan.chunk(owned.first).begin;
    const uint64_t end = plan.chunk(owned.end - 1).end;
    for (const Segment& segment : layout.SegmentsIn(begin, end)) {
      if (!kept_tensor_[segment.tensor_index]) continue;
      block.in_bucket[b].push_back(
          KeptSegment{segment.begin, segment.end,
                      static_cast<uint32_t>(segment.tensor_index),
                      segment.param_group, block.elems});
      block.elems += segment.end - segment.begin;
    }
  }
  if (block.elems == 0) return block;
  const int slots = OptimizerStateSlots(JobSlotConfig(job_.config()));
  const auto aligned = [](uint64_t bytes) { return (bytes + 255) / 256 * 256; };
  block.bytes = aligned(block.elems * sizeof(float));
  for (int k = 0; k < slots; ++k) {
    block.slot_offset[k] = block.bytes;
    block.bytes += aligned(block.elems * DTypeSize(slot_dtype_[k]));
  }
  return block;
}

absl::Status TransferEngine::Impl::InitGpuTensors() {
  if (options_.offload_fraction >= 1.0) return absl::OkStatus();
  const JobConfig& config = job_.config();
  const Layout& layout = job_.layout();
  gpu_tensors_ = ChooseGpuTensors(layout, options_.offload_fraction);
  kept_tensor_.assign(layout.tensors().size(), false);
  for (uint32_t t : gpu_tensors_) kept_tensor_[t] = true;
  kept_steps_.assign(layout.tensors().size(), 0);
  const OptimizerConfig slot_config = JobSlotConfig(config);
  for (int k = 0; k < OptimizerStateSlots(slot_config); ++k) {
    slot_dtype_[k] = OptimizerSlotDType(slot_config, k);
  }
  kept_ = KeptBlockOf(options_.local_rank);
  const ShardPlan& plan = job_.plan();
  // Every chunk's entry, also on a rank that keeps none (Accept reads it).
  if (sum_only_) kept_of_chunk_.assign(plan.num_chunks(), KeptChunk());
  if (kept_.elems == 0) return absl::OkStatus();
  if (sum_only_) {
    // Within a chunk the kept elements are numbered consecutively (the
    // segments above are in element order), so its sums land in one run.
    for (const std::vector<KeptSegment>& segments : kept_.in_bucket) {
      for (const KeptSegment& k : segments) {
        for (uint64_t c = k.begin / plan.chunk_elems();
             c < plan.num_chunks() && plan.chunk(c).begin < k.end; ++c) {
          const uint64_t lo = std::max(k.begin, plan.chunk(c).begin);
          const uint64_t hi = std::min(k.end, plan.chunk(c).end);
          KeptChunk& kept = kept_of_chunk_[c];
          if (kept.elems == 0)
            kept.state_offset = k.state_offset + (lo - k.begin);
          kept.elems += hi - lo;
        }
      }
    }
    for (int i = 0; sums_from_servers_ && i < (options_.delayed_update ? 2 : 1);
         ++i) {
      absl::StatusOr<std::unique_ptr<Buffer>> sums =
          device_.Allocate(kept_.elems * sizeof(float));
      if (!sums.ok()) return sums.status();
      kept_sum_[i] = *std::move(sums);
    }
  }
  absl::StatusOr<std::unique_ptr<Buffer>> state = device_.Allocate(kept_.bytes);
  if (!state.ok()) return state.status();
  kept_state_ = *std::move(state);
  // The initial state on the host: the servers' master weights, the
  // slots' initial values; then one copy to the device.
  std::string host(kept_.bytes, '\0');
  float* master = reinterpret_cast<float*>(host.data());
  for (const std::vector<KeptSegment>& segments : kept_.in_bucket) {
    for (const KeptSegment& k : segments) {
      if (absl::Status s = job_.Pull(k.begin, k.end, DType::kFloat32,
                                     master + k.state_offset);
          !s.ok()) {
        return s;
      }
      ParamRun run = KeptRun(k, host.data());
      InitOptimizerSlots(GroupOptimizer(config, k.group), run);
    }
  }
  absl::Status s = device_.CopyAsync(*comm_, kept_state_->data(), host.data(),
                                     kept_.bytes, CopyKind::kHostToDevice);
  if (s.ok()) s = device_.SynchronizeStream(*comm_);
  return s;
}

ParamRun TransferEngine::Impl::KeptRun(const KeptSegment& k, char* base,
                                       const KeptBlock& block) const {
  ParamRun run;
  run.master = reinterpret_cast<float*>(base) + k.state_offset;
  for (int slot = 0; slot < kMaxStateSlots; ++slot) {
    if (block.slot_offset[slot] == 0) continue;
    run.slots[slot] = base + block.slot_offset[slot] +
                      k.state_offset * DTypeSize(slot_dtype_[slot]);
  }
  run.n = k.end - k.begin;
  return run;
}

absl::Status TransferEngine::Impl::PlanGpuUpdates(const StepOptions& options,
                                                  StepRun& run) {
  // The kept tensors are sum-only: the servers say (GradSum) which of them
  // no node has a gradient for, and the trainer's own no_grad_tensors go
  // to them as they are.
  // A two-phase step's decision comes with the servers' sums.
  if (!run.two_phase) {
    absl::MutexLock lock(&mu_);
    run.commit = options.known_commit.value_or(StepCommit());
  }
  return absl::OkStatus();
}

absl::Status TransferEngine::Impl::ResolveGpuUpdates(StepRun& run) {
  std::optional<StepCommit> decided;
  {
    absl::MutexLock lock(&mu_);
    decided = run.commit;
  }
  if (!decided.has_value()) {
    return absl::InternalError(absl::StrCat(
        "step ", run.step,
        ": the weights of chunks with tensors kept on the "
        "GPU came without the servers' decision (GradSum.commit)"));
  }
  const StepCommit commit = *decided;
  const JobConfig& config = job_.config();
  const size_t tensors = job_.layout().tensors().size();
  run.gpu_hparams.assign(tensors, std::nullopt);
  run.tensor_resolved.assign(tensors, false);
  // The node's gradient, as it came from backward; or the servers' sums
  // (fp32), in one phase not yet unscaled, in two phases unscaled.
  run.gpu_grad.dtype = sums_from_servers_ ? DType::kFloat32 : config.grad_dtype;
  run.gpu_grad.unscale_factor = run.two_phase && sums_from_servers_
                                    ? 1.0f
                                    : UnscaleFactor(run.options.loss_scale);
  run.gpu_grad.unscale = run.gpu_grad.unscale_factor != 1.0f;
  run.gpu_grad.clip = commit.clip_coef < 1.0;
  run.gpu_grad.clip_coef = static_cast<float>(commit.clip_coef);
  return absl::OkStatus();
}

void TransferEngine::Impl::ResolveGpuTensor(StepRun& run, uint32_t tensor) {
  run.tensor_resolved[tensor] = true;
  bool has_grad;
  StepCommit commit;
  {
    absl::MutexLock lock(&mu_);
    has_grad = !run.sum_skipped[tensor];
    commit = *run.commit;  // ResolveGpuUpdates found it
  }
  if (!has_grad || commit.skip) return;
  const JobConfig& config = job_.config();
  const uint32_t group = job_.layout().tensors()[tensor].param_group;
  run.gpu_hparams[tensor] = ResolveHyperParams(GroupOptimizer(config, group),
                                               run.options.group_hparams, group,
                                               kept_steps_[tensor] + 1);
  // The servers' counts move when they apply the step; a failed step leaves
  // the engine unusable (FinishStep).
  ++kept_steps_[tensor];
}

absl::Status TransferEngine::Impl::UpdateGpuTensors(StepRun& run, uint64_t b,
                                                    char* target) {
  if (kept_.in_bucket[b].empty()) return absl::OkStatus();
  if (run.tensor_resolved.empty()) {
    if (absl::Status s = ResolveGpuUpdates(run); !s.ok()) return s;
  }
  for (const KeptSegment& k : kept_.in_bucket[b]) {
    if (!run.tensor_resolved[k.tensor]) ResolveGpuTensor(run, k.tensor);
    const ParamRun state = KeptRun(k, static_cast<char*>(kept_state_->data()));
    const WeightsOutput weights{job_.config().weight_dtype,
                                target + k.begin * weight_size_};
    absl::Status s;
    if (run.gpu_hparams[k.tensor].has_value()) {
      // The node's reduce-scattered gradient, or with several nodes the
      // servers' sum over them (the same fp32 sum their update starts from).
      const void* part =
          sums_from_servers_
              ? static_cast<const void*>(KeptSums(run) + k.state_offset)
              : run.grads + k.begin * grad_size_;
      GradientInput grad = run.gpu_grad;
      grad.parts = &part;
      grad.num_parts = 1;
      s = options_.device_optimizer->Update(
          k.group, grad, state, *run.gpu_hparams[k.tensor], weights, *comm_);
    } else {
      s = options_.device_optimizer->WriteWeights(state.master, state.n,
                                                  weights, *comm_);
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status TransferEngine::Impl::CopyCapturedState(StepRun& run, uint64_t b) {
  const ChunkSpan owned = partition_.owned(b, options_.local_rank);
  std::vector<uint64_t> wanted;
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t c = owned.first; c < owned.end; ++c) {
      if (run.capture_wanted[c] && kept_of_chunk_[c].elems > 0) {
        wanted.push_back(c);
      }
    }
  }
  if (wanted.empty()) return absl::OkStatus();
  const int slots = OptimizerStateSlots(JobSlotConfig(job_.config()));
  const char* device = static_cast<const char*>(kept_state_->data());
  // Each chunk's kept elements are one run of the kept block (master, then
  // each slot's array): copied as they lie, then spread over the chunk.
  std::vector<std::string> host(wanted.size());
  absl::Status s;
  for (size_t i = 0; s.ok() && i < wanted.size(); ++i) {
    const KeptChunk kept = kept_of_chunk_[wanted[i]];
    host[i].resize(kept.elems * sizeof(float) * (1 + slots));
    char* out = host[i].data();
    s = device_.CopyAsync(*comm_, out,
                          device + kept.state_offset * sizeof(float),
                          kept.elems * sizeof(float), CopyKind::kDeviceToHost);
    out += kept.elems * sizeof(float);
    for (int k = 0; s.ok() && k < slots; ++k) {
      const size_t size = DTypeSize(slot_dtype_[k]);
      s = device_.CopyAsync(
          *comm_, out, device + kept_.slot_offset[k] + kept.state_offset * size,
          kept.elems * size, CopyKind::kDeviceToHost);
      out += kept.elems * size;
    }
  }
  if (absl::Status settled = SettleComm(s, /*collective=*/false);
      !settled.ok()) {
    return settled;
  }
  // Spread over the chunks on the send's thread (CapturedChunk), with the
  // counts of now: the next step's update, later on this thread, moves them.
  run.captured.push_back({b, std::move(wanted), std::move(host), kept_steps_});
  return absl::OkStatus();
}

FlatState TransferEngine::Impl::CapturedChunk(const CapturedBucket& bucket,
                                              size_t i, uint64_t step) const {
  const int slots = OptimizerStateSlots(JobSlotConfig(job_.config()));
  const KeptChunk kept = kept_of_chunk_[bucket.chunks[i]];
  const ChunkRange range = job_.plan().chunk(bucket.chunks[i]);
  FlatState part;
  part.applied_step = step;
  // Every count of the step's resolved tensors: those of this chunk's.
  part.tensor_steps = bucket.tensor_steps;
  part.master.assign(range.size(), 0.0f);
  part.slots.assign(slots, std::vector<float>(range.size(), 0.0f));
  const char* in = bucket.host[i].data();
  for (const KeptSegment& k : kept_.in_bucket[bucket.bucket]) {
    const uint64_t lo = std::max(k.begin, range.begin);
    const uint64_t hi = std::min(k.end, range.end);
    if (lo >= hi) continue;
    const uint64_t from = k.state_offset + (lo - k.begin) - kept.state_offset;
    std::memcpy(part.master.data() + (lo - range.begin),
                in + from * sizeof(float), (hi - lo) * sizeof(float));
    const char* slot_in = in + kept.elems * sizeof(float);
    for (int slot = 0; slot < slots; ++slot) {
      const size_t size = DTypeSize(slot_dtype_[slot]);
      ConvertToFloat(slot_dtype_[slot], slot_in + from * size,
                     part.slots[slot].data() + (lo - range.begin), hi - lo);
      slot_in += kept.elems * size;
    }
  }
  return part;
}

void TransferEngine::Impl::SendCapturedState(StepRun& run) {
  // An earlier send that has ended is reported now; one still under way
  // too, once it ends, if this step has one to start (one at a time).
  if (!run.captured.empty() || !capture_thread_.joinable() ||
      capture_sent_.load()) {
    const CaptureReport report = TakeCaptureReport();
    run.result.capture_step = report.step;
    run.result.capture_chunks = report.chunks;
    run.result.capture_error = report.error;
  }
  if (run.captured.empty()) return;
  // Its own handle on the job, with the job ids of now: the trainer may
  // call job_ (and reattach it after a server restart) meanwhile.
  absl::StatusOr<std::unique_ptr<Job>> job =
      client_internal::CopyJobHandle(job_);
  if (!job.ok()) {
    capture_report_ = {run.step, 0, CaptureError(run.step, job.status())};
    run.captured.clear();
    return;
  }
  capture_sent_ = false;
  capture_thread_ = std::thread([this, job = *std::move(job), step = run.step,
                                 buckets = std::move(run.captured)] {
    CaptureReport report{step, 0, ""};
    for (const CapturedBucket& bucket : buckets) {
      for (size_t i = 0; report.error.empty() && i < bucket.chunks.size();
           ++i) {
        const ChunkRange range = job->plan().chunk(bucket.chunks[i]);
        const absl::Status s = job->PatchCapturePart(
            step, range.begin, range.end, CapturedChunk(bucket, i, step));
        if (s.ok()) {
          ++report.chunks;
        } else {
          report.error = CaptureError(step, s);
        }
      }
    }
    capture_report_ = std::move(report);
    capture_sent_ = true;
  });
  run.captured.clear();
}

void TransferEngine::Impl::JoinCapture() {
  if (capture_thread_.joinable()) capture_thread_.join();
}

CaptureReport TransferEngine::Impl::TakeCaptureReport() {
  JoinCapture();
  return std::exchange(capture_report_, CaptureReport());
}

std::string TransferEngine::Impl::CaptureError(uint64_t step,
                                               const absl::Status& status) {
  return absl::StrCat(
      "the state of the tensors kept on the GPU could not be sent into the "
      "servers' checkpoint of step ",
      step, " (that checkpoint goes without it): ", status.ToString());
}

absl::Status TransferEngine::Impl::SettleComm(absl::Status queued,
                                              bool collective) {
  // Also after an error: nothing queued may outlive the buffers it uses.
  const absl::Status synced = device_.SynchronizeStream(*comm_);
  if (!queued.ok()) return queued;
  if (!synced.ok()) return synced;
  // A collective aborted on the way (the watch's timeout) did nothing.
  return collective ? CollectivesExpired() : absl::OkStatus();
}

absl::Status TransferEngine::Impl::AcrossTheNode(
    const std::function<absl::Status()>& own, const char* others_failed) {
  if (NodeMode()) {
    // The node's verdicts, the same on every rank: all return here alike.
    if (absl::Status s = CheckNode(); !s.ok()) return s;
  }
  const absl::Status mine = own();
  if (!NodeMode()) return mine;
  // Every rank learns whether every rank's part went through: none waits
  // for one that failed, and none reports a node's work whole that is not.
  absl::StatusOr<bool> any_failed = AnyRankFailed(!mine.ok());
  if (!any_failed.ok()) return any_failed.status();
  if (!mine.ok()) return mine;
  if (*any_failed) return absl::AbortedError(others_failed);
  return absl::OkStatus();
}

absl::Status TransferEngine::Impl::CheckNoStepInFlight(const char* what) {
  absl::MutexLock lock(&mu_);
  if (!runs_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": step ", runs_.front()->step,
                     " is in flight (call FinishStep first)"));
  }
  return absl::OkStatus();
}

absl::Status TransferEngine::Impl::CheckKeptStateKnown(const char* what) {
  if (!kept_state_missing_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": ", kept_state_missing_));
  }
  if (kept_state_lost_) {
    return absl::FailedPreconditionError(absl::StrCat(
        what,
        ": a step failed while the optimizer state of the tensors kept on the "
        "GPU (offload_fraction < 1) took part in it; that state cannot replay "
        "a step: load a saved state first (WriteGpuState, or RestoreGpuState "
        "once the servers went back to a checkpoint that holds it)"));
  }
  return absl::OkStatus();
}

absl::Status TransferEngine::Impl::CheckGpuStateAccess(
    const char* what, const StateArrays& state) {
  if (absl::Status s = CheckNoStepInFlight(what); !s.ok()) return s;
  const size_t slots = OptimizerStateSlots(JobSlotConfig(job_.config()));
  if (state.master == nullptr || state.tensor_steps == nullptr ||
      state.num_slots < slots) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the state needs master weights, step counts and ",
                     slots, " slot arrays (", state.num_slots, " given)"));
  }
  for (size_t k = 0; k < slots; ++k) {
    if (state.slots[k] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": slot array ", k, " is null"));
    }
  }
  return absl::OkStatus();
}

absl::Status TransferEngine::Impl::CopyKeptState(std::string& host,
                                                 CopyKind kind) {
  host.resize(kept_state_->bytes());
  absl::Status s =
      kind == CopyKind::kDeviceToHost
          ? device_.CopyAsync(*comm_, host.data(), kept_state_->data(),
                              host.size(), kind)
          : device_.CopyAsync(*comm_, kept_state_->data(), host.data(),
                              host.size(), kind);
  if (s.ok()) s = device_.SynchronizeStream(*comm_);
  return s;
}

absl::Status TransferEngine::Impl::GatherKeptState(
    const std::vector<KeptBlock>& blocks, std::string& host, uint64_t& stride) {
  uint64_t most = 0;
  for (const KeptBlock& block : blocks) most = std::max(most, block.bytes);
  // Blocks are 256-byte aligned and counts 8 bytes: whole fp32 words, which
  // the all-gather moves as they are.
  const uint64_t counts = gpu_tensors_.size() * sizeof(uint64_t);
  stride = most + counts;
  host.assign(blocks.size() * stride, '\0');
  if (stride == 0) return absl::OkStatus();  // the same on every rank
  {
    absl::MutexLock lock(&mu_);
    if (!node_broken_.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ReadGpuState: ", node_broken_,
          "; the node's kept state cannot be gathered: create every local "
          "rank's engine anew and load a saved state"));
    }
  }
  std::string mine(counts, '\0');
  for (size_t i = 0; i < gpu_tensors_.size(); ++i) {
    std::memcpy(mine.data() + i * sizeof(uint64_t),
                &kept_steps_[gpu_tensors_[i]], sizeof(uint64_t));
  }
  absl::StatusOr<std::unique_ptr<Buffer>> send = device_.Allocate(stride);
  if (!send.ok()) return send.status();
  absl::StatusOr<std::unique_ptr<Buffer>> recv =
      device_.Allocate(blocks.size() * stride);
  if (!recv.ok()) return recv.status();
  char* out = static_cast<char*>((*send)->data());
  absl::Status s;
  if (kept_state_ != nullptr) {
    s = device_.CopyAsync(*comm_, out, kept_state_->data(),
                          kept_state_->bytes(), CopyKind::kDeviceToDevice);
  }
  if (s.ok() && counts > 0) {
    s = device_.CopyAsync(*comm_, out + most, mine.data(), counts,
                          CopyKind::kHostToDevice);
  }
  if (s.ok()) {
    s = collective_->AllGather(out, (*recv)->data(), stride / sizeof(float),
                               DType::kFloat32, *comm_);
  }
  if (s.ok()) {
    s = device_.CopyAsync(*comm_, host.data(), (*recv)->data(), host.size(),
                          CopyKind::kDeviceToHost);
  }
  return SettleComm(s, /*collective=*/true);
}

void TransferEngine::Impl::UnpackKeptBlock(const KeptBlock& block, char* host,
                                           const StateArrays& state) const {
  for (const std::vector<KeptSegment>& segments : block.in_bucket) {
    for (const KeptSegment& k : segments) {
      const ParamRun run = KeptRun(k, host, block);
      std::copy_n(run.master, run.n, state.master + k.begin);
      for (int slot = 0; slot < kMaxStateSlots; ++slot) {
        if (run.slots[slot] == nullptr) continue;
        ConvertToFloat(slot_dtype_[slot], run.slots[slot],
                       state.slots[slot] + k.begin, run.n);
      }
    }
  }
}

absl::Status TransferEngine::Impl::ReadGpuState(const StateArrays& state) {
  if (absl::Status s = CheckGpuStateAccess("ReadGpuState", state); !s.ok()) {
    return s;
  }
  if (!kept_state_missing_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("ReadGpuState: ", kept_state_missing_));
  }
  if (options_.local_ranks == 1) {
    for (uint32_t t : gpu_tensors_) state.tensor_steps[t] = kept_steps_[t];
    if (kept_state_ == nullptr) return absl::OkStatus();  // none kept
    std::string host;
    if (absl::Status s = CopyKeptState(host, CopyKind::kDeviceToHost);
        !s.ok()) {
      return s;
    }
    UnpackKeptBlock(kept_, host.data(), state);
    return absl::OkStatus();
  }
  // A node of several ranks: each holds its own chunks' part, gathered here.
  std::vector<KeptBlock> blocks;
  for (uint32_t r = 0; r < options_.local_ranks; ++r) {
    blocks.push_back(r == options_.local_rank ? kept_ : KeptBlockOf(r));
  }
  std::string host;
  uint64_t stride = 0;
  if (absl::Status s = GatherKeptState(blocks, host, stride); !s.ok()) {
    return s;
  }
  if (stride == 0) return absl::OkStatus();
  // A tensor's count moves on the ranks holding part of it (ResolveGpuTensor
  // on their comm threads), all alike: take it from the first of them; one
  // no rank holds (no elements) keeps this rank's.
  std::vector<int> holder(kept_tensor_.size(), -1);
  for (uint32_t r = 0; r < blocks.size(); ++r) {
    char* base = host.data() + r * stride;
    UnpackKeptBlock(blocks[r], base, state);
    for (const std::vector<KeptSegment>& segments : blocks[r].in_bucket) {
      for (const KeptSegment& k : segments) {
        if (holder[k.tensor] < 0) holder[k.tensor] = static_cast<int>(r);
      }
    }
  }
  const uint64_t most = stride - gpu_tensors_.size() * sizeof(uint64_t);
  for (size_t i = 0; i < gpu_tensors_.size(); ++i) {
    const uint32_t t = gpu_tensors_[i];
    uint64_t count = kept_steps_[t];
    if (holder[t] >= 0) {
      std::memcpy(
          &count,
          host.data() + holder[t] * stride + most + i * sizeof(uint64_t),
          sizeof(uint64_t));
    }
    state.tensor_steps[t] = count;
  }
  return absl::OkStatus();
}

absl::Status TransferEngine::Impl::WriteGpuState(const StateArrays& state) {
  if (absl::Status s = CheckGpuStateAccess("WriteGpuState", state); !s.ok()) {
    return s;
  }
  if (kept_state_ != nullptr) {
    // Read first: the block's alignment gaps keep what they hold.
    std::string host;
    absl::Status s = CopyKeptState(host, CopyKind::kDeviceToHost);
    for (const std::vector<KeptSegment>& segments : kept_.in_bucket) {
      for (const KeptSegment& k : segments) {
        if (!s.ok()) break;
        const ParamRun run = KeptRun(k, host.data());
        std::copy_n(state.master + k.begin, run.n, run.master);
        for (int slot = 0; slot < kMaxStateSlots; ++slot) {
          if (run.slots[slot] == nullptr) continue;
          ConvertFromFloat(state.slots[slot] + k.begin, slot_dtype_[slot],
                           run.slots[slot], run.n);
        }
      }
    }
    if (s.ok()) s = CopyKeptState(host, CopyKind::kHostToDevice);
    if (!s.ok()) return s;
  }
  for (uint32_t t : gpu_tensors_) kept_steps_[t] = state.tensor_steps[t];
  kept_step_ = state.applied_step;
  // The state no longer depends on what a failed step did.
  kept_state_lost_ = false;
  kept_state_missing_.clear();
  return absl::OkStatus();
}

std::vector<TransferEngine::Impl::KeptRange> TransferEngine::Impl::KeptRanges()
    const {
  const uint64_t chunk_elems = job_.plan().chunk_elems();
  std::vector<KeptRange> ranges;
  for (const std::vector<KeptSegment>& segments : kept_.in_bucket) {
    for (const KeptSegment& k : segments) {
      // Joined to the last range when only padding lies between, and no
      // chunk of another rank.
      if (ranges.empty() ||
          !job_.layout().SegmentsIn(ranges.back().end, k.begin).empty() ||
          k.begin / chunk_elems > (ranges.back().end - 1) / chunk_elems + 1) {
        ranges.push_back(KeptRange{k.begin, k.begin, {}});
      }
      ranges.back().end = k.end;
      ranges.back().segments.push_back(&k);
    }
  }
  return ranges;
}

absl::Status TransferEngine::Impl::StoreGpuState() {
  if (absl::Status s = CheckNoStepInFlight("StoreGpuState"); !s.ok()) {
    return s;
  }
  // The checkpoint the trainer takes next would drop a capture the send
  // still fills.
  JoinCapture();
  return AcrossTheNode(
      [this] {
        absl::Status s = CheckKeptStateKnown("StoreGpuState");
        return s.ok() ? StoreOwnKeptState() : s;
      },
      "StoreGpuState: another local rank could not store its part of the "
      "kept tensors' state (its own call says why), so the servers' arrays "
      "do not hold the whole state");
}

absl::Status TransferEngine::Impl::StoreOwnKeptState() {
  if (kept_state_ == nullptr) return absl::OkStatus();  // none kept here
  std::string host;
  if (absl::Status s = CopyKeptState(host, CopyKind::kDeviceToHost); !s.ok()) {
    return s;
  }
  const int slots = OptimizerStateSlots(JobSlotConfig(job_.config()));
  for (const KeptRange& range : KeptRanges()) {
    FlatState part;
    part.applied_step = kept_step_;
    part.master.assign(range.end - range.begin, 0.0f);
    part.slots.assign(slots, std::vector<float>(part.master.size(), 0.0f));
    part.tensor_steps = kept_steps_;
    for (const KeptSegment* k : range.segments) {
      const uint64_t at = k->begin - range.begin;
      const ParamRun run = KeptRun(*k, host.data());
      std::copy_n(run.master, run.n, part.master.data() + at);
      for (int slot = 0; slot < kMaxStateSlots; ++slot) {
        if (run.slots[slot] == nullptr) continue;
        ConvertToFloat(slot_dtype_[slot], run.slots[slot],
                       part.slots[slot].data() + at, run.n);
      }
    }
    if (absl::Status s = job_.PatchStatePart(range.begin, range.end, part);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status TransferEngine::Impl::RestoreGpuState() {
  if (absl::Status s = CheckNoStepInFlight("RestoreGpuState"); !s.ok()) {
    return s;
  }
  bool restored = false;
  absl::Status s = AcrossTheNode(
      [this, &restored] {
        absl::Status mine = RestoreOwnKeptState();
        restored = mine.ok();
        return mine;
      },
      "RestoreGpuState: another local rank could not restore its part of "
      "the kept tensors' state (its own call says why); this rank's part "
      "is the servers', the node's is not whole");
  // No rank steps from a node state that is not whole.
  if (restored && !s.ok()) {
    kept_state_missing_ =
        "another local rank could not read its part of the kept tensors' "
        "state back from the servers, so the node's is not whole: load a "
        "saved state";
  }
  return s;
}

absl::Status TransferEngine::Impl::RestoreOwnKeptState() {
  std::optional<uint64_t> step;
  if (kept_state_ != nullptr) {
    // Read first: the block's alignment gaps keep what they hold.
    std::string host;
    if (absl::Status s = CopyKeptState(host, CopyKind::kDeviceToHost);
        !s.ok()) {
      return s;
    }
    // Every part is read into the host copy before the device's changes.
    std::vector<uint64_t> counts = kept_steps_;
    for (const KeptRange& range : KeptRanges()) {
      absl::StatusOr<FlatState> part =
          job_.ReadStatePart(range.begin, range.end);
      if (!part.ok()) return part.status();
      if (part->lacks_worker_state) {
        return absl::FailedPreconditionError(absl::StrCat(
            "RestoreGpuState: the servers' arrays do not hold the state of "
            "the tensors kept on the GPU at their step ",
            part->applied_step,
            ": steps ran since it was last stored there, and their "
            "checkpoint of that step (if they went back to one) lacks it; "
            "roll back to a checkpoint that holds it "
            "(Job::NewestCheckpointWithWorkerState), or load a saved state"));
      }
      if (step.has_value() && part->applied_step != *step) {
        return absl::FailedPreconditionError(absl::StrCat(
            "RestoreGpuState: the servers' chunks are at steps ", *step,
            " and ", part->applied_step, ": a step is in flight"));
      }
      step = part->applied_step;
      for (const KeptSegment* k : range.segments) {
        const uint64_t at = k->begin - range.begin;
        const ParamRun run = KeptRun(*k, host.data());
        std::copy_n(part->master.data() + at, run.n, run.master);
        for (int slot = 0; slot < kMaxStateSlots; ++slot) {
          if (run.slots[slot] == nullptr) continue;
          ConvertFromFloat(part->slots[slot].data() + at, slot_dtype_[slot],
                           run.slots[slot], run.n);
        }
        counts[k->tensor] = part->tensor_steps[k->tensor];
      }
    }
    if (absl::Status s = CopyKeptState(host, CopyKind::kHostToDevice);
        !s.ok()) {
      return s;
    }
    kept_steps_ = std::move(counts);
  } else {
    // Nothing kept on this rank: only the step is the servers'.
    absl::StatusOr<std::vector<ServerJobStatus>> statuses =
        job_.Status(/*with_checksum=*/false);
    if (!statuses.ok()) return statuses.status();
    for (const ServerJobStatus& status : *statuses) {
      if (step.has_value() && status.step != *step) {
        return absl::FailedPreconditionError(absl::StrCat(
            "RestoreGpuState: the servers are at steps ", *step, " and ",
            status.step, ": a step is in flight, or a server restarted"));
      }
      step = status.step;
    }
  }
  kept_step_ = step.value_or(0);
  kept_state_lost_ = false;
  kept_state_missing_.clear();
  return absl::OkStatus();
}

}  // namespace depot::gpu
