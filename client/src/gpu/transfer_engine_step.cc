// TransferEngine::Impl: a step's run, from BeginStep through GradientsReady
// and WaitWeights to FinishStep; its threads and collectives; failing,
// joining and draining runs.
#include "gpu/transfer_engine_impl.h"

namespace depot::gpu {

using client_internal::StreamedStep;

absl::Status TransferEngine::Impl::BeginStep(uint64_t step,
                                             const StepOptions& options) {
  const size_t most = options_.delayed_update ? 2 : 1;
  if (runs_.size() >= most) {
    return absl::FailedPreconditionError(absl::StrCat(
        "BeginStep(", step, "): step ", runs_.front()->step,
        " is in flight (call FinishStep first",
        options_.delayed_update ? "; with the delayed update, at most two "
                                  "steps are in flight"
                                : "",
        ")"));
  }
  if (step == 0) {
    return absl::InvalidArgumentError("BeginStep: steps are numbered from 1");
  }
  if (NodeMode()) {
    {
      absl::MutexLock lock(&mu_);
      if (absl::Status broken = NodeBroken("BeginStep"); !broken.ok()) {
        return broken;
      }
    }
    // A step another rank failed leaves this rank's weights wrong: no step
    // begins on them. The steps in flight cannot go on either.
    if (absl::Status s = CheckNode(); !s.ok()) {
      if (!gpu_tensors_.empty()) kept_state_lost_ = true;
      for (std::unique_ptr<StepRun>& later : runs_) Fail(*later, s);
      return s;
    }
  }
  if (absl::Status s = CheckKeptStateKnown("BeginStep"); !s.ok()) return s;
  if (!runs_.empty() && step != begun_ + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("BeginStep(", step, "): step ", begun_,
                     " is in flight; the next step is ", begun_ + 1));
  }
  if (!options.weight_overrides.empty()) {
    return absl::InvalidArgumentError(
        "BeginStep: weight_overrides are not supported on GPU workers; "
        "write the new weights into the engine's weights() and the "
        "servers' with Job::Step's overrides on a host step");
  }
  const bool two_phase = client_internal::StreamedStepIsTwoPhase(job_, options);
  const uint64_t buckets = partition_.num_buckets();
  auto run = std::make_unique<StepRun>();
  run->engine = this;
  run->step = step;
  run->parity = static_cast<int>(step % 2);
  run->grads = static_cast<char*>(
      grads_[options_.delayed_update ? step % 2 : 0]->data());
  run->options = options;
  run->two_phase = two_phase;
  if (!gpu_tensors_.empty()) {
    if (absl::Status s = PlanGpuUpdates(options, *run); !s.ok()) return s;
  }
  run->named.assign(buckets, false);
  run->weights_recorded.assign(buckets, false);
  run->h2d_waited.assign(buckets, false);
  if (sum_only_) {
    run->sum_received.assign(job_.plan().num_chunks(), false);
    run->sum_skipped.assign(job_.layout().tensors().size(), false);
    run->capture_wanted.assign(job_.plan().num_chunks(), false);
  }
  run->h2d_pending = owned_in_bucket_;
  run->d2h_slot_of_chunk.assign(job_.plan().num_chunks(), -1);
  run->route_in_slots.assign((two_phase ? routes_two_phase_ : routes_).size(),
                             0);
  StepRun* r = run.get();
  StreamedStep streamed;
  streamed.step = step;
  streamed.options = &r->options;
  if (options_.local_ranks > 1) {
    streamed.local_ranks = options_.local_ranks;
    streamed.local_rank = options_.local_rank;
    streamed.bucket_chunks = partition_.bucket_chunks();
  }
  streamed.sink = r;
  if (sum_only_) {
    streamed.sum_only_tensors = gpu_tensors_;
    streamed.omit_sums = !sums_from_servers_;
    streamed.fills_captures = true;
  }
  streamed.on_failure = [this, r](const absl::Status& status) {
    Fail(*r, status);
  };
  for (const StreamedStep::Route& route :
       r->two_phase ? routes_two_phase_ : routes_) {
    r->queues.push_back(std::make_unique<ChunkQueue>(
        [this, r](uint64_t index) { ReleaseD2h(*r, index); }));
    streamed.routes.push_back(route);
    streamed.routes.back().feed = r->queues.back().get();
  }
  {
    absl::MutexLock lock(&mu_);
    // The node may have broken since the check above (the watched
    // collective expires on its own thread); nothing has started yet.
    if (absl::Status broken = NodeBroken("BeginStep"); !broken.ok()) {
      return broken;
    }
    // With no step in flight, none is waited for (the first step, or a
    // retry after a failure).
    if (runs_.empty()) collectives_through_ = step - 1;
    runs_.push_back(std::move(run));
  }
  begun_ = step;
  // The copies first: the first chunk's D2H is the step's first latency,
  // and opening the Step streams (a gRPC call per route) has that long.
  r->comm_thread = std::thread([this, r] { RunCollectives(*r); });
  r->d2h_thread = std::thread([this, r] { RunDeviceToHost(*r); });
  r->step_thread = std::thread([this, r, streamed = std::move(streamed)] {
    absl::Status status =
        client_internal::RunStreamedStep(job_, streamed, &r->result);
    if (!status.ok()) Fail(*r, status);
    absl::MutexLock lock(&mu_);
    r->streams_done = true;
  });
  return absl::OkStatus();
}

absl::Status TransferEngine::Impl::GradientsReady(uint64_t bucket,
                                                  Stream& stream) {
  StepRun* run = runs_.empty() ? nullptr : runs_.back().get();
  if (run == nullptr || run->step != begun_) {
    return absl::FailedPreconditionError(
        "GradientsReady: no step in flight (call BeginStep first)");
  }
  if (bucket >= partition_.num_buckets()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GradientsReady: bucket ", bucket, " of ", partition_.num_buckets()));
  }
  {
    absl::MutexLock lock(&mu_);
    // A node's failed step still names its buckets (its collectives run on
    // every rank); FinishStep reports the error.
    if (!run->error.ok() && !NodeMode()) return run->error;
    if (run->named[bucket]) {
      return absl::InvalidArgumentError(
          absl::StrCat("GradientsReady: bucket ", bucket,
                       " was named twice in step ", run->step));
    }
  }
  Event& ready = *ready_[run->parity][bucket];
  if (absl::Status s = device_.Record(ready, stream); !s.ok()) {
    Fail(*run, s);
    return s;
  }
  if (options_.faults.wait_on_compute_stream) {
    (void)device_.Wait(stream, ready);
  }
  absl::MutexLock lock(&mu_);
  run->named[bucket] = true;
  run->ready_order.push_back(bucket);
  return absl::OkStatus();
}

absl::Status TransferEngine::Impl::WaitWeights(uint64_t bucket,
                                               Stream& stream) {
  if (bucket >= partition_.num_buckets()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WaitWeights: bucket ", bucket, " of ", partition_.num_buckets()));
  }
  // An aborted all-gather leaves the other ranks' parts as they were: no
  // forward runs on them.
  if (absl::Status expired = CollectivesExpired(); !expired.ok()) {
    return expired;
  }
  // The step whose weights this forward reads: the last begun, or with
  // the delayed update the one before it.
  const uint64_t target =
      options_.delayed_update ? (begun_ > 0 ? begun_ - 1 : 0) : begun_;
  if (target == 0) return absl::OkStatus();  // the initial weights
  int parity = static_cast<int>(target % 2);
  {
    absl::MutexLock lock(&mu_);
    if (options_.delayed_update && applied_step_[bucket] >= target) {
      return absl::OkStatus();  // applied by an earlier WaitWeights
    }
    StepRun* run = nullptr;
    for (std::unique_ptr<StepRun>& r : runs_) {
      if (r->step == target) run = r.get();
    }
    if (run != nullptr) {
      if (!run->named[bucket]) {
        return absl::FailedPreconditionError(
            absl::StrCat("WaitWeights: bucket ", bucket, " of step ", target,
                         " has not been named by GradientsReady"));
      }
      const auto recorded = [run, bucket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return run->aborted || run->weights_recorded[bucket];
      };
      mu_.Await(absl::Condition(&recorded));
      if (!run->error.ok()) return run->error;
    }
  }
  Event& ready = *weights_ready_[parity][bucket];
  if (absl::Status s = device_.Wait(stream, ready); !s.ok()) return s;
  if (!options_.delayed_update) return absl::OkStatus();
  // Delayed update: the step's weights arrived in its incoming buffer
  // (one per step parity); the forward's stream copies the bucket into the
  // live weights. Step target + 2, the next to write that incoming buffer,
  // does so only after its own ready event of the bucket, which its
  // backward records after this forward.
  const ChunkSpan padded = partition_.padded_bucket(bucket);
  const uint64_t begin = padded.first * partition_.chunk_elems() * weight_size_;
  const uint64_t bytes =
      padded.size() * partition_.chunk_elems() * weight_size_;
  absl::Status s =
      device_.CopyAsync(stream, static_cast<char*>(live_->data()) + begin,
                        static_cast<char*>(incoming_[parity]->data()) + begin,
                        bytes, CopyKind::kDeviceToDevice);
  if (!s.ok()) return s;
  absl::MutexLock lock(&mu_);
  applied_step_[bucket] = target;
  return absl::OkStatus();
}

absl::StatusOr<StepResult> TransferEngine::Impl::FinishStep() {
  if (runs_.empty()) {
    return absl::FailedPreconditionError("FinishStep: no step in flight");
  }
  StepRun& run = *runs_.front();
  std::vector<uint64_t> missing;
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t b = 0; b < run.named.size(); ++b) {
      if (!run.named[b]) missing.push_back(b);
    }
  }
  if (!missing.empty()) {
    Fail(run, absl::FailedPreconditionError(
                  absl::StrCat("FinishStep: step ", run.step,
                               " ended before GradientsReady named ",
                               missing.size() == 1 ? "bucket " : "buckets ",
                               absl::StrJoin(missing, ", "))));
  }
  {
    absl::MutexLock lock(&mu_);
    run.naming_closed = true;
  }
  JoinRun(run);
  absl::Status error;
  {
    absl::MutexLock lock(&mu_);
    error = run.error;
  }
  if (!error.ok()) {
    if (!gpu_tensors_.empty()) kept_state_lost_ = true;
    // The trainer's recovery (a rollback) would drop a capture the send
    // still fills.
    JoinCapture();
    // A later step in flight cannot go on without this one.
    for (std::unique_ptr<StepRun>& later : runs_) {
      Fail(*later, absl::AbortedError(absl::StrCat(
                       "step ", run.step, " failed: ", error.message())));
    }
    {
      // A later step's buckets are all named (its backward came before this
      // FinishStep), or never will be.
      absl::MutexLock lock(&mu_);
      for (std::unique_ptr<StepRun>& later : runs_) later->naming_closed = true;
    }
    for (std::unique_ptr<StepRun>& later : runs_) JoinRun(*later);
    Drain();
    // The node recovers from this step: earlier verdicts no longer matter.
    node_unchecked_.clear();
    absl::MutexLock lock(&mu_);
    runs_.clear();
    return error;
  }
  SendCapturedState(run);
  const StepResult result = run.result;
  kept_step_ = run.step;
  if (NodeMode()) node_unchecked_.push_back(run.step);
  absl::MutexLock lock(&mu_);
  runs_.pop_front();
  return result;
}

absl::Status TransferEngine::Impl::Aborted(StepRun& run) {
  absl::MutexLock lock(&mu_);
  return run.error.ok() ? absl::AbortedError("the step was aborted")
                        : run.error;
}

void TransferEngine::Impl::Fail(StepRun& run, const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (run.error.ok()) run.error = status;
    run.aborted = true;
  }
  for (const std::unique_ptr<ChunkQueue>& queue : run.queues) queue->Abort();
}

uint32_t TransferEngine::Impl::RouteOfChunk(const StepRun& run,
                                            uint64_t index) const {
  return (run.two_phase ? route_two_phase_of_chunk_ : route_of_chunk_)[index];
}

std::optional<uint64_t> TransferEngine::Impl::Nth(
    StepRun& run, const std::vector<uint64_t>& list, size_t i) {
  absl::MutexLock lock(&mu_);
  // A node's collectives go on after an abort, for as long as the trainer
  // may still name buckets.
  const bool node = NodeMode();
  const auto there = [this, node, &run, &list,
                      i]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (node) {
      return list.size() > i || run.naming_closed || !node_broken_.empty();
    }
    return run.aborted || list.size() > i;
  };
  mu_.Await(absl::Condition(&there));
  if (list.size() > i && (node ? node_broken_.empty() : !run.aborted)) {
    return list[i];
  }
  if (node && node_broken_.empty()) {
    node_broken_ = absl::StrCat(
        "step ", run.step,
        " ended on this rank before GradientsReady named every bucket, so "
        "the node's collectives (queued in the order the buckets are "
        "named) are out of step");
  }
  return std::nullopt;
}

void TransferEngine::Impl::BreakNode(StepRun& run, const absl::Status& status) {
  Fail(run, status);
  absl::MutexLock lock(&mu_);
  if (node_broken_.empty()) {
    node_broken_ = absl::StrCat("step ", run.step,
                                "'s collectives failed on "
                                "this rank: ",
                                status.message());
  }
}

absl::Status TransferEngine::Impl::NodeBroken(absl::string_view what) const {
  if (node_broken_.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, ": ", node_broken_,
      "; this rank can no longer take part in the node's collectives: "
      "create every local rank's engine (and the node's collective) anew"));
}

void TransferEngine::Impl::OnCollectiveExpired(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (node_broken_.empty()) node_broken_ = std::string(status.message());
  // Under mu_: the trainer thread adds and removes runs under it.
  for (std::unique_ptr<StepRun>& run : runs_) {
    if (run->error.ok()) run->error = status;
    run->aborted = true;
    for (const std::unique_ptr<ChunkQueue>& queue : run->queues) {
      queue->Abort();
    }
  }
}

void TransferEngine::Impl::RunCollectives(StepRun& run) {
  if (!AwaitPreviousCollectives(run)) return;
  const uint64_t buckets = partition_.num_buckets();
  const uint32_t rank = options_.local_rank;
  const uint64_t chunk_elems = partition_.chunk_elems();
  for (size_t i = 0; i < buckets; ++i) {
    const std::optional<uint64_t> b = Nth(run, run.ready_order, i);
    if (!b.has_value()) return;
    if (collective_ != nullptr) {
      const ChunkSpan padded = partition_.padded_bucket(*b);
      const ChunkSpan part = partition_.owned_padded(*b, rank);
      absl::Status s = device_.Wait(*comm_, *ready_[run.parity][*b]);
      if (s.ok()) {
        s = collective_->ReduceScatterSum(
            run.grads + padded.first * chunk_elems * grad_size_,
            run.grads + part.first * chunk_elems * grad_size_,
            part.size() * chunk_elems, job_.config().grad_dtype, *comm_);
      }
      if (s.ok()) s = device_.Record(*rs_done_[run.parity][*b], *comm_);
      if (!s.ok()) return BreakNode(run, s);
      absl::MutexLock lock(&mu_);
      run.d2h_order.push_back(*b);
    }
  }
  char* target = WeightsTarget(run);
  for (size_t i = 0; i < buckets; ++i) {
    uint64_t b;
    bool aborted;
    {
      absl::MutexLock lock(&mu_);
      b = run.ready_order[i];  // complete: the first loop read every entry
    }
    Event& weights_ready = *weights_ready_[run.parity][b];
    absl::Status s;
    if (options_.faults.weights_event_early) {
      s = device_.Record(weights_ready, *comm_);
      MarkWeightsRecorded(run, b);
    }
    {
      absl::MutexLock lock(&mu_);
      const auto queued = [&run, b]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return run.aborted || run.h2d_pending[b] == 0;
      };
      mu_.Await(absl::Condition(&queued));
      aborted = run.aborted;
    }
    // An aborted step's weights do not matter; on a node its all-gathers
    // still run (with whatever the buffers hold), as every rank's do.
    if (aborted && !NodeMode()) return;
    if (s.ok() && !aborted && owned_in_bucket_[b] > 0) {
      s = device_.Wait(*comm_, *h2d_done_[run.parity][b]);
    }
    // The kept tensors' weights replace what the servers sent for them.
    if (s.ok() && !aborted && !gpu_tensors_.empty()) {
      s = UpdateGpuTensors(run, b, target);
      if (s.ok()) s = CopyCapturedState(run, b);
    }
    if (s.ok() && collective_ != nullptr) {
      const ChunkSpan padded = partition_.padded_bucket(b);
      const ChunkSpan part = partition_.owned_padded(b, rank);
      s = collective_->AllGather(
          target + part.first * chunk_elems * weight_size_,
          target + padded.first * chunk_elems * weight_size_,
          part.size() * chunk_elems, job_.config().weight_dtype, *comm_);
    }
    if (s.ok() && !options_.faults.weights_event_early) {
      s = device_.Record(weights_ready, *comm_);
      MarkWeightsRecorded(run, b);
    }
    if (!s.ok()) return NodeMode() ? BreakNode(run, s) : Fail(run, s);
  }
  if (NodeMode()) {
    if (absl::Status s = QueueNodeVerdict(run); !s.ok()) {
      return BreakNode(run, s);
    }
  }
  absl::MutexLock lock(&mu_);
  collectives_through_ = run.step;
}

absl::Status TransferEngine::Impl::QueueNodeVerdict(StepRun& run) {
  bool failed;
  {
    absl::MutexLock lock(&mu_);
    // The outcome here is final only once every stream has ended: a rank
    // that reported success while its last stream still failed would go
    // on while the others roll back.
    const auto ended = [&run]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return run.streams_done;
    };
    mu_.Await(absl::Condition(&ended));
    failed = !run.error.ok();
  }
  float* flag = static_cast<float*>(node_flags_->data()) + run.parity;
  const float* value =
      static_cast<const float*>(node_constants_->data()) + (failed ? 1 : 0);
  absl::Status s = device_.CopyAsync(*comm_, flag, value, sizeof(float),
                                     CopyKind::kDeviceToDevice);
  if (s.ok()) s = collective_->AllReduceSum(flag, 1, *comm_);
  if (s.ok()) s = device_.Record(*node_verdict_[run.parity], *comm_);
  return s;
}

absl::Status TransferEngine::Impl::CheckNode() {
  while (!node_unchecked_.empty()) {
    const uint64_t step = node_unchecked_.front();
    node_unchecked_.pop_front();
    Event& verdict = *node_verdict_[step % 2];
    float failures = 0.0f;
    absl::Status s = device_.Wait(*node_read_, verdict);
    if (s.ok()) {
      s = device_.CopyAsync(
          *node_read_, &failures,
          static_cast<const float*>(node_flags_->data()) + step % 2,
          sizeof(float), CopyKind::kDeviceToHost);
    }
    if (s.ok()) s = device_.SynchronizeStream(*node_read_);
    if (!s.ok()) return s;
    // An all-reduce aborted while it waited read nothing.
    if (!CollectivesExpired().ok()) break;
    if (failures > 0.0f) {
      node_unchecked_.clear();
      return absl::AbortedError(absl::StrCat(
          "step ", step, " failed on ", static_cast<int>(failures),
          " other local rank(s) of this node, so the weights its "
          "all-gather gave this rank are not all the servers' (this rank's "
          "own part of the step went through): recover as from a failed "
          "step on every rank (Job::Reconcile; take the servers' weights)"));
    }
  }
  // Once the collectives were aborted no verdict says anything.
  absl::Status expired = CollectivesExpired();
  if (!expired.ok()) node_unchecked_.clear();
  return expired;
}

absl::Status TransferEngine::Impl::CheckNodeIdle(const char* what) {
  if (absl::Status s = CheckNoStepInFlight(what); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  return NodeBroken(what);
}

absl::Status TransferEngine::Impl::SynchronizeNode() {
  if (absl::Status s = CheckNodeIdle("SynchronizeNode"); !s.ok()) return s;
  if (!NodeMode()) return absl::OkStatus();
  return AnyRankFailed(false).status();
}

absl::StatusOr<uint64_t> TransferEngine::Impl::AgreeOnStep(uint64_t step) {
  if (absl::Status s = CheckNodeIdle("AgreeOnStep"); !s.ok()) return s;
  if (!NodeMode()) return step;
  // Four 16-bit parts, each exact as a float, gathered from every rank.
  constexpr int kParts = 4;
  float mine[kParts];
  for (int i = 0; i < kParts; ++i) {
    mine[i] = static_cast<float>((step >> (16 * i)) & 0xffff);
  }
  const uint32_t ranks = options_.local_ranks;
  std::vector<float> all(ranks * kParts, 0.0f);
  absl::StatusOr<std::unique_ptr<Buffer>> send = device_.Allocate(sizeof(mine));
  if (!send.ok()) return send.status();
  absl::StatusOr<std::unique_ptr<Buffer>> recv =
      device_.Allocate(all.size() * sizeof(float));
  if (!recv.ok()) return recv.status();
  absl::Status s = device_.CopyAsync(*comm_, (*send)->data(), mine,
                                     sizeof(mine), CopyKind::kHostToDevice);
  if (s.ok()) {
    s = collective_->AllGather((*send)->data(), (*recv)->data(), kParts,
                               DType::kFloat32, *comm_);
  }
  if (s.ok()) {
    s = device_.CopyAsync(*comm_, all.data(), (*recv)->data(),
                          all.size() * sizeof(float), CopyKind::kDeviceToHost);
  }
  if (absl::Status settled = SettleComm(s, /*collective=*/true);
      !settled.ok()) {
    return settled;
  }
  uint64_t least = UINT64_MAX;
  for (uint32_t r = 0; r < ranks; ++r) {
    uint64_t value = 0;
    for (int i = 0; i < kParts; ++i) {
      value |= static_cast<uint64_t>(all[r * kParts + i]) << (16 * i);
    }
    least = std::min(least, value);
  }
  return least;
}

absl::StatusOr<bool> TransferEngine::Impl::AnyRankFailed(bool failed) {
  float* flag = static_cast<float*>(node_flags_->data()) + 2;
  const float* constant =
      static_cast<const float*>(node_constants_->data()) + (failed ? 1 : 0);
  float sum = 0.0f;
  absl::Status s = device_.CopyAsync(*comm_, flag, constant, sizeof(float),
                                     CopyKind::kDeviceToDevice);
  if (s.ok()) s = collective_->AllReduceSum(flag, 1, *comm_);
  if (s.ok()) {
    s = device_.CopyAsync(*comm_, &sum, flag, sizeof(float),
                          CopyKind::kDeviceToHost);
  }
  if (absl::Status settled = SettleComm(s, /*collective=*/true);
      !settled.ok()) {
    return settled;
  }
  return sum > 0.0f;
}

bool TransferEngine::Impl::AwaitPreviousCollectives(StepRun& run) {
  absl::MutexLock lock(&mu_);
  const bool node = NodeMode();
  const auto done = [this, node, &run]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (node) {
      return collectives_through_ + 1 >= run.step || !node_broken_.empty();
    }
    return run.aborted || collectives_through_ + 1 >= run.step;
  };
  mu_.Await(absl::Condition(&done));
  return node ? node_broken_.empty() : !run.aborted;
}

void TransferEngine::Impl::JoinRun(StepRun& run) {
  for (std::thread* thread :
       {&run.step_thread, &run.comm_thread, &run.d2h_thread}) {
    if (thread->joinable()) thread->join();
  }
}

void TransferEngine::Impl::Drain() {
  for (Stream* stream : {comm_.get(), d2h_stream_.get(), h2d_stream_.get()}) {
    // Null when Init failed before making it.
    if (stream != nullptr) (void)device_.SynchronizeStream(*stream);
  }
  absl::MutexLock lock(&mu_);
  for (SlotRing* ring : {&d2h_, &h2d_}) {
    ring->free.clear();
    for (int i = ring->slots - 1; i >= 0; --i) ring->free.push_back(i);
  }
}

}  // namespace depot::gpu
