// TransferEngine: one local rank's side of a GPU worker's step (issue 11;
// docs/gpu.md, "The transfer engine").
//
// The engine owns two flat device buffers over the job's index space, padded
// to the node's buckets (NodePartition): the gradients (grad dtype), which
// backward writes, and the weights (weight dtype), which forward reads. A
// step, for the trainer:
//
//   engine->BeginStep(step, options);
//   ... backward; as each bucket's gradients are complete on `compute`:
//   engine->GradientsReady(bucket, compute);   // never blocks `compute`
//   ... next forward, before a bucket's weights are used:
//   engine->WaitWeights(bucket, compute);      // `compute` waits for them
//   engine->FinishStep();                      // the step's result
//
// What runs behind it, per bucket, in the order GradientsReady named them:
//   comm stream:  wait the bucket's ready event; reduce-scatter (G > 1) so
//                 that this rank owns its part summed over the node
//   D2H stream:   wait for that; copy each owned chunk into a free pinned
//                 slot of the D2H ring; then hand the slot to the chunk's
//                 gRPC stream, which sends from it without another copy
//   (the slot is free again once gRPC has released the bytes)
//   reader:       a chunk's weights arrive into a free slot of the H2D ring
//   H2D stream:   copy the slot into the device weights (the slot is free
//                 again once the copy ran); after the bucket's last owned
//                 chunk, record its event
//   comm stream:  (after every bucket's reduce-scatter, in the same order)
//                 wait for that event; all-gather the bucket's weights inside
//                 the node; record the bucket's weights-ready event
// Pinned memory is the two rings, stated by pinned_bytes(): slots × chunk
// bytes, never proportional to the model.
//
// Every local rank of a node must name the buckets in the same order (as
// NCCL requires the same collectives in the same order). The collective
// order of a step is fixed: every bucket's reduce-scatter, then every
// bucket's all-gather, in that order.
//
// Thread safety: one trainer thread calls the engine's methods.
#ifndef DEPOT_CLIENT_SRC_GPU_TRANSFER_ENGINE_H_
#define DEPOT_CLIENT_SRC_GPU_TRANSFER_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "depot/client.h"
#include "depot/layout.h"
#include "depot/node_partition.h"
#include "gpu/collective.h"
#include "gpu/device.h"
#include "gpu/device_optimizer.h"

namespace depot::gpu {

// Deliberate engine bugs, for the tests that show the HostDevice's checks and
// the bitwise comparisons catch them. Never set outside tests.
struct EngineFaults {
  // Free a D2H slot when it is handed to gRPC, not when gRPC released it.
  bool d2h_slot_free_at_handoff = false;
  // Free an H2D slot when its copy is queued, not when the copy ran.
  bool h2d_slot_free_at_enqueue = false;
  // Queue a chunk's H2D copy before its weights are in the slot.
  bool h2d_before_fill = false;
  // Let the D2H stream skip waiting for the bucket's reduce-scatter / ready
  // event.
  bool d2h_skip_ready_wait = false;
  // Record a bucket's weights-ready event before its H2D copies.
  bool weights_event_early = false;
  // Make the trainer's stream wait for the bucket's D2H copies.
  bool wait_on_compute_stream = false;
};

struct TransferEngineOptions {
  // This process's place in its node (a worker of the job: the Job's
  // worker_rank is the node's index).
  uint32_t local_rank = 0;
  uint32_t local_ranks = 1;
  // Chunks per bucket, a multiple of local_ranks (NodePartition). 0: the
  // smallest multiple of local_ranks holding at least 4 chunks per rank.
  uint64_t bucket_chunks = 0;
  // Pinned slots of each ring (>= 1), each one chunk of the job's chunk size.
  int d2h_slots = 4;
  int h2d_slots = 4;
  // Step streams per server this rank runs (its chunks on a server dealt
  // round-robin between them), <= ClientOptions::connections_per_server.
  int streams_per_server = 1;
  // The delayed parameter update (ZeRO-Offload's DPU): step s's weights are
  // applied before step s + 2's forward instead of s + 1's, so that step s's
  // round trip to the servers runs during step s + 1's forward and backward.
  // Two steps may then be in flight, and the engine holds a second gradient
  // buffer and two more weights buffers on the device (where the weights of
  // odd and even steps arrive; see BeginStep and WaitWeights).
  bool delayed_update = false;
  // Megatron's --optimizer-offload-fraction: the share of the model's
  // parameters whose optimizer runs on the servers, in [0, 1]. Below 1, the
  // tensors ChooseGpuTensors picks keep their optimizer on the GPU: their
  // fp32 master weights and state live in device memory (each local rank
  // holds those of its own chunks), `device_optimizer` updates them after
  // the reduce-scatter, and the servers skip them (sent as tensors without
  // a gradient). In a job of several workers (nodes), or whose steps may run
  // in two phases, the servers instead sum their gradients (sum-only
  // tensors, docs/protocol.md), count them in the norm, and send the sums
  // with the step's decision; each rank updates from those. On a job with
  // no step applied yet, Create reads the kept tensors' initial master
  // weights from the servers; on one that has applied steps (a trainer
  // restarted on its job) their state is missing until WriteGpuState loads
  // it, and BeginStep and ReadGpuState are FAILED_PRECONDITION until then.
  // The servers' checkpoints hold the kept tensors' state when the engine
  // filled their captures (FinishStep) or stored it (StoreGpuState).
  double offload_fraction = 1.0;
  DeviceOptimizer* device_optimizer = nullptr;
  // A node of several local ranks: how long one of the node's collectives
  // may wait for the other ranks once this rank's stream has reached it
  // (WatchedCollective; docs/gpu.md, "A rank that dies"). Past it, or when
  // the node's collectives fail elsewhere, this rank's collectives are
  // aborted: the steps in flight fail (DEADLINE_EXCEEDED, or
  // FAILED_PRECONDITION for another rank's failure), no chunk of an
  // aborted reduce-scatter is sent, and every later BeginStep and
  // CheckNode fails: every rank's engine must be made anew. Longer than
  // ClientOptions::step_timeout, since a peer may wait that long for its
  // servers. Zero: no limit (a dead rank leaves its peers waiting for ever,
  // as plain NCCL does).
  absl::Duration collective_timeout = absl::Minutes(10);
  EngineFaults faults;
};

// The outcome of one send of a rank's kept state into the servers'
// checkpoint captures of a step (TransferEngine::FinishStep).
struct CaptureReport {
  uint64_t step = 0;    // the captured step; 0: nothing to report
  uint64_t chunks = 0;  // the chunks sent
  std::string error;    // why the rest could not be sent (empty: none)
};

// Arrays over a job's index space [0, N) (as FlatState's, or the C API's
// depot_flat_state_t): the fp32 master weights, `num_slots` state slots
// widened to fp32, and one optimizer step count per layout tensor.
struct StateArrays {
  float* master = nullptr;
  float* slots[3] = {nullptr, nullptr, nullptr};
  size_t num_slots = 0;
  uint64_t* tensor_steps = nullptr;
  // The step the state is at (WriteGpuState records it for StoreGpuState).
  uint64_t applied_step = 0;
};

// The tensors (layout indices, ascending) an offload fraction keeps on the
// GPU: walking from the last tensor to the first (backward's order), each
// tensor whose elements still fit within (1 - offload_fraction) of the
// model's parameter elements, so that the kept share is the largest that does
// not exceed it with whole tensors.
std::vector<uint32_t> ChooseGpuTensors(const Layout& layout,
                                       double offload_fraction);

class TransferEngine {
 public:
  // `job` (from Client::OpenJob: its worker_rank is the node's), `device` and
  // `collective` (the node's, of local_ranks ranks with this rank's place;
  // null when local_ranks is 1) must outlive the engine. INVALID_ARGUMENT:
  // options that do not fit (a collective of another size or rank, slots <
  // 1); RESOURCE_EXHAUSTED: device or pinned memory.
  static absl::StatusOr<std::unique_ptr<TransferEngine>> Create(
      Job& job, Device& device, Collective* collective,
      TransferEngineOptions options);

  // Aborts a step in flight and waits for the engine's work to stop. On a
  // node that includes the collectives already queued, which wait for the
  // other ranks: at most options.collective_timeout when they never come.
  ~TransferEngine();

  const NodePartition& partition() const;
  // The flat device buffers: partition().padded_elems() elements each, of
  // the job's grad dtype and weight dtype. Tensor i lives at
  // job.layout().offset(i) in both. weights() is the one forward reads.
  // grads() is the one backward of the step begun last writes: with the
  // delayed update, it alternates between two buffers from step to step
  // (re-point gradient views after each BeginStep).
  void* grads() const;
  void* weights() const;
  // The gradient buffer step `step`'s backward writes (grads() once that
  // step has begun): with the delayed update, one of two by the step's
  // parity; else always the same. Lets a trainer point its gradient views
  // before BeginStep.
  void* grads_of_step(uint64_t step) const;
  // The pinned memory the engine holds, in bytes.
  uint64_t pinned_bytes() const;
  // The tensors whose optimizer runs on this GPU (ChooseGpuTensors), and the
  // device memory their state takes on this rank, in bytes.
  const std::vector<uint32_t>& gpu_tensors() const;
  uint64_t gpu_state_bytes() const;
  // The optimizer state of the tensors kept on the node's devices, which the
  // servers' state (Job::SaveState) does not hold: ReadGpuState writes the
  // kept elements' master weights and slots (widened to fp32) and the kept
  // tensors' step counts over `state`, leaving every other value as it is,
  // so that a FlatState the servers' state decoded into becomes the whole
  // job's. Each local rank holds its own chunks' part: with several,
  // ReadGpuState is a collective of the node (an all-gather on the comm
  // stream, as a step's): every local rank calls it, between the same two
  // steps and with valid arrays (a rank that does not leaves the others
  // waiting, as NCCL does), and every one gets the whole node's state.
  // WriteGpuState loads this rank's part from `state` onto the device (bf16
  // slots rounded to nearest even, as Job::EncodeState), not a collective:
  // every rank loads the same `state`. The servers' state should be loaded
  // from the same FlatState (Job::LoadState), and it makes an engine whose
  // step failed usable again. Neither changes weights().
  // FAILED_PRECONDITION: a step in flight; INVALID_ARGUMENT: null arrays, or
  // fewer slots than the job keeps.
  absl::Status ReadGpuState(const StateArrays& state);
  absl::Status WriteGpuState(const StateArrays& state);
  // The same state in the servers' own arrays (docs/gpu.md, "Offload
  // fraction"), so that a checkpoint the servers take holds it:
  // StoreGpuState writes this rank's part (its chunks' kept elements and the
  // kept tensors' step counts there) over the servers' values
  // (Job::PatchStatePart), at the step the state is at, which must be the
  // servers' step; RestoreGpuState reads this rank's part back from the
  // servers' arrays (Job::ReadStatePart) onto the device, as WriteGpuState
  // from a saved state. The servers' arrays hold the kept state only where
  // it was stored, or brought back by a checkpoint that holds it: one taken
  // after a StoreGpuState of its step, or a periodic one this engine filled
  // (FinishStep has each chunk's kept state sent into the servers'
  // captures that ask for it: StepResult::capture_chunks, docs/checkpoints.md
  // "The state the workers keep"). Each chunk says whether it holds it, and
  // RestoreGpuState refuses one that does not (FAILED_PRECONDITION, as
  // after steps the servers only summed). With several local ranks
  // each rank stores and restores its own part; StoreGpuState is then a
  // collective of the node (every rank calls it between the same two steps):
  // it returns once every rank has stored, OK only if every rank did, so
  // that one rank may take the checkpoint after it (ABORTED: another rank
  // failed, its own call says why). RestoreGpuState is a collective of the
  // node too: OK only if every rank restored its part; a rank whose own
  // part came back while another's did not gets ABORTED, and its state is
  // missing again (no rank steps from a node state that is not whole). A
  // rank that keeps nothing stores nothing. FAILED_PRECONDITION: a step in
  // flight; and for StoreGpuState: the state missing (an engine made on a
  // job with applied steps, before a load) or lost (a failed step), the
  // servers at another step, or the node's verdict failed (CheckNode).
  // Neither changes weights().
  absl::Status StoreGpuState();
  absl::Status RestoreGpuState();

  // Starts step `step` (options as Job::Step, without weight_overrides). A
  // step that needs two phases (the config clips, has a skip threshold or
  // scales the loss dynamically, without a known_commit) opens one stream to
  // every server with chunks, also those where this rank owns none: each
  // receives the server's GradStats, and every rank of every node commits
  // the same decision; FinishStep's result carries it (grad_norm, found_inf,
  // skipped, clip_coef).
  // While a step is in flight the next one is step + 1 (INVALID_ARGUMENT
  // otherwise); with none in flight any step may begin (a failed step's
  // retry).
  // FAILED_PRECONDITION: a step is in flight (with the delayed update: two
  // are). With the delayed update the loop is: forward s (WaitWeights of
  // every bucket: they apply step s - 2's weights), BeginStep(s), backward s
  // (GradientsReady), FinishStep() (step s - 1's).
  absl::Status BeginStep(uint64_t step, const StepOptions& options);
  // Bucket `bucket`'s gradients are complete in grads() once `stream`'s work
  // queued so far has run. Returns at once; `stream` never waits for the
  // engine. INVALID_ARGUMENT: no such bucket, or named twice in the step;
  // FAILED_PRECONDITION: no step in flight; the step's error once it failed
  // (with one local rank; a node's ranks name every bucket of a failed step
  // too, see CheckNode, and FinishStep reports the error).
  absl::Status GradientsReady(uint64_t bucket, Stream& stream);
  // Makes `stream`'s later work wait until bucket `bucket`'s updated weights
  // are in weights(): those of the last step begun, or with the delayed
  // update of the one before it (before that: the initial weights, no wait).
  // While that step is in flight, blocks the host until the engine has
  // queued that bucket's weights (the first bucket's may take a round trip
  // to the servers). With the delayed update it also queues, on `stream`,
  // the copy of the bucket from the buffer the weights arrived in into
  // weights(), once per step and bucket. Once the node's collectives were
  // aborted (options.collective_timeout), their error: the weights may not
  // be whole.
  absl::Status WaitWeights(uint64_t bucket, Stream& stream);
  // Finishes the oldest step in flight: waits until its streams have ended
  // and every weight copy is queued (not run: WaitWeights orders the
  // device); returns its result (summed over this rank's streams) or its
  // first error. After an error every step in flight is aborted, the
  // engine's streams are drained, and a step may begin again.
  // With an offload fraction, a step the servers capture for a checkpoint
  // has its kept state sent into those captures in the background, on a
  // thread of the engine's own: FinishStep starts the send and does not
  // wait for it, but waits for the previous send before it starts another
  // (one at a time). The result reports a send that has ended since the
  // last report, if any (StepResult::capture_step, capture_chunks,
  // capture_error); WaitCaptures waits for one still under way.
  absl::StatusOr<StepResult> FinishStep();
  // Waits for the kept state's send into the servers' checkpoint captures,
  // if one is under way, and returns the outcome no FinishStep has reported
  // yet (step 0: none). StoreGpuState, and FinishStep of a failed step,
  // wait for the send too (keeping its outcome for the next report), so
  // that a checkpoint or a rollback after them never meets it; a trainer
  // that calls Job::Checkpoint, RollBack or LoadState by itself between
  // steps calls this first.
  CaptureReport WaitCaptures();

  // A node of several local ranks: a step may fail on some ranks (a server
  // they send to died) and go through on others. Every rank still queues
  // all of the step's collectives (GradientsReady names buckets, and the
  // comm stream runs the reduce-scatters and all-gathers, also after the
  // step failed here; FinishStep reports the error), so that no rank waits
  // for a collective another never queues; the last is an all-reduce of
  // each rank's failure flag. CheckNode reads that verdict for every step
  // FinishStep returned without an error here and not yet checked, waiting
  // for the device to reach it: ABORTED naming the first step that failed
  // on another rank (this rank's weights() then hold what the others'
  // all-gather gave, not the servers' weights: recover as from a failed
  // step), OK otherwise; each verdict is read once. BeginStep checks too,
  // so no step begins on such weights (and a step in flight then fails
  // with the same error); call CheckNode after the last step (before the
  // weights are used or saved). One local rank: always OK. A step that
  // ended before every bucket was named (FinishStep's FAILED_PRECONDITION),
  // or a collective that failed, leaves the node's collectives out of
  // step: every later BeginStep is FAILED_PRECONDITION, and every rank's
  // engine must be made anew. After the node's collectives were aborted
  // (options.collective_timeout), CheckNode returns why, every time.
  absl::Status CheckNode();

  // A node of several local ranks: returns once every rank's engine has
  // called it (one all-reduce on the node's collective, under the collective
  // timeout). For work on the servers that one rank must finish before
  // another begins a step: after a failed step every rank reconciles the
  // job (Job::Reconcile), and a rank's next step, half applied on the
  // servers, would look to a later rank's reconcile like servers at
  // different steps, and be rolled back. FAILED_PRECONDITION with a step in
  // flight, or once the node's collectives are out of step or aborted (as
  // BeginStep); DEADLINE_EXCEEDED when another rank does not come within
  // options.collective_timeout (the node is then broken). One local rank:
  // OK at once.
  absl::Status SynchronizeNode();
  // The same collective, which also returns the least `step` any rank
  // passed (an all-gather of each rank's): what the node's ranks agree on
  // when each found a step on its own that may differ (the newest whole
  // checkpoint after a server restart, which a checkpoint written between
  // two ranks' queries can change). Errors as SynchronizeNode. One local
  // rank: `step`.
  absl::StatusOr<uint64_t> AgreeOnStep(uint64_t step);

 private:
  class Impl;
  explicit TransferEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace depot::gpu

#endif  // DEPOT_CLIENT_SRC_GPU_TRANSFER_ENGINE_H_
