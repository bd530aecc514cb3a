// TransferEngine::Impl: the copies of a step, device to host into the pinned
// slots (RunDeviceToHost) and from the slots back to the device weights
// (Accept, QueueH2d), and the slots' reuse.
#include "gpu/transfer_engine_impl.h"

namespace depot::gpu {

using client_internal::WeightSink;

absl::Status TransferEngine::Impl::Accept(StepRun& run, uint64_t index,
                                          uint64_t bytes,
                                          const WeightSink::CopyWeights& copy) {
  if (sum_only_ && kept_of_chunk_[index].elems > 0) {
    bool received;
    {
      absl::MutexLock lock(&mu_);
      received = run.sum_received[index];
    }
    if (!received) {
      absl::Status status = absl::InternalError(absl::StrCat(
          "server sent the weights of chunk ", index,
          " without the GradSum of its tensors kept on the GPU (a server "
          "that does not know sum_only_tensors, or a chunk replayed after a "
          "retry, whose sum is gone)"));
      Fail(run, status);
      return status;
    }
  }
  const int slot = Acquire(run, h2d_);
  if (slot < 0) return Aborted(run);
  char* data = h2d_.slot(slot);
  const uint64_t bucket = partition_.BucketOfChunk(index);
  char* dst =
      WeightsTarget(run) + index * partition_.chunk_elems() * weight_size_;
  const bool fill_first = !options_.faults.h2d_before_fill;
  const uint64_t part = H2dPartBytes(bytes);
  absl::Status status;
  for (uint64_t offset = 0; status.ok() && offset < bytes;) {
    const uint64_t n = std::min(part, bytes - offset);
    if (fill_first) status = Fill(run, data, offset, n, copy);
    if (status.ok()) {
      status = QueueH2d(run, bucket, dst + offset, data + offset, n,
                        offset + n == bytes ? slot : -1);
    }
    offset += n;
  }
  if (status.ok() && !fill_first) status = Fill(run, data, 0, bytes, copy);
  if (!status.ok()) Fail(run, status);
  return status;
}

absl::Status TransferEngine::Impl::AcceptGradSum(
    StepRun& run, uint64_t index, const WeightSink::GradSum& sum) {
  const std::string& sums = sum.sums;
  const StepCommit& commit = sum.commit;
  const KeptChunk kept = sum_only_ ? kept_of_chunk_[index] : KeptChunk();
  // Without sums from the servers (one node), none; skipped tensors' sums
  // are zeros all the same.
  const uint64_t expected = sums_from_servers_ ? kept.elems * sizeof(float) : 0;
  absl::Status status;
  if (!sum_only_ || sums.size() != expected) {
    status = absl::InternalError(absl::StrCat(
        "server sent a GradSum of ", sums.size(), " bytes for chunk ", index,
        ", whose elements kept on the GPU need ", expected));
  } else {
    absl::MutexLock lock(&mu_);
    if (run.sum_received[index]) {
      status = absl::InternalError(
          absl::StrCat("server sent chunk ", index, "'s GradSum twice"));
    } else if (run.commit.has_value() &&
               (run.commit->skip != commit.skip ||
                (!commit.skip && run.commit->clip_coef != commit.clip_coef))) {
      status = absl::InternalError(absl::StrCat(
          "server applied another decision to chunk ", index, " (skip ",
          commit.skip, ", clip_coef ", commit.clip_coef, ") than to the step (",
          run.commit->skip, ", ", run.commit->clip_coef, ")"));
    }
    for (uint32_t t : sum.skipped_tensors) {
      if (t >= run.sum_skipped.size() || !kept_tensor_[t]) {
        status = absl::InternalError(
            absl::StrCat("server's GradSum of chunk ", index, " skips tensor ",
                         t, ", which is not kept on the GPU"));
        break;
      }
      run.sum_skipped[t] = true;
    }
    run.sum_received[index] = true;
    run.capture_wanted[index] = sum.capture_wanted;
    if (!run.commit.has_value()) run.commit = commit;
  }
  if (!status.ok()) {
    Fail(run, status);
    return status;
  }
  if (!sums_from_servers_) return absl::OkStatus();
  const int slot = Acquire(run, h2d_);
  if (slot < 0) return Aborted(run);
  char* data = h2d_.slot(slot);
  status = Fill(run, data, 0, sums.size(),
                [&sums](char* dst, uint64_t offset, uint64_t n) {
                  sums.copy(dst, n, offset);
                });
  if (status.ok()) {
    float* dst = KeptSums(run) + kept.state_offset;
    absl::MutexLock h2d_lock(&h2d_mu_);
    status = WaitBucketReadyOnce(run, partition_.BucketOfChunk(index));
    if (status.ok()) {
      status = device_.CopyAsync(*h2d_stream_, dst, data, sums.size(),
                                 CopyKind::kHostToDevice);
    }
    if (status.ok()) {
      status = device_.LaunchHostFunc(*h2d_stream_,
                                      [this, slot] { Free(h2d_, slot); });
    }
  }
  if (!status.ok()) Fail(run, status);
  return status;
}

uint64_t TransferEngine::Impl::H2dPartBytes(uint64_t bytes) {
  constexpr uint64_t kPage = 4096, kLeast = uint64_t{64} << 10;
  const uint64_t quarter = (bytes / 4 + kPage - 1) / kPage * kPage;
  return std::max(quarter, kLeast);
}

absl::Status TransferEngine::Impl::QueueH2d(StepRun& run, uint64_t bucket,
                                            char* dst, const char* src,
                                            uint64_t n, int slot) {
  absl::MutexLock h2d_lock(&h2d_mu_);
  absl::Status status = WaitBucketReadyOnce(run, bucket);
  if (status.ok()) {
    status =
        device_.CopyAsync(*h2d_stream_, dst, src, n, CopyKind::kHostToDevice);
  }
  if (!status.ok() || slot < 0) return status;
  if (options_.faults.h2d_slot_free_at_enqueue) {
    Free(h2d_, slot);
  } else {
    status = device_.LaunchHostFunc(*h2d_stream_,
                                    [this, slot] { Free(h2d_, slot); });
  }
  // The bucket's last chunk: its event is recorded before the count says
  // so, because the comm thread waits on the event once it does.
  bool last = false;
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    last = run.h2d_pending[bucket] == 1;
  }
  if (status.ok() && last) {
    status = device_.Record(*h2d_done_[run.parity][bucket], *h2d_stream_);
  }
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    --run.h2d_pending[bucket];
  }
  return status;
}

absl::Status TransferEngine::Impl::WaitBucketReadyOnce(StepRun& run,
                                                       uint64_t bucket) {
  bool first;
  {
    absl::MutexLock lock(&mu_);
    first = !run.h2d_waited[bucket];
    run.h2d_waited[bucket] = true;
  }
  // Backward may still read this bucket's weights until its ready point
  // (with the delayed update: the forward before it applied step - 2's
  // weights out of the buffer this step writes); the same holds for the
  // kept tensors' sums, which the previous step's update of the bucket read.
  if (!first) return absl::OkStatus();
  return device_.Wait(*h2d_stream_, *ready_[run.parity][bucket]);
}

absl::Status TransferEngine::Impl::Fill(StepRun& run, char* data,
                                        uint64_t offset, uint64_t n,
                                        const WeightSink::CopyWeights& copy) {
  if (absl::Status s =
          device_.CheckHostAccess(data + offset, n, /*write=*/true);
      !s.ok()) {
    Fail(run, s);
    return s;
  }
  copy(data + offset, offset, n);
  return absl::OkStatus();
}

int TransferEngine::Impl::Acquire(StepRun& run, SlotRing& ring) {
  absl::MutexLock lock(&mu_);
  const auto available = [&run, &ring]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return run.aborted || !ring.free.empty();
  };
  mu_.Await(absl::Condition(&available));
  if (run.aborted) return -1;
  const int slot = ring.free.back();
  ring.free.pop_back();
  return slot;
}

void TransferEngine::Impl::Free(SlotRing& ring, int slot) {
  absl::MutexLock lock(&mu_);
  ring.free.push_back(slot);
}

void TransferEngine::Impl::ReleaseD2h(StepRun& run, uint64_t index) {
  int slot;
  {
    absl::MutexLock lock(&mu_);
    slot = run.d2h_slot_of_chunk[index];
    run.d2h_slot_of_chunk[index] = -1;
    if (slot >= 0) --run.route_in_slots[RouteOfChunk(run, index)];
  }
  if (slot < 0) return;
  // gRPC read the slot until now: no copy may have been writing it.
  if (absl::Status s = device_.CheckHostAccess(
          d2h_.slot(slot), job_.plan().chunk(index).size() * grad_size_,
          /*write=*/false);
      !s.ok()) {
    Fail(run, s);
  }
  if (!options_.faults.d2h_slot_free_at_handoff) Free(d2h_, slot);
}

void TransferEngine::Impl::HandOff(StepRun& run, uint64_t index, int slot) {
  const uint64_t bytes = job_.plan().chunk(index).size() * grad_size_;
  if (absl::Status s =
          device_.CheckHostAccess(d2h_.slot(slot), bytes, /*write=*/false);
      !s.ok()) {
    Fail(run, s);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    run.d2h_slot_of_chunk[index] = slot;
    if (options_.faults.d2h_slot_free_at_handoff) d2h_.free.push_back(slot);
  }
  run.queues[RouteOfChunk(run, index)]->Push(index, d2h_.slot(slot));
}

char* TransferEngine::Impl::WeightsTarget(const StepRun& run) const {
  return static_cast<char*>(
      (options_.delayed_update ? incoming_[run.parity] : live_)->data());
}

void TransferEngine::Impl::MarkWeightsRecorded(StepRun& run, uint64_t bucket) {
  absl::MutexLock lock(&mu_);
  run.weights_recorded[bucket] = true;
}

void TransferEngine::Impl::RunDeviceToHost(StepRun& run) {
  // A bucket whose turn has come and that has chunks left.
  struct Turn {
    uint64_t bucket;
    uint64_t next, end;     // its owned chunks not yet copied
    bool waited = false;    // its event's wait is queued
    bool complete = false;  // its event was seen reached
  };
  // How many later buckets are looked at for a chunk: bounds the event
  // queries per chunk.
  constexpr size_t kLookahead = 16;
  const uint64_t buckets = partition_.num_buckets();
  if (collective_ == nullptr && !AwaitPreviousCollectives(run)) return;
  const std::vector<uint64_t>& order =
      collective_ != nullptr ? run.d2h_order : run.ready_order;
  std::deque<Turn> turns;
  size_t taken = 0;  // entries of `order` taken into turns
  const auto take = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (; taken < order.size(); ++taken) {
      const uint64_t b = order[taken];
      const ChunkSpan owned = partition_.owned(b, options_.local_rank);
      if (!owned.empty()) turns.push_back(Turn{b, owned.first, owned.end});
    }
  };
  while (true) {
    // A bucket with chunks left first, then a slot: a slot is never held
    // while waiting for a bucket (with the delayed update the next step's
    // D2H waits for this step's, which needs every slot).
    {
      absl::MutexLock lock(&mu_);
      take();
      const auto more = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return run.aborted || order.size() > taken;
      };
      while (turns.empty() && taken < buckets) {
        mu_.Await(absl::Condition(&more));
        if (run.aborted) return;
        take();
      }
    }
    if (turns.empty()) return;  // every chunk is queued
    const int slot = Acquire(run, d2h_);
    if (slot < 0) return;
    std::vector<int> in_slots;
    {
      absl::MutexLock lock(&mu_);
      take();  // buckets named while waiting for the slot
      in_slots = run.route_in_slots;
    }
    size_t pick = 0;
    for (size_t i = 1; i < turns.size() && i <= kLookahead; ++i) {
      Turn& turn = turns[i];
      if (!turn.complete) {
        absl::StatusOr<bool> reached =
            device_.Query(D2hEvent(run, turn.bucket));
        turn.complete = reached.ok() && *reached;
      }
      if (turn.complete && in_slots[RouteOfChunk(run, turn.next)] <
                               in_slots[RouteOfChunk(run, turns[pick].next)]) {
        pick = i;
      }
    }
    Turn& turn = turns[pick];
    const uint64_t c = turn.next++;
    absl::Status s;
    if (!turn.waited && !options_.faults.d2h_skip_ready_wait) {
      s = device_.Wait(*d2h_stream_, D2hEvent(run, turn.bucket));
    }
    turn.waited = true;
    {
      absl::MutexLock lock(&mu_);
      ++run.route_in_slots[RouteOfChunk(run, c)];
    }
    const uint64_t bytes = job_.plan().chunk(c).size() * grad_size_;
    if (s.ok()) {
      s = device_.CopyAsync(
          *d2h_stream_, d2h_.slot(slot),
          run.grads + c * partition_.chunk_elems() * grad_size_, bytes,
          CopyKind::kDeviceToHost);
    }
    if (s.ok()) {
      s = device_.LaunchHostFunc(
          *d2h_stream_, [this, &run, c, slot] { HandOff(run, c, slot); });
    }
    if (!s.ok()) return Fail(run, s);
    if (turn.next == turn.end) turns.erase(turns.begin() + pick);
  }
}

Event& TransferEngine::Impl::D2hEvent(const StepRun& run,
                                      uint64_t bucket) const {
  return collective_ != nullptr ? *rs_done_[run.parity][bucket]
                                : *ready_[run.parity][bucket];
}

}  // namespace depot::gpu
