// libdepot_client: the trainer's side of Depot.
//
// A trainer connects to the servers that hold its job, creates (or attaches to) the
// job, initialises the master weights once, then calls Step once per training step
// with its gradients; Step returns when the updated weights are in the output buffer.
//
//   depot::ClientOptions options;
//   options.servers = {"10.0.0.1:50051", "10.0.0.2:50051"};
//   auto client = depot::Client::Connect(options);          // StatusOr
//   depot::JobConfig config;                                // see depot/job_config.h
//   config.name = "llama-7b-run3";
//   config.tensors = {{"embed", 32000 * 4096, 0}, {"norm", 4096, 1}};
//   config.num_workers = 2;
//   auto job = (*client)->OpenJob(config, /*worker_rank=*/rank);
//   if (rank == 0) (*job)->InitWeights(initial_weights, depot::DType::kFloat32);
//   for (uint64_t step = 1; ...; ++step) {
//     ... backward writes grads into a flat buffer of N = (*job)->total_elems() ...
//     depot::StepResult result;
//     absl::Status s = (*job)->Step(step, grads, weights, &result);
//   }
//
// Loss scaling, non-finite skipping and global gradient clipping happen in the
// step (docs/protocol.md): pass the loss scale in StepOptions, and read
// result.found_inf / skipped / grad_norm back.
//
// Buffers are flat over the job's index space [0, N) (depot/layout.h): tensor i
// lives at Layout::offset(i); padding between tensors is ignored on the way in and
// written as zero on the way out.
//
// Errors are absl::Status values carrying the server's code and message; every RPC
// has a deadline, so no call hangs on a dead server.
//
// Thread safety: a Client may be shared by threads. A Job's methods must not be
// called concurrently with each other on the same Job.
#ifndef DEPOT_CLIENT_H_
#define DEPOT_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "depot/dtype.h"
#include "depot/export.h"
#include "depot/job_config.h"
#include "depot/layout.h"
#include "depot/shard_plan.h"

namespace depot {

struct ClientOptions {
  // host:port of each server, in shard-plan order: servers[s] holds range s.
  std::vector<std::string> servers;
  // Deadline of unary RPCs (create, status, delete).
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Deadline of one whole Step, InitWeights or Pull across all servers. A step
  // waits for every worker's contribution, so this bounds how long a slow peer
  // may keep the others waiting.
  absl::Duration step_timeout = absl::Minutes(5);
  // Chunks a worker may have sent on one Step stream without having received
  // their updated weights. Bounds in-flight memory per (worker, server) to
  // about connections_per_server * max_inflight_chunks * chunk size *
  // (grad + weight dtype size).
  int max_inflight_chunks = 4;
  // How long a one-phase step keeps sending a server's stream again after it
  // failed with UNAVAILABLE (a cut connection, a blackhole that keepalive
  // found, a server restarting), with backoff from 50 ms to 2 s, counted from
  // the first failure and never past step_timeout (docs/protocol.md,
  // "Idempotency and retries"). Zero: no retry, the step fails at once. Once
  // the window has passed the step fails with the last UNAVAILABLE; if
  // step_timeout ends it first, with DEADLINE_EXCEEDED.
  absl::Duration unavailable_retry = absl::Seconds(30);
  // TCP connections to each server, >= 1. A one-phase step splits the
  // server's chunks over them, one Step stream each, so that one connection's
  // throughput does not cap the step's; a two-phase step uses the first only
  // (docs/protocol.md, "Transport").
  int connections_per_server = 3;
  // Opt-in, for the whole process: true makes Connect set glibc malloc's mmap
  // threshold to 32 MiB and its trim threshold to 64 MiB
  // (common/wire/transport_memory.h), so that gRPC's receive buffers are
  // reused instead of returned to the kernel and faulted in again. Depot's
  // transfers then take about a third less CPU (docs/protocol.md,
  // "Transport"); the process keeps up to 64 MiB of freed memory per malloc
  // arena, and every allocation in it is served under these thresholds. A
  // library does not change process-wide settings unasked, so the default
  // leaves malloc alone; a trainer whose process is its own should set it.
  // Once set, the thresholds stay for the life of the process. Malloc
  // settings in the environment (GLIBC_TUNABLES, MALLOC_*_THRESHOLD_) win.
  // depot_retain_transport_buffers() is the C API's way to the same.
  bool retain_transport_buffers = false;

  // Security (docs/security.md). All empty: plaintext, no credentials, as a
  // server without --tls_cert expects.
  //
  // PEM file of the CA that signed the servers' certificates (their
  // --tls_cert): set, every connection is TLS and checks the server's
  // certificate against it and the address's host name.
  std::string tls_ca_file;
  // mTLS: PEM files of this client's certificate and its key, both or
  // neither, for servers started with --tls_client_ca. Need tls_ca_file.
  std::string tls_cert_file;
  std::string tls_key_file;
  // The bearer token that names this client's tenant on servers started with
  // --auth_token_file, sent with every call; or the file whose first line is
  // the token. At most one of the two; they need tls_ca_file (a token is
  // never sent in clear text). Connect fails with INVALID_ARGUMENT for a
  // combination that breaks these rules, or a file it cannot read.
  std::string auth_token;
  std::string auth_token_file;
};

// The global decision on a step's gradients: skip the step (no state changes,
// the optimizer's step count does not advance), or multiply the unscaled
// gradients by clip_coef and update.
struct StepCommit {
  double clip_coef = 1.0;  // in (0, 1]; 1 = no clipping; ignored when skip
  bool skip = false;
};

// New master weights for one whole tensor (StepOptions::weight_overrides).
struct TensorWeights {
  uint32_t tensor_index = 0;      // in the layout
  const float* values = nullptr;  // the tensor's numel values
};

// Per-step options of Job::Step. Every worker must pass the same values,
// except no_grad_tensors and weight_overrides, which are this worker's own.
struct StepOptions {
  // lr and weight_decay overrides per param group for this step (e.g. from a
  // schedule); groups not listed use the job's OptimizerConfig.
  std::vector<GroupHyperParams> group_hparams;
  // The gradients arrive multiplied by this (the loss was); the servers
  // multiply their sum by float(1 / loss_scale). 1 = no loss scaling. Must be
  // finite and > 0.
  double loss_scale = 1.0;
  // The decision, when the trainer already knows it (its GPUs reduced the
  // gradients over the whole model): the step then runs in one phase and the
  // servers apply it. Without it the library decides: two phases (the servers
  // report the gradient's norm, non-finite values and zeros, and every worker
  // commits the same decision) when the config clips (clip_grad > 0), has a
  // grad_norm_skip_threshold, or uses dynamic loss scaling (loss_scale == 0
  // with fp16 gradients); otherwise one phase with no clipping and no skip.
  std::optional<StepCommit> known_commit;
  // Tensors (layout indices, each once) this worker has no gradient for, as
  // torch's `.grad is None`: their part of `grads` is ignored (taken as zero).
  // A tensor that no worker has a gradient for is skipped by the servers: no
  // update, no weight decay, no moment decay, its step count unchanged
  // (torch.optim's semantics); one that only some workers lack is updated
  // from the others' gradients (as DDP, which averages in zeros).
  std::vector<uint32_t> no_grad_tensors;
  // Tensors whose weights the trainer changed outside the optimizer (an
  // in-place edit, a loaded checkpoint of the model): their values become the
  // servers' fp32 master weights before this step's update, and the optimizer
  // state (moments, step counts) is kept. Read during the call only.
  std::vector<TensorWeights> weight_overrides;
};

// The outcome of one Step, summed over the servers.
struct StepResult {
  uint64_t step = 0;
  uint64_t chunks = 0;           // weight chunks received
  uint64_t chunks_replayed = 0;  // chunks the servers had already applied
  uint64_t bytes_sent = 0;       // gradient payload bytes
  uint64_t bytes_received = 0;   // weight payload bytes
  double update_seconds = 0.0;   // server CPU update time, summed
  double wall_seconds = 0.0;     // Step's own duration

  // Gradient numerics. g is the workers' summed gradient times
  // float(1 / loss_scale), over every tensor element of the model (padding
  // excluded). grad_norm, zero_count and found_inf are measured by the servers
  // in a two-phase step only (0 / false in one phase).
  bool two_phase = false;
  // ||g|| in config().optimizer.clip_grad_norm_type: L2 (sqrt of the sum of
  // squares, accumulated in double) or inf (max |g|). Inf or NaN when g is
  // not finite.
  double grad_norm = 0.0;
  uint64_t zero_count = 0;  // elements of g exactly 0
  bool found_inf = false;   // g holds a NaN or Inf: the step was skipped
  // The step changed no state: found_inf, grad_norm above the config's
  // grad_norm_skip_threshold, or known_commit.skip.
  bool skipped = false;
  // The clip coefficient applied, Megatron's clip_grad / (grad_norm + 1e-6)
  // when that is < 1; 1 when none was (or the step was skipped).
  double clip_coef = 1.0;

  // A GPU worker with an offload fraction (TransferEngine::FinishStep): a
  // send of its kept state into the servers' checkpoint captures of step
  // `capture_step` that has ended since the last report (0: none; the send
  // runs behind the steps, docs/checkpoints.md "The state the workers
  // keep"): the chunks it sent, and why the rest could not be sent (empty:
  // all were). The steps stand either way; a checkpoint without that state
  // says so.
  uint64_t capture_step = 0;
  uint64_t capture_chunks = 0;
  std::string capture_error;
};

// A server's view of the job.
struct ServerJobStatus {
  std::string server;
  uint64_t job_id = 0;
  uint64_t step = 0;  // last step applied to every chunk of the shard
  uint64_t shard_begin = 0;
  uint64_t shard_end = 0;
  uint64_t state_bytes = 0;
  uint64_t state_checksum = 0;  // only when asked for
  // The oldest step with contributions on this server that still waits for
  // others (0: none), the worker ranks that have not yet sent some chunk of it
  // that another worker has sent (ascending; empty when every chunk sent so
  // far is complete), and the seconds since its first contribution there.
  uint64_t pending_step = 0;
  std::vector<uint32_t> missing_workers;
  double waiting_seconds = 0.0;
};

// A server's checkpoints of the job and where the job stands there
// (Job::ListCheckpoints).
struct ServerCheckpoints {
  std::string server;
  // The steps that server holds a complete checkpoint of, newest first.
  std::vector<uint64_t> steps;
  // Of them, ascending, those whose checkpoint lacks the state of tensors
  // the workers keep in some chunk (docs/checkpoints.md, "The state the
  // workers keep").
  std::vector<uint64_t> steps_lacking_worker_state;
  uint64_t step = 0;  // last step applied to every chunk of the shard
  // The newest step applied to some chunk: step + 1 while a step is half
  // applied there.
  uint64_t newest_step = 0;
};

// What Job::Reconcile found and did.
struct Reconciled {
  // The step every server of the job is at now: the trainer goes on with
  // step + 1.
  uint64_t step = 0;
  // The servers disagreed and were rolled back to `step`.
  bool rolled_back = false;
};

// The status Job::Step returns when the job had to be rolled back under it
// (docs/checkpoints.md, "Rolling back"): ABORTED, carrying the step the job is
// at now, which RolledBackStep reads. The trainer reloads its data position
// and weights for that step and goes on with the next.
DEPOT_API absl::Status RolledBackError(uint64_t step, absl::string_view why);
// The step a RolledBackError carries; nullopt for any other status.
DEPOT_API std::optional<uint64_t> RolledBackStep(const absl::Status& status);

// A job's whole optimizer state as flat arrays over its index space [0, N),
// for reading it or building it elsewhere (torch's optimizer state):
// Job::DecodeState and Job::EncodeState.
struct FlatState {
  // The last step the servers applied (every chunk's).
  uint64_t applied_step = 0;
  std::vector<float> master;  // N fp32 master weights; padding is 0
  // One array of N per state slot of the job (OptimizerStateSlots of the
  // most any group keeps: Adam exp_avg, exp_avg_sq[, max_exp_avg_sq]; SGD
  // momentum_buffer; Adagrad state_sum; Lion exp_avg), widened to fp32.
  std::vector<std::vector<float>> slots;
  // Each tensor's optimizer step count (torch's state["step"]), in layout
  // order.
  std::vector<uint64_t> tensor_steps;
  // Read by Job::ReadStatePart only: some chunk of the part holds an older
  // state of the tensors the workers keep than its step (a GPU worker's
  // offload fraction; docs/checkpoints.md, "The state the workers keep").
  bool lacks_worker_state = false;
};

class DEPOT_API Job {
 public:
  virtual ~Job() = default;

  const JobConfig& config() const { return config_; }
  const Layout& layout() const { return layout_; }
  const ShardPlan& plan() const { return plan_; }
  uint64_t fingerprint() const { return fingerprint_; }
  uint32_t worker_rank() const { return worker_rank_; }
  // N: the length of the flat buffers Step, InitWeights and Pull take.
  uint64_t total_elems() const { return layout_.total_elems(); }

  // Sets the master weights of the whole job from `weights`, N elements of `dtype`
  // (bf16/fp16 are upcast). Padding is stored as zero whatever the buffer holds.
  // FAILED_PRECONDITION if a step has already been applied on a server.
  virtual absl::Status InitWeights(const void* weights, DType dtype) = 0;

  // Runs training step `step` (1, 2, ...) for this worker: sends `grads`
  // (N elements of config().grad_dtype) to all servers in parallel, pipelined per
  // chunk, and writes the updated weights (N elements of config().weight_dtype)
  // into `weights_out`. Returns once every chunk's weights have arrived (a
  // skipped step returns the unchanged weights). Calling it again for a step
  // that the servers already applied returns the same weights and applies
  // nothing twice. `options` (every worker must pass the same) carries
  // per-group hyperparameters, the loss scale and a known commit. `result` may
  // be null. INVALID_ARGUMENT: loss_scale not finite or <= 0, a known
  // clip_coef outside (0, 1] without skip, a no_grad or override tensor index
  // out of range or listed twice, or override values null.
  // A server that restarted under the step (killed, restored from its
  // checkpoints) is handled by Reconcile: when every server still agrees the
  // step is sent again; when the job had to be rolled back to an earlier
  // step t, Step returns RolledBackError(t) (ABORTED; RolledBackStep gives
  // t): the trainer resumes with step t + 1 from the weights of step t.
  // DEADLINE_EXCEEDED: the step did not complete within
  // ClientOptions::step_timeout; the message then says what each server waits
  // for, as far as the servers answer a short GetJob ("servers H:P, H:P are
  // waiting for worker rank 1 (of 2) to send their gradients (for up to 29.8
  // s)").
  virtual absl::Status Step(uint64_t step, const void* grads, void* weights_out,
                            StepResult* result,
                            const StepOptions& options = {}) = 0;

  // Copies weights [begin, end) into `out` as `dtype` (kFloat32 gives the
  // master weights exactly), each server's part at one step: `step`, or with
  // 0 the step that server reports in Status (the last it applied to every
  // chunk), even while a later step is half applied there. A step is held
  // while the job is at it or at the step after it, on every server of the
  // range; a chunk already past the step is read from the weights it sent
  // for it, in config().weight_dtype only. OUT_OF_RANGE unless begin <= end
  // <= N. FAILED_PRECONDITION: a server is not yet at `step` or is two steps
  // past it ("step 7 is no longer held"), or `dtype` is not the weight dtype
  // for a chunk past `step` (unless that is kFloat32).
  //
  // A worker that rejoins a running job (restarted after a crash) resumes
  // from the oldest step the servers report in Status, t, and pulls at t
  // (with t = 0, before the first step, its own initial weights are the
  // job's): its peers wait in step t + 1 for its gradients, which it
  // computes from the weights of t on every server (docs/protocol.md, "A
  // worker that rejoins"). Partly written on error.
  virtual absl::Status Pull(uint64_t begin, uint64_t end, DType dtype,
                            void* out, uint64_t step) = 0;
  // Pull at each server's completed step (step 0).
  absl::Status Pull(uint64_t begin, uint64_t end, DType dtype, void* out) {
    return Pull(begin, end, dtype, out, 0);
  }

  // Each server's status, in server order.
  virtual absl::StatusOr<std::vector<ServerJobStatus>> Status(
      bool with_checksum) = 0;

  // Deletes the job on every server, freeing its state.
  virtual absl::Status Delete() = 0;

  // Has every server write its shard of the job to its --checkpoint_dir now
  // (docs/checkpoints.md) and returns the step the checkpoint holds, once
  // every shard is durable: a restarted server restores it by itself. Call it
  // between steps, with no Step in flight on any worker (one worker calls
  // it). FAILED_PRECONDITION: a server has no --checkpoint_dir, a step is in
  // flight, or the servers are at different steps (each named);
  // UNAVAILABLE: a server is writing a checkpoint of the job already, or a
  // write failed (fsync): retry.
  virtual absl::StatusOr<uint64_t> Checkpoint() = 0;

  // Each server's complete checkpoints of the job and its steps, in server
  // order (empty lists from servers without --checkpoint_dir).
  virtual absl::StatusOr<std::vector<ServerCheckpoints>> ListCheckpoints() = 0;

  // Rolls the job back to `step` on every server: each drops the
  // contributions in flight (their Step streams end ABORTED) and restores
  // its checkpoint of `step` unless every chunk already is at it; later
  // checkpoints are removed. FAILED_PRECONDITION: a server has not completed
  // `step`; NOT_FOUND: a server has no complete checkpoint of it (nothing
  // changed there); DATA_LOSS: the checkpoint is damaged. On error some
  // servers may have rolled back: call it again, or Reconcile.
  virtual absl::Status RollBack(uint64_t step) = 0;

  // Replaces the job's state on every server by the server-side checkpoint
  // of `step` that a job of the same name and config, on any number of
  // servers, wrote into `checkpoint_dirs` (those servers' --checkpoint_dir,
  // readable by this job's servers: a shared filesystem; docs/
  // checkpoints.md, "Restoring onto another server count"). First every
  // server reads and verifies the old shard files that hold its chunks and
  // changes nothing; only when every server succeeded does each import its
  // part. Call it before the first Step (or between steps, with none in
  // flight); the next Step is step + 1. Errors of the first pass, after
  // which no server changed: NOT_FOUND: no checkpoint of `step` in the
  // directories; FAILED_PRECONDITION: the step is incomplete (the missing
  // server's manifest is named) or of another config; DATA_LOSS: a manifest
  // or shard file is damaged or missing (named, with the section). An error
  // of the second pass (a server down, a step in flight) may leave some
  // servers imported and others not: call it again.
  virtual absl::Status ImportCheckpoint(
      uint64_t step, const std::vector<std::string>& checkpoint_dirs) = 0;

  // Makes the job's servers agree again after a server restarted (killed and
  // restored from its checkpoints, so behind the others, and with a new job
  // id): opens the job again on every server, and when they are not all at
  // one step (a step half applied counts as at the step before it), rolls
  // every server back to the newest step each can return to (its checkpoint
  // of it, or being exactly at it). Step calls it by itself when a step
  // fails because a server lost or changed the job. Not concurrently with
  // other calls on this Job. DATA_LOSS: no such step exists (a server lost
  // the job: it restarted without a checkpoint of it).
  virtual absl::StatusOr<Reconciled> Reconcile() = 0;

  // The whole optimizer state of the job (master weights, optimizer slots, the
  // step counters of every chunk) as an opaque byte string for LoadState
  // (format: client/src/state_blob.h). Call it between steps, with no Step in
  // flight on any worker.
  virtual absl::StatusOr<std::string> SaveState() = 0;

  // Replaces the job's state on every server by `blob` from SaveState. The
  // blob fits a job with the same config; the job's name is not checked, so a
  // state can be loaded into a job of another name. Call it before the first
  // Step (or between steps, with none in flight); the next Step is then the
  // saved step + 1. DATA_LOSS: blob truncated or corrupt (nothing changes).
  // FAILED_PRECONDITION: the blob is from a job with another config (nothing
  // changes), or a server has a step in flight. Each server replaces its shard
  // atomically; an error on one server (e.g. it is down) leaves the others'
  // shards loaded.
  virtual absl::Status LoadState(const std::string& blob) = 0;

  // The state in a SaveState blob of this job's config, as flat arrays.
  // DATA_LOSS: a corrupt blob, or one whose chunks do not describe the shard
  // plan. FAILED_PRECONDITION: a blob of another config.
  virtual absl::StatusOr<FlatState> DecodeState(
      const std::string& blob) const = 0;

  // A blob for LoadState holding `state`: bf16 slots are rounded to nearest
  // even, padding is stored as 0. INVALID_ARGUMENT: an array of the wrong
  // size or count, or a tensor step count above applied_step.
  virtual absl::StatusOr<std::string> EncodeState(
      const FlatState& state) const = 0;

  // A part of the state: the elements [begin, end) of the job's index space,
  // in a FlatState whose master and slots hold end - begin elements (element
  // `begin` first) and whose tensor_steps has one count per tensor of the
  // layout, of which only those of the tensors with elements in [begin, end)
  // mean anything. What a GPU worker's kept state moves by (docs/gpu.md,
  // "Offload fraction"): the servers' checkpoints hold it once it is written
  // into their arrays. Both read the chunks over [begin, end) from the servers
  // that hold them (ExportState of those chunks, docs/protocol.md, "Patching
  // a part of the state"); call them between steps, with no Step in flight on
  // any worker. OUT_OF_RANGE unless begin < end <= N; FAILED_PRECONDITION:
  // those chunks are at different steps (a step in flight).
  virtual absl::StatusOr<FlatState> ReadStatePart(uint64_t begin,
                                                  uint64_t end) = 0;
  // Writes `part` over the elements [begin, end) that belong to a tensor
  // (padding keeps its zeros) and its counts over those tensors' (segments
  // in the chunks, as the servers keep them), at the servers' step, which
  // must be part.applied_step: every other element, count and checkpoint
  // stays (an ImportState patch). Each server patches its chunks at once;
  // an error on one leaves the others patched. INVALID_ARGUMENT: arrays of
  // the wrong size or count, a count above applied_step;
  // FAILED_PRECONDITION: the servers are at another step than
  // part.applied_step, or a step is in flight.
  virtual absl::Status PatchStatePart(uint64_t begin, uint64_t end,
                                      const FlatState& part) = 0;
  // The part's state at step `step` into the servers' checkpoint captures of
  // that step that wait for the state of the step's sum-only tensors (an
  // ImportState patch with capture_step; docs/checkpoints.md, "The state
  // the workers keep"). Every chunk over [begin, end) is sent; a server
  // takes from each only the elements of the step's sum-only tensors and
  // their counts, so [begin, end) must cover all of those in each chunk it
  // touches, and each such chunk must be one its capture waits for. No
  // read first: it may run while later steps are in flight.
  // INVALID_ARGUMENT: arrays of the wrong size, a count above `step`, a
  // chunk no capture waits for; FAILED_PRECONDITION: a server's capture of
  // `step` waits no more (written without it, or dropped).
  virtual absl::Status PatchCapturePart(uint64_t step, uint64_t begin,
                                        uint64_t end,
                                        const FlatState& part) = 0;
  // The newest step at or before `at` that every server with chunks holds a
  // complete checkpoint of whose every chunk holds the state of the tensors
  // the workers keep (none lacks it); NOT_FOUND when there is none.
  virtual absl::StatusOr<uint64_t> NewestCheckpointWithWorkerState(
      uint64_t at) = 0;

 protected:
  Job(JobConfig config, Layout layout, ShardPlan plan, uint64_t fingerprint,
      uint32_t worker_rank)
      : config_(std::move(config)),
        layout_(std::move(layout)),
        plan_(std::move(plan)),
        fingerprint_(fingerprint),
        worker_rank_(worker_rank) {}

 private:
  JobConfig config_;
  Layout layout_;
  ShardPlan plan_;
  uint64_t fingerprint_;
  uint32_t worker_rank_;
};

class DEPOT_API Client {
 public:
  virtual ~Client() = default;

  // Opens channels to options.servers. Does not wait for them to be up; the first
  // RPC does. INVALID_ARGUMENT if the list is empty or an address is malformed.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(ClientOptions options);

  // Waits until every server's health service reports SERVING, or the deadline.
  // UNAVAILABLE (naming the server) if one does not.
  virtual absl::Status WaitForServers(absl::Duration timeout) = 0;

  // Creates the job on every server, or attaches to it if one with the same
  // name and identical config exists. Job names are per tenant: only the
  // caller's own tenant's jobs count (docs/security.md). config.num_servers is
  // set from the server list. FAILED_PRECONDITION if the tenant's job of that
  // name exists with a different config; RESOURCE_EXHAUSTED if a server's
  // memory budget would be exceeded; INVALID_ARGUMENT for an invalid config or
  // a worker_rank >= num_workers.
  virtual absl::StatusOr<std::unique_ptr<Job>> OpenJob(JobConfig config,
                                                        uint32_t worker_rank) = 0;

  const ClientOptions& options() const { return options_; }

 protected:
  explicit Client(ClientOptions options) : options_(std::move(options)) {}

 private:
  ClientOptions options_;
};

}  // namespace depot

#endif  // DEPOT_CLIENT_H_
