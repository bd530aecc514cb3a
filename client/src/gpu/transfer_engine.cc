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
#include "server/step_hparams.h"
#include "server/step_numerics.h"
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

class TransferEngine::Impl {
 public:
  // A kept tensor's elements in a run of this rank's chunks (offload
  // fraction), and where their state lives.
  struct KeptSegment {
    uint64_t begin = 0, end = 0;  // flat range
    uint32_t tensor = 0;
    uint32_t group = 0;
    uint64_t state_offset = 0;  // element offset in the state arrays
  };

  // One step's transfers: its streams, threads and progress. With the delayed
  // update two are in flight: the older one's round trip while the newer
  // one's backward runs.
  struct StepRun : public WeightSink {
    Impl* engine = nullptr;
    uint64_t step = 0;
    int parity = 0;       // which set of per-bucket events
    char* grads = nullptr;  // the gradient buffer this step reads
    StepOptions options;
    bool two_phase = false;  // its routes are routes_two_phase_
    // Offload fraction: per kept tensor, the update's hyperparameters, or
    // nullopt when it is not updated this step (no gradient, or skipped).
    std::vector<std::optional<UpdateHyperParams>> gpu_hparams;
    GradientInput gpu_grad;  // dtype, unscale and clip of the kept updates
    std::vector<std::unique_ptr<ChunkQueue>> queues;
    StepResult result;  // the step thread's until joined
    std::thread step_thread, comm_thread, d2h_thread;

    // Guarded by the engine's mu_.
    absl::Status error;
    bool aborted = false;
    std::vector<uint64_t> ready_order, d2h_order;
    std::vector<bool> named, weights_recorded, h2d_waited;
    std::vector<uint64_t> h2d_pending;
    std::vector<int> d2h_slot_of_chunk;
    // Per route of the step: its chunks queued for D2H or in a D2H slot.
    std::vector<int> route_in_slots;

    absl::Status Accept(uint64_t index, uint64_t bytes,
                        const CopyWeights& copy) override {
      return engine->Accept(*this, index, bytes, copy);
    }
  };


  Impl(Job& job, Device& device, Collective* collective,
       TransferEngineOptions options, NodePartition partition)
      : job_(job),
        device_(device),
        collective_(collective),
        options_(options),
        partition_(partition),
        grad_size_(DTypeSize(job.config().grad_dtype)),
        weight_size_(DTypeSize(job.config().weight_dtype)) {}

  ~Impl() {
    for (std::unique_ptr<StepRun>& run : runs_) {
      Fail(*run, absl::CancelledError("the transfer engine was destroyed"));
    }
    for (std::unique_ptr<StepRun>& run : runs_) JoinRun(*run);
    if (!runs_.empty()) Drain();
  }

  absl::Status Init() {
    const uint64_t padded = partition_.padded_elems();
    const uint64_t chunk = partition_.chunk_elems();
    const bool dpu = options_.delayed_update;
    for (int i = 0; i < (dpu ? 2 : 1); ++i) {
      absl::StatusOr<std::unique_ptr<Buffer>> buffer =
          device_.Allocate(padded * grad_size_);
      if (!buffer.ok()) return buffer.status();
      grads_[i] = *std::move(buffer);
    }
    for (int i = 0; i < (dpu ? 3 : 1); ++i) {
      absl::StatusOr<std::unique_ptr<Buffer>> buffer =
          device_.Allocate(padded * weight_size_);
      if (!buffer.ok()) return buffer.status();
      (i == 0 ? live_ : incoming_[i - 1]) = *std::move(buffer);
    }
    for (auto [ring, slots, size] :
         {std::tuple{&d2h_, options_.d2h_slots, grad_size_},
          std::tuple{&h2d_, options_.h2d_slots, weight_size_}}) {
      ring->slots = slots;
      ring->slot_bytes = chunk * size;
      absl::StatusOr<std::unique_ptr<Buffer>> buffer =
          device_.AllocatePinned(ring->slot_bytes * slots);
      if (!buffer.ok()) return buffer.status();
      ring->memory = *std::move(buffer);
      for (int i = slots - 1; i >= 0; --i) ring->free.push_back(i);
    }
    for (std::unique_ptr<Stream>* stream :
         {&comm_, &d2h_stream_, &h2d_stream_}) {
      absl::StatusOr<std::unique_ptr<Stream>> created = device_.CreateStream();
      if (!created.ok()) return created.status();
      *stream = *std::move(created);
    }
    const uint64_t buckets = partition_.num_buckets();
    std::vector<std::vector<std::unique_ptr<Event>>*> sets;
    for (int p = 0; p < 2; ++p) {
      for (auto* events :
           {&ready_[p], &rs_done_[p], &h2d_done_[p], &weights_ready_[p]}) {
        sets.push_back(events);
      }
    }
    for (auto* events : sets) {
      for (uint64_t b = 0; b < buckets; ++b) {
        absl::StatusOr<std::unique_ptr<Event>> event = device_.CreateEvent();
        if (!event.ok()) return event.status();
        events->push_back(*std::move(event));
      }
    }
    applied_step_.assign(buckets, 0);
    // This rank's chunks, dealt to its streams: per server, round-robin.
    const ShardPlan& plan = job_.plan();
    route_of_chunk_.assign(plan.num_chunks(), UINT32_MAX);
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
    if (absl::Status s = InitGpuTensors(); !s.ok()) return s;
    // A two-phase step: one stream to every server with chunks, also where
    // this rank owns none (it still receives the GradStats and commits).
    route_two_phase_of_chunk_.assign(plan.num_chunks(), UINT32_MAX);
    for (uint32_t server = 0; server < plan.num_servers(); ++server) {
      const ShardRange& shard = plan.shard(server);
      if (shard.num_chunks() == 0) continue;
      StreamedStep::Route route;
      route.server = server;
      route.first_chunk = shard.first_chunk;
      route.end_chunk = shard.end_chunk;
      for (uint64_t c = shard.first_chunk; c < shard.end_chunk; ++c) {
        if (partition_.OwnerOfChunk(c) != options_.local_rank) continue;
        route_two_phase_of_chunk_[c] =
            static_cast<uint32_t>(routes_two_phase_.size());
        ++route.chunks;
      }
      routes_two_phase_.push_back(route);
    }
    return absl::OkStatus();
  }

  // The offload fraction's tensors: which, their segments in this rank's
  // chunks, and their state in device memory, read from the servers.
  absl::Status InitGpuTensors() {
    if (options_.offload_fraction >= 1.0) return absl::OkStatus();
    const JobConfig& config = job_.config();
    const Layout& layout = job_.layout();
    gpu_tensors_ = ChooseGpuTensors(layout, options_.offload_fraction);
    kept_tensor_.assign(layout.tensors().size(), false);
    for (uint32_t t : gpu_tensors_) kept_tensor_[t] = true;
    kept_steps_.assign(layout.tensors().size(), 0);
    const ShardPlan& plan = job_.plan();
    kept_in_bucket_.assign(partition_.num_buckets(), {});
    uint64_t elems = 0;
    for (uint64_t b = 0; b < partition_.num_buckets(); ++b) {
      const ChunkSpan owned = partition_.owned(b, options_.local_rank);
      if (owned.empty()) continue;
      const uint64_t begin = plan.chunk(owned.first).begin;
      const uint64_t end = plan.chunk(owned.end - 1).end;
      for (const Segment& segment : layout.SegmentsIn(begin, end)) {
        if (!kept_tensor_[segment.tensor_index]) continue;
        kept_in_bucket_[b].push_back(
            KeptSegment{segment.begin, segment.end,
                        static_cast<uint32_t>(segment.tensor_index),
                        segment.param_group, elems});
        elems += segment.end - segment.begin;
      }
    }
    if (elems == 0) return absl::OkStatus();
    // master (fp32), then each slot's array, each 256-byte aligned.
    const OptimizerConfig slot_config = JobSlotConfig(config);
    const int slots = OptimizerStateSlots(slot_config);
    const auto aligned = [](uint64_t bytes) { return (bytes + 255) / 256 * 256; };
    uint64_t bytes = aligned(elems * sizeof(float));
    for (int k = 0; k < slots; ++k) {
      slot_offset_[k] = bytes;
      slot_dtype_[k] = OptimizerSlotDType(slot_config, k);
      bytes += aligned(elems * DTypeSize(slot_dtype_[k]));
    }
    absl::StatusOr<std::unique_ptr<Buffer>> state = device_.Allocate(bytes);
    if (!state.ok()) return state.status();
    kept_state_ = *std::move(state);
    // The initial state on the host: the servers' master weights, the
    // slots' initial values; then one copy to the device.
    std::string host(bytes, '\0');
    float* master = reinterpret_cast<float*>(host.data());
    for (const std::vector<KeptSegment>& segments : kept_in_bucket_) {
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
    absl::Status s = device_.CopyAsync(*comm_, kept_state_->data(),
                                       host.data(), bytes,
                                       CopyKind::kHostToDevice);
    if (s.ok()) s = device_.SynchronizeStream(*comm_);
    return s;
  }

  // Segment k's master and slots inside the state block at `base`.
  ParamRun KeptRun(const KeptSegment& k, char* base) const {
    ParamRun run;
    run.master = reinterpret_cast<float*>(base) + k.state_offset;
    for (int slot = 0; slot < kMaxStateSlots; ++slot) {
      if (slot_offset_[slot] == 0) continue;
      run.slots[slot] = base + slot_offset_[slot] +
                        k.state_offset * DTypeSize(slot_dtype_[slot]);
    }
    run.n = k.end - k.begin;
    return run;
  }

  const std::vector<uint32_t>& gpu_tensors() const { return gpu_tensors_; }
  uint64_t gpu_state_bytes() const {
    return kept_state_ == nullptr ? 0 : kept_state_->bytes();
  }

  const NodePartition& partition() const { return partition_; }
  void* grads_of_step(uint64_t step) const {
    return grads_[options_.delayed_update ? step % 2 : 0]->data();
  }
  void* grads() const {
    return grads_[options_.delayed_update ? begun_ % 2 : 0]->data();
  }
  void* weights() const { return live_->data(); }
  uint64_t pinned_bytes() const {
    return d2h_.memory->bytes() + h2d_.memory->bytes();
  }

  absl::Status BeginStep(uint64_t step, const StepOptions& options) {
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
    if (kept_state_lost_) {
      return absl::FailedPreconditionError(
          "BeginStep: a step failed while the optimizer state of the tensors "
          "kept on the GPU (offload_fraction < 1) took part in it; that state "
          "cannot replay a step: create a new engine from a checkpoint");
    }
    if (!runs_.empty() && step != begun_ + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "BeginStep(", step, "): step ", begun_,
          " is in flight; the next step is ", begun_ + 1));
    }
    if (!options.weight_overrides.empty()) {
      return absl::InvalidArgumentError(
          "BeginStep: weight_overrides are not supported on GPU workers; "
          "write the new weights into the engine's weights() and the "
          "servers' with Job::Step's overrides on a host step");
    }
    const bool two_phase =
        client_internal::StreamedStepIsTwoPhase(job_, options);
    if (!gpu_tensors_.empty() && two_phase) {
      return absl::FailedPreconditionError(
          "BeginStep: with an offload fraction below 1 a step runs in one "
          "phase (the servers' gradient norm would miss the tensors kept on "
          "the GPU): pass StepOptions::known_commit, or do not clip, skip on "
          "a norm threshold or scale the loss dynamically");
    }
    const uint64_t buckets = partition_.num_buckets();
    auto run = std::make_unique<StepRun>();
    run->engine = this;
    run->step = step;
    run->parity = static_cast<int>(step % 2);
    run->grads = static_cast<char*>(
        grads_[options_.delayed_update ? step % 2 : 0]->data());
    run->options = options;
    if (!gpu_tensors_.empty()) {
      if (absl::Status s = PlanGpuUpdates(options, *run); !s.ok()) return s;
    }
    run->named.assign(buckets, false);
    run->weights_recorded.assign(buckets, false);
    run->h2d_waited.assign(buckets, false);
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
    streamed.on_failure = [this, r](const absl::Status& status) {
      Fail(*r, status);
    };
    r->two_phase = two_phase;
    for (const StreamedStep::Route& route :
         r->two_phase ? routes_two_phase_ : routes_) {
      r->queues.push_back(std::make_unique<ChunkQueue>(
          [this, r](uint64_t index) { ReleaseD2h(*r, index); }));
      streamed.routes.push_back(route);
      streamed.routes.back().feed = r->queues.back().get();
    }
    {
      absl::MutexLock lock(&mu_);
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
    });
    return absl::OkStatus();
  }

  absl::Status GradientsReady(uint64_t bucket, Stream& stream) {
    StepRun* run = runs_.empty() ? nullptr : runs_.back().get();
    if (run == nullptr || run->step != begun_) {
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
      if (!run->error.ok()) return run->error;
      if (run->named[bucket]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "GradientsReady: bucket ", bucket, " was named twice in step ",
            run->step));
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

  absl::Status WaitWeights(uint64_t bucket, Stream& stream) {
    if (bucket >= partition_.num_buckets()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "WaitWeights: bucket ", bucket, " of ", partition_.num_buckets()));
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
          return absl::FailedPreconditionError(absl::StrCat(
              "WaitWeights: bucket ", bucket, " of step ", target,
              " has not been named by GradientsReady"));
        }
        const auto recorded = [run, bucket]()
                                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
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
    const uint64_t bytes = padded.size() * partition_.chunk_elems() * weight_size_;
    absl::Status s = device_.CopyAsync(
        stream, static_cast<char*>(live_->data()) + begin,
        static_cast<char*>(incoming_[parity]->data()) + begin, bytes,
        CopyKind::kDeviceToDevice);
    if (!s.ok()) return s;
    absl::MutexLock lock(&mu_);
    applied_step_[bucket] = target;
    return absl::OkStatus();
  }

  absl::StatusOr<StepResult> FinishStep() {
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
      Fail(run, absl::FailedPreconditionError(absl::StrCat(
                    "FinishStep: step ", run.step,
                    " ended before GradientsReady named ",
                    missing.size() == 1 ? "bucket " : "buckets ",
                    absl::StrJoin(missing, ", "))));
    }
    JoinRun(run);
    absl::Status error;
    {
      absl::MutexLock lock(&mu_);
      error = run.error;
    }
    if (!error.ok()) {
      if (!gpu_tensors_.empty()) kept_state_lost_ = true;
      // A later step in flight cannot go on without this one.
      for (std::unique_ptr<StepRun>& later : runs_) {
        Fail(*later, absl::AbortedError(absl::StrCat(
                         "step ", run.step, " failed: ", error.message())));
      }
      for (std::unique_ptr<StepRun>& later : runs_) JoinRun(*later);
      Drain();
      absl::MutexLock lock(&mu_);
      runs_.clear();
      return error;
    }
    const StepResult result = run.result;
    absl::MutexLock lock(&mu_);
    runs_.pop_front();
    return result;
  }

  // StepRun::Accept: a chunk's weights, on a stream's reader thread. They go
  // into a free H2D slot in up to four parts (H2dPartBytes), each part's H2D
  // copy queued as soon as the part is in, so that the link starts on the
  // chunk while the host still writes the rest of it.
  absl::Status Accept(StepRun& run, uint64_t index, uint64_t bytes,
                      const WeightSink::CopyWeights& copy) {
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

 private:
  // The bytes of each H2D copy of a chunk of `bytes` bytes: a quarter of
  // it, in whole 4 KiB pages, but not below 64 KiB (a copy's fixed cost on
  // a GPU is a few microseconds).
  static uint64_t H2dPartBytes(uint64_t bytes) {
    constexpr uint64_t kPage = 4096, kLeast = uint64_t{64} << 10;
    const uint64_t quarter = (bytes / 4 + kPage - 1) / kPage * kPage;
    return std::max(quarter, kLeast);
  }

  // Queues the H2D copy of `n` bytes of a chunk of `bucket` from its slot;
  // after the chunk's last part (`slot` >= 0), the slot's release and, for
  // the bucket's last chunk, its event.
  absl::Status QueueH2d(StepRun& run, uint64_t bucket, char* dst,
                        const char* src, uint64_t n, int slot) {
    absl::MutexLock h2d_lock(&h2d_mu_);
    bool first;
    {
      absl::MutexLock lock(&mu_);
      first = !run.h2d_waited[bucket];
      run.h2d_waited[bucket] = true;
    }
    absl::Status status;
    // Backward may still read this bucket's weights until its ready point
    // (with the delayed update: the forward before it applied step - 2's
    // weights out of the buffer this step writes).
    if (first) {
      status = device_.Wait(*h2d_stream_, *ready_[run.parity][bucket]);
    }
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

  // Writes bytes [offset, offset + n) of a chunk's weights into the same
  // place of the slot at `data`.
  absl::Status Fill(StepRun& run, char* data, uint64_t offset, uint64_t n,
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

  absl::Status Aborted(StepRun& run) {
    absl::MutexLock lock(&mu_);
    return run.error.ok() ? absl::AbortedError("the step was aborted")
                          : run.error;
  }

  // The step's first error; stops every thread of the step.
  void Fail(StepRun& run, const absl::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (run.error.ok()) run.error = status;
      run.aborted = true;
    }
    for (const std::unique_ptr<ChunkQueue>& queue : run.queues) queue->Abort();
  }

  // A free slot of `ring`, or -1 once the step is aborted.
  int Acquire(StepRun& run, SlotRing& ring) {
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

  void Free(SlotRing& ring, int slot) {
    absl::MutexLock lock(&mu_);
    ring.free.push_back(slot);
  }

  // gRPC let go of chunk `index`'s D2H slot.
  void ReleaseD2h(StepRun& run, uint64_t index) {
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

  // On the D2H stream's host thread, once chunk `index` is in slot `slot`.
  void HandOff(StepRun& run, uint64_t index, int slot) {
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

  uint32_t RouteOfChunk(const StepRun& run, uint64_t index) const {
    return (run.two_phase ? route_two_phase_of_chunk_ : route_of_chunk_)[index];
  }

  // Waits until `list` of `run` has more than `i` entries; nullopt once
  // aborted.
  std::optional<uint64_t> Nth(StepRun& run, const std::vector<uint64_t>& list,
                              size_t i) {
    absl::MutexLock lock(&mu_);
    const auto there = [&run, &list, i]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return run.aborted || list.size() > i;
    };
    mu_.Await(absl::Condition(&there));
    if (run.aborted) return std::nullopt;
    return list[i];
  }

  // The comm stream's work for `run`: every bucket's reduce-scatter in the
  // order GradientsReady named them, then every bucket's all-gather in that
  // order. It starts once the previous step's are all queued, so that every
  // rank's collectives come in one order, and so that a chunk is sent for
  // this step only after the servers applied the previous step to it.
  void RunCollectives(StepRun& run) {
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
        if (!s.ok()) return Fail(run, s);
        absl::MutexLock lock(&mu_);
        run.d2h_order.push_back(*b);
      }
    }
    char* target = WeightsTarget(run);
    for (size_t i = 0; i < buckets; ++i) {
      uint64_t b;
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
        if (run.aborted) return;
      }
      if (s.ok() && owned_in_bucket_[b] > 0) {
        s = device_.Wait(*comm_, *h2d_done_[run.parity][b]);
      }
      // The kept tensors' weights replace what the servers sent for them.
      if (s.ok() && !gpu_tensors_.empty()) s = UpdateGpuTensors(run, b, target);
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
      if (!s.ok()) return Fail(run, s);
    }
    absl::MutexLock lock(&mu_);
    collectives_through_ = run.step;
  }

  // Waits until the previous step's collectives are all queued (the comm
  // thread's and, with one local rank, the D2H thread's start); false once
  // `run` is aborted.
  bool AwaitPreviousCollectives(StepRun& run) {
    absl::MutexLock lock(&mu_);
    const auto done = [this, &run]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return run.aborted || collectives_through_ + 1 >= run.step;
    };
    mu_.Await(absl::Condition(&done));
    return !run.aborted;
  }

  // The offload fraction's part of BeginStep: the kept tensors join the
  // step's tensors without a gradient (the servers skip them), and each gets
  // its update's hyperparameters, as the servers would resolve them.
  absl::Status PlanGpuUpdates(const StepOptions& options, StepRun& run) {
    const JobConfig& config = job_.config();
    const Layout& layout = job_.layout();
    std::vector<bool> no_grad(layout.tensors().size(), false);
    for (uint32_t t : options.no_grad_tensors) {
      if (t < no_grad.size()) no_grad[t] = true;
    }
    const StepCommit commit = options.known_commit.value_or(StepCommit());
    run.gpu_hparams.assign(layout.tensors().size(), std::nullopt);
    for (uint32_t t : gpu_tensors_) {
      if (!no_grad[t]) run.options.no_grad_tensors.push_back(t);
      if (no_grad[t] || commit.skip) continue;
      const uint32_t group = layout.tensors()[t].param_group;
      run.gpu_hparams[t] =
          ResolveHyperParams(GroupOptimizer(config, group),
                             options.group_hparams, group, kept_steps_[t] + 1);
    }
    run.gpu_grad.dtype = config.grad_dtype;
    run.gpu_grad.unscale_factor = UnscaleFactor(options.loss_scale);
    run.gpu_grad.unscale = run.gpu_grad.unscale_factor != 1.0f;
    run.gpu_grad.clip = commit.clip_coef < 1.0;
    run.gpu_grad.clip_coef = static_cast<float>(commit.clip_coef);
    // The step counts move now (the servers' move when they apply the
    // step); a failed step leaves the engine unusable (FinishStep).
    for (uint32_t t : gpu_tensors_) {
      if (run.gpu_hparams[t].has_value()) ++kept_steps_[t];
    }
    return absl::OkStatus();
  }

  // Bucket b's kept segments on the comm stream, after the weights of this
  // rank's chunks landed in `target`: an update, or just the weights.
  absl::Status UpdateGpuTensors(StepRun& run, uint64_t b, char* target) {
    for (const KeptSegment& k : kept_in_bucket_[b]) {
      const ParamRun state =
          KeptRun(k, static_cast<char*>(kept_state_->data()));
      const WeightsOutput weights{job_.config().weight_dtype,
                                  target + k.begin * weight_size_};
      absl::Status s;
      if (run.gpu_hparams[k.tensor].has_value()) {
        const void* part = run.grads + k.begin * grad_size_;
        GradientInput grad = run.gpu_grad;
        grad.parts = &part;
        grad.num_parts = 1;
        s = options_.device_optimizer->Update(k.group, grad, state,
                                              *run.gpu_hparams[k.tensor],
                                              weights, *comm_);
      } else {
        s = options_.device_optimizer->WriteWeights(state.master, state.n,
                                                    weights, *comm_);
      }
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Where `run`'s weights arrive: the live weights, or with the delayed
  // update the incoming buffer of its parity.
  char* WeightsTarget(const StepRun& run) const {
    return static_cast<char*>(
        (options_.delayed_update ? incoming_[run.parity] : live_)->data());
  }

  void MarkWeightsRecorded(StepRun& run, uint64_t bucket) {
    absl::MutexLock lock(&mu_);
    run.weights_recorded[bucket] = true;
  }

  // The D2H stream's work: every owned chunk of the step into a free slot.
  // A bucket's turn comes in the order its reduce-scatter was queued
  // (d2h_order), or with one local rank in the order GradientsReady named
  // it (ready_order: no thread between the trainer and the D2H stream). Which
  // chunk next, once a slot is free: the next chunk of the first bucket with
  // chunks left, or of a later bucket whose gradients are already complete on
  // the device (its event reached, so that waiting for it cannot hold the
  // stream up), whichever goes to the route with the fewest chunks queued or in
  // slots; ties to the earlier bucket. Backward's buckets lie in one server's
  // shard after another: copied strictly in order, they would fill every slot
  // with chunks for one server's stream while the other servers idle.
  void RunDeviceToHost(StepRun& run) {
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
        if (turn.complete &&
            in_slots[RouteOfChunk(run, turn.next)] <
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

  // The event a bucket's D2H copies wait for: its reduce-scatter's, or with
  // one local rank its ready event.
  Event& D2hEvent(const StepRun& run, uint64_t bucket) const {
    return collective_ != nullptr ? *rs_done_[run.parity][bucket]
                                  : *ready_[run.parity][bucket];
  }

  void JoinRun(StepRun& run) {
    for (std::thread* thread :
         {&run.step_thread, &run.comm_thread, &run.d2h_thread}) {
      if (thread->joinable()) thread->join();
    }
  }

  // After a failed step: lets the queued device work run out, then frees
  // every slot (none is in use once the streams are idle and gRPC has
  // released every slice, which the step's end waited for).
  void Drain() {
    for (Stream* stream :
         {comm_.get(), d2h_stream_.get(), h2d_stream_.get()}) {
      (void)device_.SynchronizeStream(*stream);
    }
    absl::MutexLock lock(&mu_);
    for (SlotRing* ring : {&d2h_, &h2d_}) {
      ring->free.clear();
      for (int i = ring->slots - 1; i >= 0; --i) ring->free.push_back(i);
    }
  }

  Job& job_;
  Device& device_;
  Collective* const collective_;
  const TransferEngineOptions options_;
  const NodePartition partition_;
  const size_t grad_size_;
  const size_t weight_size_;

  // grads_[1] and incoming_: only with the delayed update.
  std::unique_ptr<Buffer> grads_[2], live_, incoming_[2];
  SlotRing d2h_, h2d_;
  std::unique_ptr<Stream> comm_, d2h_stream_, h2d_stream_;
  // Per step parity and bucket.
  std::vector<std::unique_ptr<Event>> ready_[2], rs_done_[2], h2d_done_[2],
      weights_ready_[2];
  // This rank's streams (feeds unset) and each chunk's, in a one-phase and
  // in a two-phase step.
  std::vector<StreamedStep::Route> routes_, routes_two_phase_;
  std::vector<uint32_t> route_of_chunk_, route_two_phase_of_chunk_;
  std::vector<uint64_t> owned_in_bucket_;

  uint64_t begun_ = 0;  // the trainer thread's: the last step begun

  // Offload fraction (empty / null when everything is offloaded).
  std::vector<uint32_t> gpu_tensors_;
  std::vector<bool> kept_tensor_;
  std::vector<std::vector<KeptSegment>> kept_in_bucket_;
  uint64_t slot_offset_[kMaxStateSlots] = {0, 0, 0};  // 0: unused slot
  DType slot_dtype_[kMaxStateSlots] = {DType::kFloat32, DType::kFloat32,
                                       DType::kFloat32};
  std::unique_ptr<Buffer> kept_state_;
  // Per tensor, the kept tensors' optimizer step counts (trainer thread).
  std::vector<uint64_t> kept_steps_;
  // A step failed after the kept tensors' state may have taken part of it:
  // unlike the servers' state, it cannot replay a step (trainer thread).
  bool kept_state_lost_ = false;

  absl::Mutex h2d_mu_;  // orders each chunk's H2D work on the stream
  absl::Mutex mu_;
  // Oldest first; the trainer thread adds and removes (under mu_), the
  // engine's threads use the runs they were started for.
  std::deque<std::unique_ptr<StepRun>> runs_;
  // Per bucket: the last step whose weights the forward applied (delayed
  // update).
  std::vector<uint64_t> applied_step_ ABSL_GUARDED_BY(mu_);
  // The last step whose collectives (every all-gather; G = 1: every
  // weights-ready record) are queued: the next step's wait for them.
  uint64_t collectives_through_ ABSL_GUARDED_BY(mu_) = 0;
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
  if (!(options.offload_fraction >= 0.0 && options.offload_fraction <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TransferEngine: offload_fraction must be in [0, 1], got ",
        options.offload_fraction));
  }
  if (options.offload_fraction < 1.0) {
    if (options.device_optimizer == nullptr) {
      return absl::InvalidArgumentError(
          "TransferEngine: offload_fraction < 1 needs a device_optimizer");
    }
    if (job.config().num_workers != 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "TransferEngine: offload_fraction < 1 needs the whole gradient on "
          "the GPU, which only a job of one worker (node) has; this job has ",
          job.config().num_workers,
          " (its nodes meet only at the servers)"));
    }
    absl::StatusOr<std::vector<ServerJobStatus>> statuses =
        job.Status(/*with_checksum=*/false);
    if (!statuses.ok()) return statuses.status();
    for (const ServerJobStatus& status : *statuses) {
      if (status.step != 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "TransferEngine: offload_fraction < 1 starts the kept tensors' "
            "optimizer state from the servers' initial weights, but server ",
            status.server, " has applied step ", status.step));
      }
    }
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

std::vector<uint32_t> ChooseGpuTensors(const Layout& layout,
                                       double offload_fraction) {
  std::vector<uint32_t> kept;
  if (!(offload_fraction < 1.0)) return kept;
  const double budget =
      (1.0 - std::max(0.0, offload_fraction)) *
      static_cast<double>(layout.param_elems());
  uint64_t used = 0;
  for (size_t t = layout.tensors().size(); t-- > 0;) {
    const uint64_t numel = layout.tensors()[t].numel;
    if (static_cast<double>(used + numel) <= budget) {
      used += numel;
      kept.push_back(static_cast<uint32_t>(t));
    }
  }
  std::reverse(kept.begin(), kept.end());
  return kept;
}

TransferEngine::TransferEngine(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
TransferEngine::~TransferEngine() = default;

const NodePartition& TransferEngine::partition() const {
  return impl_->partition();
}
void* TransferEngine::grads() const { return impl_->grads(); }
void* TransferEngine::grads_of_step(uint64_t step) const {
  return impl_->grads_of_step(step);
}
void* TransferEngine::weights() const { return impl_->weights(); }
uint64_t TransferEngine::pinned_bytes() const { return impl_->pinned_bytes(); }
const std::vector<uint32_t>& TransferEngine::gpu_tensors() const {
  return impl_->gpu_tensors();
}
uint64_t TransferEngine::gpu_state_bytes() const {
  return impl_->gpu_state_bytes();
}
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
