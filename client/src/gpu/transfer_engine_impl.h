// TransferEngine's implementation, shared by the files that define it (not
// for use elsewhere):
// - transfer_engine.cc: creating the engine (buffers, pinned rings, events,
//   routes) and TransferEngine's own methods;
// - transfer_engine_step.cc: a step's run, from BeginStep through
//   GradientsReady and WaitWeights to FinishStep, its threads, its
//   collectives, and failing or draining it;
// - transfer_engine_copies.cc: the copies, device to host into the pinned
//   slots and from the slots back to the device, and the slots' reuse;
// - transfer_engine_kept.cc: the tensors whose optimizer stays on the GPU
//   (the offload fraction).
#ifndef DEPOT_CLIENT_SRC_GPU_TRANSFER_ENGINE_IMPL_H_
#define DEPOT_CLIENT_SRC_GPU_TRANSFER_ENGINE_IMPL_H_

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "gpu/transfer_engine.h"
#include "gpu/watched_collective.h"
#include "job_impl.h"
#include "server/step_hparams.h"
#include "server/step_numerics.h"
#include "step_stream.h"

namespace depot::gpu {

// One Step stream's chunks, pushed by the D2H stream's host functions as
// their copies finish, popped by the stream's writer.
class ChunkQueue : public client_internal::ChunkFeed {
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

  // A bucket's kept state copied off the device for the servers' captures
  // (CopyCapturedState): the chunks, each one's kept elements as they lie in
  // the kept block (master, then each slot's array, in the slots' dtypes),
  // and the kept tensors' counts after the step.
  struct CapturedBucket {
    uint64_t bucket = 0;
    std::vector<uint64_t> chunks;
    std::vector<std::string> host;
    std::vector<uint64_t> tensor_steps;
  };

  // One step's transfers: its streams, threads and progress. With the delayed
  // update two are in flight: the older one's round trip while the newer
  // one's backward runs.
  struct StepRun : public client_internal::WeightSink {
    Impl* engine = nullptr;
    uint64_t step = 0;
    int parity = 0;         // which set of per-bucket events
    char* grads = nullptr;  // the gradient buffer this step reads
    StepOptions options;
    bool two_phase = false;  // its routes are routes_two_phase_
    // Offload fraction, once the step's decision is known
    // (ResolveGpuUpdates, comm thread): per kept tensor, the update's
    // hyperparameters, or nullopt when it is not updated this step (no
    // node has a gradient for it, as the GradSums say, or skipped), and the
    // dtype, unscale and clip of the updates.
    std::vector<bool> tensor_resolved;  // empty until ResolveGpuUpdates
    std::vector<std::optional<UpdateHyperParams>> gpu_hparams;
    GradientInput gpu_grad;
    std::vector<std::unique_ptr<ChunkQueue>> queues;
    StepResult result;  // the step thread's until joined
    std::thread step_thread, comm_thread, d2h_thread;

    // Guarded by the engine's mu_.
    absl::Status error;
    bool aborted = false;
    // The step thread's streams have all ended (the step's outcome on this
    // rank is final); the trainer can name no more buckets (FinishStep or
    // the destructor came). A node's comm thread waits for these, not for
    // `aborted` (NodeMode).
    bool streams_done = false;
    bool naming_closed = false;
    std::vector<uint64_t> ready_order, d2h_order;
    std::vector<bool> named, weights_recorded, h2d_waited;
    std::vector<uint64_t> h2d_pending;
    std::vector<int> d2h_slot_of_chunk;
    // Per route of the step: its chunks queued for D2H or in a D2H slot.
    std::vector<int> route_in_slots;

    // Sum-only tensors: the chunks whose GradSum has come.
    std::vector<bool> sum_received;
    // The decision the step applies: a one-phase step's at BeginStep, a
    // two-phase step's from its first GradSum (every later one must agree).
    std::optional<StepCommit> commit;
    // Per tensor: a GradSum named it as one no worker has a gradient for.
    std::vector<bool> sum_skipped;
    // Per chunk: its GradSum asked for the kept state (capture_wanted).
    std::vector<bool> capture_wanted;
    // The kept state of those chunks after this step's update, copied to
    // the host on the comm thread (CopyCapturedState), sent by FinishStep
    // (SendCapturedState): one entry per bucket.
    std::vector<CapturedBucket> captured;

    absl::Status Accept(uint64_t index, uint64_t bytes,
                        const CopyWeights& copy) override {
      return engine->Accept(*this, index, bytes, copy);
    }
    absl::Status AcceptGradSum(uint64_t index, const GradSum& sum) override {
      return engine->AcceptGradSum(*this, index, sum);
    }
  };

  // Sum-only tensors: where chunk c's kept elements' sums go (their first
  // element's offset in the kept state's numbering) and how many there are.
  struct KeptChunk {
    uint64_t state_offset = 0;
    uint64_t elems = 0;
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
    JoinCapture();
    {
      absl::MutexLock lock(&mu_);
      // A node's comm threads stop waiting for buckets and collectives.
      if (node_broken_.empty()) node_broken_ = "the engine was destroyed";
      for (std::unique_ptr<StepRun>& run : runs_) run->naming_closed = true;
    }
    for (std::unique_ptr<StepRun>& run : runs_) {
      Fail(*run, absl::CancelledError("the transfer engine was destroyed"));
    }
    for (std::unique_ptr<StepRun>& run : runs_) JoinRun(*run);
    // Also after the last FinishStep: it only queues the step's device work
    // (the weights' copies, the kept tensors' updates, the all-gathers),
    // which must not outlive the buffers freed below. The watch stays until
    // then: collectives the other ranks never join end at its timeout.
    Drain();
    watched_.reset();
  }

  absl::Status Init();

  // The offload fraction's tensors: which, their segments in this rank's
  // chunks, and their state in device memory, read from the servers.
  absl::Status InitGpuTensors();

  // The kept elements of local rank `rank`'s chunks and the layout of its
  // state block (every rank's can be computed on any: the partition is the
  // node's): per bucket the segments, whose state_offset numbers their
  // elements consecutively; the master weights (fp32) at 0, then each slot
  // array at slot_offset (0: a slot the job does not keep), each 256-byte
  // aligned; `bytes` in all (0 with no kept elements).
  struct KeptBlock {
    std::vector<std::vector<KeptSegment>> in_bucket;
    uint64_t elems = 0;
    uint64_t slot_offset[kMaxStateSlots] = {0, 0, 0};
    uint64_t bytes = 0;
  };
  KeptBlock KeptBlockOf(uint32_t rank) const;

  // Segment k's master and slots inside the state block at `base`, laid out
  // as `block` (this rank's by default).
  ParamRun KeptRun(const KeptSegment& k, char* base) const {
    return KeptRun(k, base, kept_);
  }
  ParamRun KeptRun(const KeptSegment& k, char* base,
                   const KeptBlock& block) const;
  // The device buffer `run`'s sums from the servers land in (kept_sum_).
  float* KeptSums(const StepRun& run) const {
    return static_cast<float*>(
        kept_sum_[options_.delayed_update ? run.parity : 0]->data());
  }

  // TransferEngine::ReadGpuState and WriteGpuState, StoreGpuState and
  // RestoreGpuState.
  absl::Status ReadGpuState(const StateArrays& state);
  absl::Status WriteGpuState(const StateArrays& state);
  absl::Status StoreGpuState();
  absl::Status RestoreGpuState();
  // StoreGpuState's own part: this rank's ranges, patched.
  absl::Status StoreOwnKeptState();
  // RestoreGpuState's part of this rank (the whole of it with one rank).
  absl::Status RestoreOwnKeptState();
  // StoreGpuState's and RestoreGpuState's collective of the node: the
  // node's verdicts first (CheckNode), then this rank's `own` part, then
  // every rank learns whether every rank's went through (AnyRankFailed).
  // `own`'s error on the rank it failed on; ABORTED `others_failed` on a
  // rank whose own part went through while another's did not. One rank:
  // `own`'s status.
  absl::Status AcrossTheNode(const std::function<absl::Status()>& own,
                             const char* others_failed);
  // After work queued on the comm stream (`queued`: the first error
  // queueing it): waits for the stream, also after an error, since nothing
  // queued may outlive the buffers it uses. The first error; with
  // `collective`, also CollectivesExpired (a collective aborted on the way
  // did nothing).
  absl::Status SettleComm(absl::Status queued, bool collective);
  // FAILED_PRECONDITION for `what` while the kept tensors' state is missing
  // (an engine made on a job with applied steps) or lost (a failed step).
  absl::Status CheckKeptStateKnown(const char* what);
  // FAILED_PRECONDITION for `what` while a step is in flight.
  absl::Status CheckNoStepInFlight(const char* what);
  // The element ranges [begin, end) this rank's kept state is stored and
  // restored by: runs of its kept segments (into kept_) with nothing of
  // another tensor between them, in adjacent chunks.
  struct KeptRange {
    uint64_t begin = 0, end = 0;
    std::vector<const KeptSegment*> segments;
  };
  std::vector<KeptRange> KeptRanges() const;

  // A node of several local ranks (docs/gpu.md, "A rank's failure on a
  // node"): every step's collectives run on every rank whatever the step's
  // outcome there, so that no rank waits for a collective another never
  // queues; the last, an all-reduce of each rank's failure flag, gives the
  // node's verdict on the step.
  bool NodeMode() const { return collective_ != nullptr; }
  // TransferEngine::CheckNode: waits for the verdict on each step this rank
  // finished without an error and has not checked yet (node_unchecked_);
  // ABORTED naming the first that failed on another rank. Trainer thread.
  absl::Status CheckNode();
  // TransferEngine::SynchronizeNode, AgreeOnStep. Trainer thread.
  absl::Status SynchronizeNode();
  absl::StatusOr<uint64_t> AgreeOnStep(uint64_t step);
  // FAILED_PRECONDITION naming `what` with a step in flight, or once the
  // node's collectives are out of step or aborted.
  absl::Status CheckNodeIdle(const char* what);
  // NodeMode: an all-reduce of each rank's `failed` on the comm stream (as
  // SynchronizeNode's, which passes false): whether any rank passed true,
  // once every rank has called it. Trainer thread, no step in flight.
  absl::StatusOr<bool> AnyRankFailed(bool failed);
  // The comm thread's end of a node's step: waits for its streams' end,
  // then all-reduces the flag (1: failed on this rank) on the comm stream
  // and records node_verdict_[parity].
  absl::Status QueueNodeVerdict(StepRun& run);
  // A collective or device call on a node's comm thread failed: fails the
  // step and marks the node's collectives out of step (node_broken_).
  void BreakNode(StepRun& run, const absl::Status& status);
  // `what` (BeginStep, SynchronizeNode) is FAILED_PRECONDITION once
  // node_broken_ says why; OK before (and with one local rank, which never
  // breaks).
  absl::Status NodeBroken(absl::string_view what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The watched collective expired (a collective waited past
  // options.collective_timeout, or the node's collectives failed
  // elsewhere), on its thread, before it aborts the collective: fails every
  // step in flight with `status` (so that no chunk an aborted
  // reduce-scatter leaves is sent) and breaks the node for good.
  void OnCollectiveExpired(const absl::Status& status);
  // Why the node's collectives were aborted (the watched collective
  // expired, which it says before the abort); OK while they run, and
  // without a watch.
  absl::Status CollectivesExpired() const {
    return watched_ == nullptr ? absl::OkStatus() : watched_->AsyncError();
  }

  void set_kept_state_missing(std::string why) {
    kept_state_missing_ = std::move(why);
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

  absl::Status BeginStep(uint64_t step, const StepOptions& options);

  absl::Status GradientsReady(uint64_t bucket, Stream& stream);

  absl::Status WaitWeights(uint64_t bucket, Stream& stream);

  absl::StatusOr<StepResult> FinishStep();
  // WaitCaptures: JoinCapture, then the report not yet taken (step 0: none).
  CaptureReport TakeCaptureReport();

  // StepRun::Accept: a chunk's weights, on a stream's reader thread. They go
  // into a free H2D slot in up to four parts (H2dPartBytes), each part's H2D
  // copy queued as soon as the part is in, so that the link starts on the
  // chunk while the host still writes the rest of it.
  absl::Status Accept(StepRun& run, uint64_t index, uint64_t bytes,
                      const client_internal::WeightSink::CopyWeights& copy);

  // StepRun::AcceptGradSum: a chunk's GradSum (sum-only tensors): the
  // step's decision and the skipped tensors, and with several nodes the
  // summed gradient of its kept elements, which goes through a free H2D slot
  // into kept_sum_, before the chunk's weights.
  absl::Status AcceptGradSum(StepRun& run, uint64_t index,
                             const client_internal::WeightSink::GradSum& sum);

 private:
  // The bytes of each H2D copy of a chunk of `bytes` bytes: a quarter of
  // it, in whole 4 KiB pages, but not below 64 KiB (a copy's fixed cost on
  // a GPU is a few microseconds).
  static uint64_t H2dPartBytes(uint64_t bytes);

  // Queues the H2D copy of `n` bytes of a chunk of `bucket` from its slot;
  // after the chunk's last part (`slot` >= 0), the slot's release and, for
  // the bucket's last chunk, its event.
  absl::Status QueueH2d(StepRun& run, uint64_t bucket, char* dst,
                        const char* src, uint64_t n, int slot);
  // Before the first H2D copy of `bucket` in `run`: the H2D stream waits
  // for the bucket's ready event.
  absl::Status WaitBucketReadyOnce(StepRun& run, uint64_t bucket)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(h2d_mu_);

  // Writes bytes [offset, offset + n) of a chunk's weights into the same
  // place of the slot at `data`.
  absl::Status Fill(StepRun& run, char* data, uint64_t offset, uint64_t n,
                    const client_internal::WeightSink::CopyWeights& copy);

  absl::Status Aborted(StepRun& run);

  // The step's first error; stops every thread of the step.
  void Fail(StepRun& run, const absl::Status& status);

  // A free slot of `ring`, or -1 once the step is aborted.
  int Acquire(StepRun& run, SlotRing& ring);

  void Free(SlotRing& ring, int slot);

  // gRPC let go of chunk `index`'s D2H slot.
  void ReleaseD2h(StepRun& run, uint64_t index);

  // On the D2H stream's host thread, once chunk `index` is in slot `slot`.
  void HandOff(StepRun& run, uint64_t index, int slot);

  uint32_t RouteOfChunk(const StepRun& run, uint64_t index) const;

  // Waits until `list` of `run` has more than `i` entries; nullopt once
  // aborted.
  std::optional<uint64_t> Nth(StepRun& run, const std::vector<uint64_t>& list,
                              size_t i);

  // The comm stream's work for `run`: every bucket's reduce-scatter in the
  // order GradientsReady named them, then every bucket's all-gather in that
  // order. It starts once the previous step's are all queued, so that every
  // rank's collectives come in one order, and so that a chunk is sent for
  // this step only after the servers applied the previous step to it.
  void RunCollectives(StepRun& run);

  // Waits until the previous step's collectives are all queued (the comm
  // thread's and, with one local rank, the D2H thread's start); false once
  // `run` is aborted.
  bool AwaitPreviousCollectives(StepRun& run);

  // The offload fraction's part of BeginStep: which kept tensors have a
  // gradient; with one node and no sums from the servers they join the
  // step's tensors without a gradient (the servers skip them); a one-phase
  // step's decision.
  absl::Status PlanGpuUpdates(const StepOptions& options, StepRun& run);

  // For ReadGpuState and WriteGpuState (`what`): FAILED_PRECONDITION with a
  // step in flight, INVALID_ARGUMENT for arrays that do not fit the job.
  absl::Status CheckGpuStateAccess(const char* what, const StateArrays& state);
  // The kept state block on the host, or back on the device (comm stream,
  // after its queued work; synchronized).
  absl::Status CopyKeptState(std::string& host, CopyKind kind);
  // ReadGpuState's gather over a node of several local ranks (a collective:
  // every rank calls it): every rank's state block and kept step counts,
  // all-gathered on the comm stream and copied to `host`, rank r's at
  // r * `stride` (its block, then its count of each gpu_tensors_ entry).
  absl::Status GatherKeptState(const std::vector<KeptBlock>& blocks,
                               std::string& host, uint64_t& stride);
  // Block `block` (at `host`)'s master weights and slots, widened to fp32,
  // into `state`.
  void UnpackKeptBlock(const KeptBlock& block, char* host,
                       const StateArrays& state) const;

  // Once per step, at its first kept segment (comm thread, so steps resolve
  // in order, each after the one before it): the dtype, unscale and clip of
  // its kept updates. INTERNAL when the step's decision has not come.
  absl::Status ResolveGpuUpdates(StepRun& run);
  // Once per step and kept tensor, at its first segment (comm thread): its
  // update hyperparameters, as the servers would resolve them, and its step
  // count moved, unless it is not updated: the step is skipped, or the
  // tensor has no gradient (this node's list; with the servers' sums, no
  // node's: the GradSums say).
  void ResolveGpuTensor(StepRun& run, uint32_t tensor);

  // Bucket b's kept segments on the comm stream, after the weights of this
  // rank's chunks landed in `target`: an update, or just the weights.
  absl::Status UpdateGpuTensors(StepRun& run, uint64_t b, char* target);
  // The servers' checkpoint captures of the step (docs/checkpoints.md, "The
  // state the workers keep"). On the comm thread, right after bucket b's
  // kept update and before the next step's can run: the kept state of the
  // bucket's chunks whose GradSum asked for it, copied to the host
  // (run.captured). Then FinishStep has it sent in the background
  // (SendCapturedState), reported as a CaptureReport.
  absl::Status CopyCapturedState(StepRun& run, uint64_t b);
  // On the send's thread: chunk i of `bucket` as the part
  // Job::PatchCapturePart takes (its kept elements over zeros, widened).
  FlatState CapturedChunk(const CapturedBucket& bucket, size_t i,
                          uint64_t step) const;
  // FinishStep: reports an earlier send (run.result.capture_*), then starts
  // the step's own on capture_thread_.
  void SendCapturedState(StepRun& run);
  // Waits for the send under way, if any (its report stays for the next).
  void JoinCapture();
  static std::string CaptureError(uint64_t step, const absl::Status& status);

  // Where `run`'s weights arrive: the live weights, or with the delayed
  // update the incoming buffer of its parity.
  char* WeightsTarget(const StepRun& run) const;

  void MarkWeightsRecorded(StepRun& run, uint64_t bucket);

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
  void RunDeviceToHost(StepRun& run);

  // The event a bucket's D2H copies wait for: its reduce-scatter's, or with
  // one local rank its ready event.
  Event& D2hEvent(const StepRun& run, uint64_t bucket) const;

  void JoinRun(StepRun& run);

  // After a failed step: lets the queued device work run out, then frees
  // every slot (none is in use once the streams are idle and gRPC has
  // released every slice, which the step's end waited for).
  void Drain();

  Job& job_;
  Device& device_;
  // The node's collective (null with one local rank): the trainer's, or
  // with a collective_timeout watched_ over it (set by Init, before any
  // use).
  Collective* collective_;
  std::unique_ptr<WatchedCollective> watched_;
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
  std::vector<client_internal::StreamedStep::Route> routes_, routes_two_phase_;
  std::vector<uint32_t> route_of_chunk_, route_two_phase_of_chunk_;
  std::vector<uint64_t> owned_in_bucket_;

  uint64_t begun_ = 0;  // the trainer thread's: the last step begun

  // Offload fraction (empty / null when everything is offloaded).
  std::vector<uint32_t> gpu_tensors_;
  std::vector<bool> kept_tensor_;
  KeptBlock kept_;  // this rank's
  DType slot_dtype_[kMaxStateSlots] = {DType::kFloat32, DType::kFloat32,
                                       DType::kFloat32};
  std::unique_ptr<Buffer> kept_state_;
  // sum_only_ (an offload fraction): the kept tensors are the step's
  // sum-only tensors, and the servers' GradSums bring the decision, the
  // skipped tensors and the capture requests. sums_from_servers_ (several
  // nodes): they bring the sums too, and each step's summed gradient of this
  // rank's kept elements lands in kept_sum_ (fp32, in the state's numbering;
  // one per step parity with the delayed update); one node updates from its
  // own gradient. kept_of_chunk_: per chunk.
  bool sum_only_ = false;
  bool sums_from_servers_ = false;
  std::unique_ptr<Buffer> kept_sum_[2];
  std::vector<KeptChunk> kept_of_chunk_;
  // Per tensor, the kept tensors' optimizer step counts (comm threads, one
  // step after another: ResolveGpuUpdates).
  std::vector<uint64_t> kept_steps_;
  // The kept state's sends into the servers' captures (SendCapturedState):
  // one at a time, each on its own thread over its own handle on the job.
  // The thread sets capture_report_, then capture_sent_, and ends; the
  // trainer's thread reads the report only after joining it.
  std::thread capture_thread_;
  std::atomic<bool> capture_sent_{false};
  CaptureReport capture_report_;
  // A step failed after the kept tensors' state may have taken part of it:
  // unlike the servers' state, it cannot replay a step (trainer thread).
  bool kept_state_lost_ = false;
  // Why the kept tensors' state is not known yet (an engine made on a job
  // that has applied steps); empty once it is (WriteGpuState). Trainer
  // thread.
  std::string kept_state_missing_;
  // The step the kept state is at: the last step finished here, or the
  // state loaded (trainer thread).
  uint64_t kept_step_ = 0;

  // NodeMode: per step parity, the flag all-reduced on the comm stream
  // (device, one float each), the constants 0 and 1 copied into it (device,
  // written once), the event after the all-reduce, and a stream the trainer
  // thread reads a verdict on (not the comm stream, which may hold the next
  // step's collectives).
  // node_flags_: each step parity's failure flag, then SynchronizeNode's
  // (a float no one reads); node_constants_: 0 and 1.
  std::unique_ptr<Buffer> node_flags_, node_constants_;
  std::unique_ptr<Event> node_verdict_[2];
  std::unique_ptr<Stream> node_read_;
  // Trainer thread: the steps finished here without an error whose node
  // verdict is unread.
  std::deque<uint64_t> node_unchecked_;

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
  // NodeMode: why the node's collectives are out of step on this rank (a
  // step ended before every bucket was named, or a collective or device
  // call failed on the comm thread); empty while they are not. Every later
  // step is refused.
  std::string node_broken_ ABSL_GUARDED_BY(mu_);
};

}  // namespace depot::gpu

#endif  // DEPOT_CLIENT_SRC_GPU_TRANSFER_ENGINE_IMPL_H_
