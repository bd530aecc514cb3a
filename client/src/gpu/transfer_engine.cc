#include "gpu/transfer_engine.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "job_impl.h"
#include "step_stream.h"

namespace depot::gpu {
namespace {

using client_internal::ChunkFeed;
using client_internal::StreamedStep;
using client_internal::WeightSink;

// One Step stream's chunks, pushed by the D2H stream's host functions as
// their copies finish, popped by the stream's writer.
class ChunkQueue : public ChunkFeed {
 public:
  explicit ChunkQueue(std::function<void(uint64_t)> released)
      : released_(std::move(released)) {}

  void Push(uint64_t index, const char* data) {
    absl::MutexLock lock(&mu_);
    ready_.push_back(Ready{index, data});
  }
  void Abort() {
    absl::MutexLock lock(&mu_);
    aborted_ = true;
  }

  std::optional<Ready> Next() override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &ChunkQueue::HasWorkOrAborted));
    if (aborted_) return std::nullopt;
    Ready ready = ready_.front();
    ready_.pop_front();
    return ready;
  }
  void Released(uint64_t index) override { released_(index); }

 private:
  bool HasWorkOrAborted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return aborted_ || !ready_.empty();
  }

  const std::function<void(uint64_t)> released_;
  absl::Mutex mu_;
  std::deque<Ready> ready_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
};

// A ring of equal pinned slots; Acquire blocks until one is free.
struct SlotRing {
  std::unique_ptr<Buffer> memory;
  size_t slot_bytes = 0;
  std::vector<int> free;  // guarded by the engine's mu_
  int slots = 0;
  char* slot(int i) const {
    return static_cast<char*>(memory->data()) + i * slot_bytes;
  }
};

}  // namespace

class TransferEngine::Impl : public WeightSink {
 public:
  Impl(Job& job, Device& device, Collective* collective,
       TransferEngineOptions options, NodePartition partition)
      : job_(job),
        device_(device),
        collective_(collective),
        options_(options),
        partition_(partition),
        grad_size_(DTypeSize(job.config().grad_dtype)),
        weight_size_(DTypeSize(job.config().weight_dtype)) {}

  ~Impl() override {
    if (in_step_) {
      Fail(absl::CancelledError("the transfer engine was destroyed"));
      JoinStep();
      Drain();
    }
  }

  absl::Status Init() {
    const uint64_t padded = partition_.padded_elems();
    const uint64_t chunk = partition_.chunk_elems();
    absl::StatusOr<std::unique_ptr<Buffer>> buffer =
        device_.Allocate(padded * grad_size_);
    if (!buffer.ok()) return buffer.status();
    grads_ = *std::move(buffer);
    buffer = device_.Allocate(padded * weight_size_);
    if (!buffer.ok()) return buffer.status();
    weights_ = *std::move(buffer);
    for (auto [ring, slots, size] :
         {std::tuple{&d2h_, options_.d2h_slots, grad_size_},
          std::tuple{&h2d_, options_.h2d_slots, weight_size_}}) {
      ring->slots = slots;
      ring->slot_bytes = chunk * size;
      buffer = device_.AllocatePinned(ring->slot_bytes * slots);
      if (!buffer.ok()) return buffer.status();
      ring->memory = *std::move(buffer);
      for (int i = slots - 1; i >= 0; --i) ring->free.push_back(i);
    }
    for (std::unique_ptr<Stream>* stream : {&comm_, &d2h_stream_, &h2d_stream_}) {
      absl::StatusOr<std::unique_ptr<Stream>> created = device_.CreateStream();
      if (!created.ok()) return created.status();
      *stream = *std::move(created);
    }
    const uint64_t buckets = partition_.num_buckets();
    for (auto* events : {&ready_, &rs_done_, &h2d_done_, &weights_ready_}) {
      for (uint64_t b = 0; b < buckets; ++b) {
        absl::StatusOr<std::unique_ptr<Event>> event = device_.CreateEvent();
        if (!event.ok()) return event.status();
        events->push_back(*std::move(event));
      }
    }
    // This rank's chunks, dealt to its streams: per server, round-robin.
    const ShardPlan& plan = job_.plan();
    route_of_chunk_.assign(plan.num_chunks(), UINT32_MAX);
    d2h_slot_of_chunk_.assign(plan.num_chunks(), -1);
    owned_in_bucket_.assign(buckets, 0);
    std::vector<std::vector<uint32_t>> server_routes(plan.num_servers());
    std::vector<uint64_t> dealt(plan.num_servers(), 0);
    for (uint64_t b = 0; b < buckets; ++b) {
      const ChunkSpan owned = partition_.owned(b, options_.local_rank);
      owned_in_bucket_[b] = owned.size();
      for (uint64_t c = owned.first; c < owned.end; ++c) {
        const uint32_t server = plan.ServerOfChunk(c);
        std::vector<uint32_t>& mine = server_routes[server];
        const uint64_t k = dealt[server]++ % options_.streams_per_server;
        if (k == mine.size()) {
          mine.push_back(static_cast<uint32_t>(routes_.size()));
          StreamedStep::Route route;
          route.server = server;
          route.first_chunk = plan.shard(server).first_chunk;
          route.end_chunk = plan.shard(server).end_chunk;
          routes_.push_back(route);
        }
        route_of_chunk_[c] = mine[k];
        ++routes_[mine[k]].chunks;
      }
    }
    return absl::OkStatus();
  }

  const NodePartition& partition() const { return partition_; }
  void* grads() const { return grads_->data(); }
  void* weights() const { return weights_->data(); }
  uint64_t pinned_bytes() const {
    return d2h_.memory->bytes() + h2d_.memory->bytes();
  }

  absl::Status BeginStep(uint64_t step, const StepOptions& options) {
    if (in_step_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "BeginStep(", step, "): step ", step_,
          " is in flight (call FinishStep first)"));
    }
    if (!options.weight_overrides.empty()) {
      return absl::InvalidArgumentError(
          "BeginStep: weight_overrides are not supported on GPU workers; "
          "write the new weights into the engine's weights() and the "
          "servers' with Job::Step's overrides on a host step");
    }
    const uint64_t buckets = partition_.num_buckets();
    {
      absl::MutexLock lock(&mu_);
      error_ = absl::OkStatus();
      aborted_ = false;
      ready_order_.clear();
      d2h_order_.clear();
      named_.assign(buckets, false);
      weights_recorded_.assign(buckets, false);
      h2d_waited_.assign(buckets, false);
      h2d_pending_ = owned_in_bucket_;
    }
    step_ = step;
    options_copy_ = options;
    in_step_ = true;
    queues_.clear();
    StreamedStep streamed;
    streamed.step = step;
    streamed.options = &options_copy_;
    if (options_.local_ranks > 1) {
      streamed.local_ranks = options_.local_ranks;
      streamed.local_rank = options_.local_rank;
      streamed.bucket_chunks = partition_.bucket_chunks();
    }
    streamed.sink = this;
    for (const StreamedStep::Route& route : routes_) {
      queues_.push_back(std::make_unique<ChunkQueue>(
          [this](uint64_t index) { ReleaseD2h(index); }));
      streamed.routes.push_back(route);
      streamed.routes.back().feed = queues_.back().get();
    }
    step_result_ = StepResult();
    step_thread_ = std::thread([this, streamed = std::move(streamed)] {
      absl::Status status =
          client_internal::RunStreamedStep(job_, streamed, &step_result_);
      if (!status.ok()) Fail(status);
    });
    comm_thread_ = std::thread([this] { RunCollectives(); });
    d2h_thread_ = std::thread([this] { RunDeviceToHost(); });
    return absl::OkStatus();
  }

  absl::Status GradientsReady(uint64_t bucket, Stream& stream) {
    if (!in_step_) {
      return absl::FailedPreconditionError(
          "GradientsReady: no step in flight (call BeginStep first)");
    }
    if (bucket >= partition_.num_buckets()) {
      return absl::InvalidArgumentError(
          absl::StrCat("GradientsReady: bucket ", bucket, " of ",
                       partition_.num_buckets()));
    }
    {
      absl::MutexLock lock(&mu_);
      if (!error_.ok()) return error_;
      if (named_[bucket]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "GradientsReady: bucket ", bucket, " was named twice in step ",
            step_));
      }
    }
    if (absl::Status s = device_.Record(*ready_[bucket], stream); !s.ok()) {
      Fail(s);
      return s;
    }
    if (options_.faults.wait_on_compute_stream) {
      (void)device_.Wait(stream, *ready_[bucket]);
    }
    absl::MutexLock lock(&mu_);
    named_[bucket] = true;
    ready_order_.push_back(bucket);
    return absl::OkStatus();
  }

  absl::Status WaitWeights(uint64_t bucket, Stream& stream) {
    if (bucket >= partition_.num_buckets()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "WaitWeights: bucket ", bucket, " of ", partition_.num_buckets()));
    }
    if (in_step_) {
      absl::MutexLock lock(&mu_);
      if (!named_[bucket]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "WaitWeights: bucket ", bucket, " of step ", step_,
            " has not been named by GradientsReady"));
      }
      const auto recorded = [this, bucket]()
                                ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return aborted_ || weights_recorded_[bucket];
      };
      mu_.Await(absl::Condition(&recorded));
      if (!error_.ok()) return error_;
    }
    return device_.Wait(stream, *weights_ready_[bucket]);
  }

  absl::StatusOr<StepResult> FinishStep() {
    if (!in_step_) {
      return absl::FailedPreconditionError("FinishStep: no step in flight");
    }
    std::vector<uint64_t> missing;
    {
      absl::MutexLock lock(&mu_);
      for (uint64_t b = 0; b < named_.size(); ++b) {
        if (!named_[b]) missing.push_back(b);
      }
    }
    if (!missing.empty()) {
      Fail(absl::FailedPreconditionError(absl::StrCat(
          "FinishStep: step ", step_, " ended before GradientsReady named ",
          missing.size() == 1 ? "bucket " : "buckets ",
          absl::StrJoin(missing, ", "))));
    }
    JoinStep();
    in_step_ = false;
    absl::Status error;
    {
      absl::MutexLock lock(&mu_);
      error = error_;
    }
    if (!error.ok()) {
      Drain();
      return error;
    }
    return step_result_;
  }

  // WeightSink: a chunk's weights, on a stream's reader thread.
  absl::Status Accept(uint64_t index, uint64_t bytes,
                      const std::function<void(char*)>& copy) override {
    const int slot = Acquire(h2d_);
    if (slot < 0) return Aborted();
    char* data = h2d_.slot(slot);
    const uint64_t bucket = partition_.BucketOfChunk(index);
    char* dst = static_cast<char*>(weights_->data()) +
                index * partition_.chunk_elems() * weight_size_;
    if (!options_.faults.h2d_before_fill) {
      if (absl::Status s = Fill(data, bytes, copy); !s.ok()) return s;
    }
    absl::Status status;
    {
      absl::MutexLock h2d_lock(&h2d_mu_);
      bool wait_ready;
      {
        absl::MutexLock lock(&mu_);
        wait_ready = !h2d_waited_[bucket];
        h2d_waited_[bucket] = true;
      }
      // Backward may still read this bucket's weights until its ready point.
      if (wait_ready) status = device_.Wait(*h2d_stream_, *ready_[bucket]);
      if (status.ok()) {
        status = device_.CopyAsync(*h2d_stream_, dst, data, bytes,
                                   CopyKind::kHostToDevice);
      }
      if (status.ok()) {
        if (options_.faults.h2d_slot_free_at_enqueue) {
          Free(h2d_, slot);
        } else {
          status = device_.LaunchHostFunc(*h2d_stream_,
                                          [this, slot] { Free(h2d_, slot); });
        }
      }
      // The bucket's last chunk: its event is recorded before the count
      // says so, because the comm thread waits on the event once it does.
      bool last = false;
      if (status.ok()) {
        absl::MutexLock lock(&mu_);
        last = h2d_pending_[bucket] == 1;
      }
      if (status.ok() && last) {
        status = device_.Record(*h2d_done_[bucket], *h2d_stream_);
      }
      if (status.ok()) {
        absl::MutexLock lock(&mu_);
        --h2d_pending_[bucket];
      }
    }
    if (status.ok() && options_.faults.h2d_before_fill) {
      status = Fill(data, bytes, copy);
    }
    if (!status.ok()) Fail(status);
    return status;
  }

 private:
  absl::Status Fill(char* data, uint64_t bytes,
                    const std::function<void(char*)>& copy) {
    if (absl::Status s = device_.CheckHostAccess(data, bytes, /*write=*/true);
        !s.ok()) {
      Fail(s);
      return s;
    }
    copy(data);
    return absl::OkStatus();
  }

  absl::Status Aborted() {
    absl::MutexLock lock(&mu_);
    return error_.ok() ? absl::AbortedError("the step was aborted") : error_;
  }

  // The step's first error; stops every thread of the step.
  void Fail(const absl::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (error_.ok()) error_ = status;
      aborted_ = true;
    }
    for (const std::unique_ptr<ChunkQueue>& queue : queues_) queue->Abort();
  }

  // A free slot of `ring`, or -1 once the step is aborted.
  int Acquire(SlotRing& ring) {
    absl::MutexLock lock(&mu_);
    const auto available = [this, &ring]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return aborted_ || !ring.free.empty();
    };
    mu_.Await(absl::Condition(&available));
    if (aborted_) return -1;
    const int slot = ring.free.back();
    ring.free.pop_back();
    return slot;
  }

  void Free(SlotRing& ring, int slot) {
    absl::MutexLock lock(&mu_);
    ring.free.push_back(slot);
  }

  // gRPC let go of chunk `index`'s D2H slot.
  void ReleaseD2h(uint64_t index) {
    int slot;
    {
      absl::MutexLock lock(&mu_);
      slot = d2h_slot_of_chunk_[index];
      d2h_slot_of_chunk_[index] = -1;
    }
    if (slot < 0) return;
    // gRPC read the slot until now: no copy may have been writing it.
    if (absl::Status s = device_.CheckHostAccess(
            d2h_.slot(slot), job_.plan().chunk(index).size() * grad_size_,
            /*write=*/false);
        !s.ok()) {
      Fail(s);
    }
    if (!options_.faults.d2h_slot_free_at_handoff) Free(d2h_, slot);
  }

  // On the D2H stream's host thread, once chunk `index` is in slot `slot`.
  void HandOff(uint64_t index, int slot) {
    const uint64_t bytes = job_.plan().chunk(index).size() * grad_size_;
    if (absl::Status s =
            device_.CheckHostAccess(d2h_.slot(slot), bytes, /*write=*/false);
        !s.ok()) {
      Fail(s);
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      d2h_slot_of_chunk_[index] = slot;
      if (options_.faults.d2h_slot_free_at_handoff) d2h_.free.push_back(slot);
    }
    queues_[route_of_chunk_[index]]->Push(index, d2h_.slot(slot));
  }

  // Waits until `list` has more than `i` entries; nullopt once aborted.
  std::optional<uint64_t> Nth(const std::vector<uint64_t>& list, size_t i) {
    absl::MutexLock lock(&mu_);
    const auto there = [this, &list, i]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return aborted_ || list.size() > i;
    };
    mu_.Await(absl::Condition(&there));
    if (aborted_) return std::nullopt;
    return list[i];
  }

  // The comm stream's work: every bucket's reduce-scatter in the order
  // GradientsReady named them, then every bucket's all-gather in that order.
  void RunCollectives() {
    const uint64_t buckets = partition_.num_buckets();
    const uint32_t rank = options_.local_rank;
    const uint64_t chunk_elems = partition_.chunk_elems();
    for (size_t i = 0; i < buckets; ++i) {
      const std::optional<uint64_t> b = Nth(ready_order_, i);
      if (!b.has_value()) return;
      if (collective_ != nullptr) {
        const ChunkSpan padded = partition_.padded_bucket(*b);
        const ChunkSpan part = partition_.owned_padded(*b, rank);
        char* base = static_cast<char*>(grads_->data());
        absl::Status s = device_.Wait(*comm_, *ready_[*b]);
        if (s.ok()) {
          s = collective_->ReduceScatterSum(
              base + padded.first * chunk_elems * grad_size_,
              base + part.first * chunk_elems * grad_size_,
              part.size() * chunk_elems, job_.config().grad_dtype, *comm_);
        }
        if (s.ok()) s = device_.Record(*rs_done_[*b], *comm_);
        if (!s.ok()) return Fail(s);
      }
      absl::MutexLock lock(&mu_);
      d2h_order_.push_back(*b);
    }
    for (size_t i = 0; i < buckets; ++i) {
      uint64_t b;
      {
        absl::MutexLock lock(&mu_);
        b = ready_order_[i];  // complete: the first loop read every entry
      }
      absl::Status s;
      if (options_.faults.weights_event_early) {
        s = device_.Record(*weights_ready_[b], *comm_);
        MarkWeightsRecorded(b);
      }
      {
        absl::MutexLock lock(&mu_);
        const auto queued = [this, b]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return aborted_ || h2d_pending_[b] == 0;
        };
        mu_.Await(absl::Condition(&queued));
        if (aborted_) return;
      }
      if (s.ok() && owned_in_bucket_[b] > 0) {
        s = device_.Wait(*comm_, *h2d_done_[b]);
      }
      if (s.ok() && collective_ != nullptr) {
        const ChunkSpan padded = partition_.padded_bucket(b);
        const ChunkSpan part = partition_.owned_padded(b, rank);
        char* base = static_cast<char*>(weights_->data());
        s = collective_->AllGather(
            base + part.first * chunk_elems * weight_size_,
            base + padded.first * chunk_elems * weight_size_,
            part.size() * chunk_elems, job_.config().weight_dtype, *comm_);
      }
      if (s.ok() && !options_.faults.weights_event_early) {
        s = device_.Record(*weights_ready_[b], *comm_);
        MarkWeightsRecorded(b);
      }
      if (!s.ok()) return Fail(s);
    }
  }

  void MarkWeightsRecorded(uint64_t bucket) {
    absl::MutexLock lock(&mu_);
    weights_recorded_[bucket] = true;
  }

  // The D2H stream's work: each bucket's owned chunks into free slots, in the
  // order the reduce-scatters were queued.
  void RunDeviceToHost() {
    const uint64_t buckets = partition_.num_buckets();
    const char* grads = static_cast<const char*>(grads_->data());
    for (size_t i = 0; i < buckets; ++i) {
      const std::optional<uint64_t> b = Nth(d2h_order_, i);
      if (!b.has_value()) return;
      const ChunkSpan owned = partition_.owned(*b, options_.local_rank);
      if (owned.empty()) continue;
      absl::Status s;
      if (!options_.faults.d2h_skip_ready_wait) {
        s = device_.Wait(*d2h_stream_, collective_ != nullptr ? *rs_done_[*b]
                                                              : *ready_[*b]);
      }
      for (uint64_t c = owned.first; s.ok() && c < owned.end; ++c) {
        const int slot = Acquire(d2h_);
        if (slot < 0) return;
        const uint64_t bytes = job_.plan().chunk(c).size() * grad_size_;
        s = device_.CopyAsync(
            *d2h_stream_, d2h_.slot(slot),
            grads + c * partition_.chunk_elems() * grad_size_, bytes,
            CopyKind::kDeviceToHost);
        if (s.ok()) {
          s = device_.LaunchHostFunc(*d2h_stream_,
                                     [this, c, slot] { HandOff(c, slot); });
        }
      }
      if (!s.ok()) return Fail(s);
    }
  }

  void JoinStep() {
    for (std::thread* thread : {&step_thread_, &comm_thread_, &d2h_thread_}) {
      if (thread->joinable()) thread->join();
    }
  }

  // After a failed step: lets the queued device work run out, then frees
  // every slot (none is in use once the streams are idle and gRPC has
  // released every slice, which the step's end waited for).
  void Drain() {
    for (Stream* stream : {comm_.get(), d2h_stream_.get(), h2d_stream_.get()}) {
      (void)device_.SynchronizeStream(*stream);
    }
    absl::MutexLock lock(&mu_);
    for (SlotRing* ring : {&d2h_, &h2d_}) {
      ring->free.clear();
      for (int i = ring->slots - 1; i >= 0; --i) ring->free.push_back(i);
    }
    std::fill(d2h_slot_of_chunk_.begin(), d2h_slot_of_chunk_.end(), -1);
  }

  Job& job_;
  Device& device_;
  Collective* const collective_;
  const TransferEngineOptions options_;
  const NodePartition partition_;
  const size_t grad_size_;
  const size_t weight_size_;

  std::unique_ptr<Buffer> grads_, weights_;
  SlotRing d2h_, h2d_;
  std::unique_ptr<Stream> comm_, d2h_stream_, h2d_stream_;
  std::vector<std::unique_ptr<Event>> ready_, rs_done_, h2d_done_,
      weights_ready_;
  std::vector<StreamedStep::Route> routes_;  // feeds unset
  std::vector<uint32_t> route_of_chunk_;
  std::vector<uint64_t> owned_in_bucket_;

  // The trainer thread's.
  bool in_step_ = false;
  uint64_t step_ = 0;
  StepOptions options_copy_;
  std::vector<std::unique_ptr<ChunkQueue>> queues_;
  StepResult step_result_;  // the step thread's until joined
  std::thread step_thread_, comm_thread_, d2h_thread_;

  absl::Mutex h2d_mu_;  // orders each chunk's H2D work on the stream
  absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<uint64_t> ready_order_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> d2h_order_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> named_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> weights_recorded_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> h2d_waited_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> h2d_pending_ ABSL_GUARDED_BY(mu_);
  std::vector<int> d2h_slot_of_chunk_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<TransferEngine>> TransferEngine::Create(
    Job& job, Device& device, Collective* collective,
    TransferEngineOptions options) {
  if (options.local_ranks == 0 || options.local_rank >= options.local_ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("TransferEngine: local_rank ", options.local_rank,
                     " of ", options.local_ranks, " local ranks"));
  }
  if (options.local_ranks > 1 &&
      (collective == nullptr ||
       collective->size() != static_cast<int>(options.local_ranks) ||
       collective->rank() != static_cast<int>(options.local_rank))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TransferEngine: local rank ", options.local_rank, " of ",
        options.local_ranks,
        " needs the node's collective with that rank and size"));
  }
  if (options.d2h_slots < 1 || options.h2d_slots < 1 ||
      options.streams_per_server < 1) {
    return absl::InvalidArgumentError(
        "TransferEngine: d2h_slots, h2d_slots and streams_per_server must be "
        ">= 1");
  }
  if (options.bucket_chunks == 0) {
    options.bucket_chunks = uint64_t{4} * options.local_ranks;
  }
  absl::StatusOr<NodePartition> partition = NodePartition::Create(
      job.plan(), options.local_ranks, options.bucket_chunks);
  if (!partition.ok()) return partition.status();
  auto impl = std::make_unique<Impl>(
      job, device, options.local_ranks > 1 ? collective : nullptr, options,
      *partition);
  if (absl::Status s = impl->Init(); !s.ok()) return s;
  return std::unique_ptr<TransferEngine>(new TransferEngine(std::move(impl)));
}

TransferEngine::TransferEngine(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
TransferEngine::~TransferEngine() = default;

const NodePartition& TransferEngine::partition() const {
  return impl_->partition();
}
void* TransferEngine::grads() const { return impl_->grads(); }
void* TransferEngine::weights() const { return impl_->weights(); }
uint64_t TransferEngine::pinned_bytes() const { return impl_->pinned_bytes(); }
absl::Status TransferEngine::BeginStep(uint64_t step,
                                       const StepOptions& options) {
  return impl_->BeginStep(step, options);
}
absl::Status TransferEngine::GradientsReady(uint64_t bucket, Stream& stream) {
  return impl_->GradientsReady(bucket, stream);
}
absl::Status TransferEngine::WaitWeights(uint64_t bucket, Stream& stream) {
  return impl_->WaitWeights(bucket, stream);
}
absl::StatusOr<StepResult> TransferEngine::FinishStep() {
  return impl_->FinishStep();
}

}  // namespace depot::gpu
