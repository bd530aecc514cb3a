/* depot.h: the C API of libdepot_client, a stable boundary for any language.
 *
 * It wraps the C++ API (depot/client.h) one to one: a client connects to the
 * servers, a job is opened on it (created, or attached to when it exists with
 * the same config), its weights are initialised once, then each training step
 * sends this worker's gradients and receives the updated weights.
 *
 *   const char* servers[] = {"10.0.0.1:50051", "10.0.0.2:50051"};
 *   depot_client_t* client;
 *   if (depot_client_create(servers, 2, NULL, &client) != DEPOT_OK) {
 *     fprintf(stderr, "%s\n", depot_last_error());
 *   }
 *   depot_client_wait_for_servers(client, 30.0);
 *   depot_tensor_spec_t tensors[] = {{"w", 4096, 0}, {"b", 64, 1}};
 *   depot_job_config_t config;
 *   depot_job_config_init(&config);           // the library's defaults
 *   config.name = "run3";
 *   config.tensors = tensors;
 *   config.num_tensors = 2;
 *   config.optimizer.lr = 3e-4;
 *   depot_job_t* job;
 *   depot_job_open(client, &config, 0, &job);
 *   depot_job_init_weights(job, initial, DEPOT_DTYPE_FP32);
 *   for (uint64_t step = 1; ...; ++step) {
 *     depot_job_step(job, step, grads, weights, NULL, NULL);
 *   }
 *   depot_job_destroy(job);
 *   depot_client_destroy(client);
 *
 * Buffers are flat over the job's index space [0, N), N =
 * depot_job_total_elems(job): tensor i lives at depot_job_tensor_offset(job,
 * i); padding between tensors is ignored on the way in and written as zero on
 * the way out. Buffers are host memory.
 *
 * Errors: every function that can fail returns a status code, DEPOT_OK (0) or
 * one of the absl / gRPC canonical codes below (docs/protocol.md lists which
 * call returns which). depot_last_error() then returns the message, prefixed
 * with the server's address when a server reported it. No C++ exception
 * crosses this boundary: an unexpected one becomes DEPOT_INTERNAL (or
 * DEPOT_RESOURCE_EXHAUSTED for an allocation failure).
 *
 * Thread safety: a depot_client_t may be used by several threads at once
 * (opening jobs, waiting for servers). A depot_job_t's functions must not be
 * called concurrently on the same job; different jobs are independent. The
 * last error is per thread. A job may outlive the client it was opened on.
 */
#ifndef DEPOT_DEPOT_H_
#define DEPOT_DEPOT_H_

#include <stddef.h>
#include <stdint.h>

#include "depot/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Changes whenever a struct or a signature of this header changes; bindings
 * that mirror the structs (the Python package) check it at load time. */
#define DEPOT_API_VERSION 16
DEPOT_API uint32_t depot_api_version(void);

/* Status codes: the absl::StatusCode / grpc::StatusCode numbers. */
enum {
  DEPOT_OK = 0,
  DEPOT_CANCELLED = 1,
  DEPOT_UNKNOWN = 2,
  DEPOT_INVALID_ARGUMENT = 3,
  DEPOT_DEADLINE_EXCEEDED = 4,
  DEPOT_NOT_FOUND = 5,
  DEPOT_ALREADY_EXISTS = 6,
  DEPOT_PERMISSION_DENIED = 7,
  DEPOT_RESOURCE_EXHAUSTED = 8,
  DEPOT_FAILED_PRECONDITION = 9,
  DEPOT_ABORTED = 10,
  DEPOT_OUT_OF_RANGE = 11,
  DEPOT_UNIMPLEMENTED = 12,
  DEPOT_INTERNAL = 13,
  DEPOT_UNAVAILABLE = 14,
  DEPOT_DATA_LOSS = 15,
  DEPOT_UNAUTHENTICATED = 16,
};

/* The message of the last call on this thread that failed; "" after a call
 * that succeeded. Valid until the next depot_* call on this thread. */
DEPOT_API const char* depot_last_error(void);

/* 1 when the last call on this thread that failed failed because the job was
 * rolled back under it (depot::RolledBackError, DEPOT_ABORTED), with *step
 * (may be NULL) the step the job is at now: reload the trainer's data
 * position and weights for it and go on with *step + 1. 0 otherwise. */
DEPOT_API int depot_last_error_rolled_back(uint64_t* step);

/* "OK", "INVALID_ARGUMENT", ...; "UNKNOWN_CODE" for a number not above. */
DEPOT_API const char* depot_status_name(int code);

/* Element types; the values of depot::DType. */
enum {
  DEPOT_DTYPE_FP32 = 1,
  DEPOT_DTYPE_BF16 = 2,
  DEPOT_DTYPE_FP16 = 3,
};

/* Optimizers; the values of depot::OptimizerKind (docs/optimizers.md). */
enum {
  DEPOT_OPTIMIZER_ADAMW = 1,
  DEPOT_OPTIMIZER_ADAM = 2,
  DEPOT_OPTIMIZER_SGD = 3,
  DEPOT_OPTIMIZER_ADAGRAD = 4,
  DEPOT_OPTIMIZER_LION = 5,
};

/* Norms of global gradient clipping; the values of depot::GradNormType. */
enum {
  DEPOT_GRAD_NORM_L2 = 1,
  DEPOT_GRAD_NORM_INF = 2,
};

typedef struct depot_client depot_client_t;
typedef struct depot_job depot_job_t;

/* ----------------------------------------------------------------- client */

typedef struct depot_client_options {
  double rpc_timeout_seconds;  /* deadline of unary RPCs */
  double step_timeout_seconds; /* deadline of a whole step, init or pull */
  int32_t max_inflight_chunks; /* per Step stream */
  int32_t connections_per_server; /* TCP connections to each server */
  /* How long a step sends a server's stream again after UNAVAILABLE
   * (depot::ClientOptions::unavailable_retry); 0: never. */
  double unavailable_retry_seconds;
  /* Security (depot::ClientOptions, docs/security.md); NULL or "" each:
   * unset. The strings are copied by depot_client_create. */
  const char* tls_ca_file;     /* PEM CA of the servers' certificates: TLS */
  const char* tls_cert_file;   /* mTLS: this client's certificate (PEM) */
  const char* tls_key_file;    /* mTLS: its private key (PEM) */
  const char* auth_token;      /* bearer token naming the tenant */
  const char* auth_token_file; /* or the file whose first line is it */
} depot_client_options_t;

/* Fills `options` with the defaults of depot::ClientOptions. */
DEPOT_API void depot_client_options_init(depot_client_options_t* options);

/* Connects to `num_servers` servers, "host:port" each, in shard-plan order
 * (every worker must pass the same order). Does not wait for them to be up;
 * see depot_client_wait_for_servers. `options` may be NULL (defaults).
 * On success *out is a client to free with depot_client_destroy.
 * INVALID_ARGUMENT: no servers, a malformed address, bad options (a
 * security combination depot::ClientOptions does not allow, a credential
 * file that cannot be read). */
DEPOT_API int depot_client_create(const char* const* servers,
                                  size_t num_servers,
                                  const depot_client_options_t* options,
                                  depot_client_t** out);

/* Waits until every server's health service reports SERVING.
 * UNAVAILABLE (naming the server) if one does not within the timeout. */
DEPOT_API int depot_client_wait_for_servers(depot_client_t* client,
                                            double timeout_seconds);

/* Frees the client. NULL is ignored. Jobs opened on it stay usable. */
DEPOT_API void depot_client_destroy(depot_client_t* client);

/* Opt-in, for the whole process (depot::ClientOptions::
 * retain_transport_buffers): sets glibc malloc's mmap and trim thresholds so
 * that gRPC's receive buffers are reused instead of faulted in again (about a
 * third less CPU per transfer). Idempotent; the thresholds stay set for the
 * life of the process. Returns 1 when they are set, 0 when the environment
 * sets malloc's thresholds itself (GLIBC_TUNABLES, MALLOC_*_THRESHOLD_: the
 * operator's choice wins) or malloc is not glibc's. */
DEPOT_API int depot_retain_transport_buffers(void);

/* -------------------------------------------------------------------- job */

typedef struct depot_tensor_spec {
  const char* name; /* unique, non-empty */
  uint64_t numel;   /* > 0 */
  uint32_t param_group;
} depot_tensor_spec_t;

/* depot::OptimizerConfig, field for field (Megatron-Core's names; the
 * meaning and validation of each is in depot/job_config.h). Booleans are 0 or
 * 1; dtypes are DEPOT_DTYPE_*, kinds DEPOT_OPTIMIZER_*. */
typedef struct depot_optimizer_config {
  int32_t kind;
  double lr;
  double min_lr;
  double weight_decay;
  double adam_beta1;
  double adam_beta2;
  double adam_eps;
  double sgd_momentum;
  double sgd_dampening;
  int32_t sgd_nesterov;
  double adagrad_lr_decay;
  double adagrad_initial_accumulator_value;
  double adagrad_eps;
  double lion_beta1;
  double lion_beta2;
  int32_t exp_avg_dtype;
  int32_t exp_avg_sq_dtype;
  double clip_grad;
  int32_t clip_grad_norm_type;
  double grad_norm_skip_threshold;
  double loss_scale;
  double initial_loss_scale;
  double min_loss_scale;
  double loss_scale_window;
  int32_t hysteresis;
  int32_t amsgrad;
  int32_t maximize;
} depot_optimizer_config_t;

/* depot::JobConfig. The strings and the tensor array are read during
 * depot_job_open only. num_servers is not here: it is the client's. */
typedef struct depot_job_config {
  const char* name;
  const depot_tensor_spec_t* tensors;
  size_t num_tensors;
  uint32_t num_workers;
  depot_optimizer_config_t optimizer;
  int32_t grad_dtype;
  int32_t weight_dtype;
  uint64_t chunk_elems;
  uint64_t alignment_elems;
  /* Per-param-group optimizer configs (depot::JobConfig::group_optimizers):
   * NULL and 0 for none, else one per param group 0..G-1. Read during
   * depot_job_open only. */
  const depot_optimizer_config_t* group_optimizers;
  size_t num_group_optimizers;
  /* Server-side checkpoints of the job every this many steps; 0: the
   * servers' --checkpoint_every_steps (depot::JobConfig). */
  uint64_t checkpoint_every_steps;
} depot_job_config_t;

/* Fills `config` with the defaults of depot::JobConfig (no name, no tensors,
 * one worker, AdamW, fp32 gradients and weights, 1 Mi-element chunks). */
DEPOT_API void depot_job_config_init(depot_job_config_t* config);

/* Creates the job on every server of `client`, or attaches to it when a job
 * with the same name and an identical config exists (of the client's tenant:
 * job names are per tenant), as worker `worker_rank`.
 * On success *out is a job handle to free with depot_job_destroy.
 * INVALID_ARGUMENT: an invalid config (the field is named) or worker_rank >=
 * num_workers; FAILED_PRECONDITION: a job of that name exists with a
 * different config; RESOURCE_EXHAUSTED: a server's memory budget. */
DEPOT_API int depot_job_open(depot_client_t* client,
                             const depot_job_config_t* config,
                             uint32_t worker_rank, depot_job_t** out);

/* The job's layout: N (the length of every flat buffer), its tensors and
 * where each starts. REQUIRES: tensor_index < depot_job_num_tensors(job). */
DEPOT_API uint64_t depot_job_total_elems(const depot_job_t* job);
DEPOT_API size_t depot_job_num_tensors(const depot_job_t* job);
DEPOT_API uint64_t depot_job_tensor_offset(const depot_job_t* job,
                                           size_t tensor_index);
DEPOT_API uint64_t depot_job_fingerprint(const depot_job_t* job);
DEPOT_API uint32_t depot_job_num_servers(const depot_job_t* job);

/* Sets the master weights of the whole job from N elements of `dtype` at
 * `weights` (bf16/fp16 are upcast). FAILED_PRECONDITION if a chunk has a step
 * applied, or a peer's step-1 gradient pending (client/README.md: InitOrJoin).
 */
DEPOT_API int depot_job_init_weights(depot_job_t* job, const void* weights,
                                     int32_t dtype);

/* Per-step hyperparameters of one param group (depot::GroupHyperParams). */
typedef struct depot_group_hparams {
  uint32_t param_group;
  double lr;
  double weight_decay;
} depot_group_hparams_t;

/* New master weights of one tensor (depot::TensorWeights): `values` holds
 * the tensor's numel fp32 values. */
typedef struct depot_tensor_weights {
  uint32_t tensor_index;
  const float* values;
} depot_tensor_weights_t;

/* depot::StepOptions. Every worker must pass the same values for a step,
 * except no_grad_tensors and weight_overrides. */
typedef struct depot_step_options {
  /* Overrides of lr and weight_decay, at most one per group; groups not
   * listed use the job's config. Read during the call only. */
  const depot_group_hparams_t* group_hparams;
  size_t num_group_hparams;
  /* The gradients arrive multiplied by this; 1 = none. Finite and > 0. */
  double loss_scale;
  /* 1: the trainer already knows the step's clip decision, given by
   * known_clip_coef (in (0, 1]) and known_skip (0 or 1); the step then runs
   * in one phase. 0: the library decides (depot/client.h, StepOptions). */
  int32_t has_known_commit;
  double known_clip_coef;
  int32_t known_skip;
  /* This worker's own (depot::StepOptions): the tensors it has no gradient
   * for (torch's `.grad is None`; skipped when no worker has one), and new
   * master weights for tensors changed outside the optimizer. NULL and 0 for
   * none; read during the call only. */
  const uint32_t* no_grad_tensors;
  size_t num_no_grad_tensors;
  const depot_tensor_weights_t* weight_overrides;
  size_t num_weight_overrides;
} depot_step_options_t;

/* Fills `options` with the defaults of depot::StepOptions (no overrides,
 * loss scale 1, no known commit). */
DEPOT_API void depot_step_options_init(depot_step_options_t* options);

/* depot::StepResult: the outcome of one step, summed over the servers. */
typedef struct depot_step_result {
  uint64_t step;
  uint64_t chunks;          /* weight chunks received */
  uint64_t chunks_replayed; /* of those, chunks the servers had applied */
  uint64_t bytes_sent;      /* gradient payload bytes */
  uint64_t bytes_received;  /* weight payload bytes */
  double update_seconds;    /* server CPU update time, summed */
  double wall_seconds;      /* the call's own duration */
  int32_t two_phase;        /* the servers measured the gradient first */
  double grad_norm;         /* two-phase steps only, else 0 */
  uint64_t zero_count;      /* two-phase steps only, else 0 */
  int32_t found_inf;        /* a NaN or Inf in the gradient: skipped */
  int32_t skipped;          /* the step changed no state */
  double clip_coef;         /* applied clip coefficient; 1 = none */
  /* An engine with an offload fraction: a send of its kept state into the
   * servers' checkpoint captures of step capture_step (0: none reported)
   * that ended since the last report (the send runs behind the steps, see
   * depot_engine_wait_captures): the chunks it sent, and why the rest
   * could not be (NUL-terminated, cut to fit; empty: none failed). */
  uint64_t capture_step;
  uint64_t capture_chunks;
  char capture_error[512];
} depot_step_result_t;

/* Runs training step `step` (1, 2, ...) for this worker: sends `grads` (N
 * elements of the job's grad_dtype) and writes the updated weights (N
 * elements of its weight_dtype) into `weights_out`. Calling it again for a
 * step the servers already applied returns the same weights and applies
 * nothing twice. `options` may be NULL (defaults); `result` may be NULL.
 * ABORTED: a step out of order; DEADLINE_EXCEEDED: a peer worker too slow;
 * INVALID_ARGUMENT: bad options. */
DEPOT_API int depot_job_step(depot_job_t* job, uint64_t step, const void* grads,
                             void* weights_out,
                             const depot_step_options_t* options,
                             depot_step_result_t* result);

/* Copies weights [begin, end) into `out` as `dtype` (DEPOT_DTYPE_FP32 gives
 * the master weights exactly), each server's part at the step it reports in
 * depot_job_status. OUT_OF_RANGE unless begin <= end <= N. */
DEPOT_API int depot_job_pull(depot_job_t* job, uint64_t begin, uint64_t end,
                             int32_t dtype, void* out);

/* depot_job_pull with every element at step `step` (0: as depot_job_pull),
 * on every server: a worker that rejoins a running job pulls at the oldest
 * step the servers report (depot::Job::Pull). FAILED_PRECONDITION: a server
 * is not yet at `step` or no longer holds it, or `dtype` is not the job's
 * weight dtype for a chunk past `step` (unless that is fp32). */
DEPOT_API int depot_job_pull_at(depot_job_t* job, uint64_t begin, uint64_t end,
                                int32_t dtype, uint64_t step, void* out);

/* One server's view of the job (depot::ServerJobStatus). */
typedef struct depot_server_status {
  /* The server's address; owned by the job, valid until the next
   * depot_job_status on it or depot_job_destroy. */
  const char* server;
  uint64_t job_id;
  uint64_t step; /* last step applied to every chunk of the shard */
  uint64_t shard_begin;
  uint64_t shard_end;
  uint64_t state_bytes;
  uint64_t state_checksum; /* 0 unless with_checksum */
  /* The oldest step still waiting for workers on this server (0: none), the
   * worker ranks that have not sent some chunk of it another worker has sent
   * (ascending; owned by the job like `server`), and the seconds it has
   * waited since its first contribution there. */
  uint64_t pending_step;
  const uint32_t* missing_workers;
  size_t num_missing_workers;
  double waiting_seconds;
} depot_server_status_t;

/* Writes each server's status, in server order, into out[0 ..
 * depot_job_num_servers(job)). with_checksum (0 or 1) makes every server hash
 * its whole state. REQUIRES: capacity >= depot_job_num_servers(job), else
 * INVALID_ARGUMENT. */
DEPOT_API int depot_job_status(depot_job_t* job, int32_t with_checksum,
                               depot_server_status_t* out, size_t capacity);

/* Deletes the job on every server, freeing its state; the handle stays to be
 * destroyed. */
DEPOT_API int depot_job_delete(depot_job_t* job);

/* The job's whole optimizer state (depot::Job::SaveState) as an opaque blob:
 * on success *data is a buffer of *size bytes that the caller frees with
 * depot_buffer_free. Call it between steps, with no step in flight. */
DEPOT_API int depot_job_save_state(depot_job_t* job, void** data, size_t* size);

/* Replaces the job's state by a blob from depot_job_save_state of a job with
 * the same config (the name may differ); the next step is the saved step + 1.
 * DATA_LOSS: corrupt or truncated blob. FAILED_PRECONDITION: a blob of another
 * config, or a step in flight. */
DEPOT_API int depot_job_load_state(depot_job_t* job, const void* data,
                                   size_t size);

/* The job's optimizer state as flat fp32 arrays over [0, N)
 * (depot::FlatState), for reading it or building it from another optimizer's
 * state (torch.optim's). The caller owns every array: master and each of the
 * first depot_job_num_state_slots(job) slots hold N floats, tensor_steps one
 * count per tensor; slots[k] beyond those are ignored. Slot k is, by kind:
 * Adam/AdamW exp_avg, exp_avg_sq, max_exp_avg_sq (amsgrad); SGD
 * momentum_buffer; Adagrad state_sum; Lion exp_avg. */
typedef struct depot_flat_state {
  uint64_t applied_step; /* the last step the servers applied */
  float* master;
  float* slots[3];
  uint64_t* tensor_steps; /* torch's state["step"] of each tensor */
} depot_flat_state_t;

/* The number of state slots the job keeps per element (0 to 3). */
DEPOT_API size_t depot_job_num_state_slots(const depot_job_t* job);

/* Decodes a blob from depot_job_save_state of a job with this config into
 * the caller's arrays of *out. DATA_LOSS: corrupt blob; FAILED_PRECONDITION:
 * a blob of another config. */
DEPOT_API int depot_job_decode_state(const depot_job_t* job, const void* data,
                                     size_t size, depot_flat_state_t* out);

/* Encodes `state` as a blob for depot_job_load_state (bf16 slots rounded to
 * nearest even, padding stored as 0); *data is freed with depot_buffer_free.
 * INVALID_ARGUMENT: a NULL array, or a tensor count above applied_step. */
DEPOT_API int depot_job_encode_state(const depot_job_t* job,
                                     const depot_flat_state_t* state,
                                     void** data, size_t* size);

/* depot::Job::Checkpoint: every server writes its shard to its
 * --checkpoint_dir now; *step (may be NULL) gets the step the checkpoint
 * holds. Call between steps. FAILED_PRECONDITION: no --checkpoint_dir, or a
 * step in flight; UNAVAILABLE: retry. */
DEPOT_API int depot_job_checkpoint(depot_job_t* job, uint64_t* step);

/* depot::Job::Reconcile: opens the job again on every server and, when they
 * are at different steps (a server restarted behind the others), rolls them
 * back to the newest step each can return to. *step (may be NULL) gets the
 * step every server is at now, *rolled_back (may be NULL) 1 when a rollback
 * was needed. DATA_LOSS: no such step (a server lost the job). */
DEPOT_API int depot_job_reconcile(depot_job_t* job, uint64_t* step,
                                  int* rolled_back);

/* depot::Job::RollBack: every server drops the contributions in flight and
 * returns to `step` (exactly at it, or from its checkpoint of it); later
 * checkpoints are removed. NOT_FOUND: a server has no checkpoint of it;
 * FAILED_PRECONDITION: a server has not completed it. */
DEPOT_API int depot_job_roll_back(depot_job_t* job, uint64_t step);

/* depot::Job::NewestCheckpointWithWorkerState: into *step, the newest step
 * at or before `at` that every server holds a complete checkpoint of with
 * the state of the tensors the workers keep in every chunk. NOT_FOUND when
 * there is none. */
DEPOT_API int depot_job_newest_checkpoint_with_worker_state(depot_job_t* job,
                                                            uint64_t at,
                                                            uint64_t* step);

/* depot::Job::ImportCheckpoint: replaces the job's state on every server by
 * the server-side checkpoint of `step` that servers of the same job, of any
 * count, wrote into the `num_dirs` directories `checkpoint_dirs` (their
 * --checkpoint_dir). Every server verifies its part before any imports:
 * NOT_FOUND (no such step), FAILED_PRECONDITION (incomplete: the missing
 * manifest is named; another config) and DATA_LOSS (a damaged or missing
 * file, named) leave every server as it was. */
DEPOT_API int depot_job_import_checkpoint(depot_job_t* job, uint64_t step,
                                          const char* const* checkpoint_dirs,
                                          size_t num_dirs);

/* Frees a buffer the library allocated. NULL is ignored. */
DEPOT_API void depot_buffer_free(void* data);

/* Frees the handle (the job stays on the servers). NULL is ignored. */
DEPOT_API void depot_job_destroy(depot_job_t* job);

/* ----------------------------------------------------------------- engine */

/* A GPU worker's transfer engine (docs/gpu.md): one local rank of a node.
 * It owns two flat device buffers over the job's index space (padded to
 * whole buckets): the gradients, which backward writes (tensor i at
 * depot_job_tensor_offset(job, i)), and the weights, which forward reads.
 * Buckets of whole chunks move as soon as backward has finished them:
 *
 *   depot_engine_begin_step(e, step, options);
 *   ... backward; when bucket b's gradients are complete on `stream`:
 *   depot_engine_gradients_ready(e, b, stream);
 *   depot_engine_finish_step(e, &result);
 *   ... next forward, before bucket b's weights are read:
 *   depot_engine_wait_weights(e, b, stream);
 *
 * `stream` is a cudaStream_t (as void*; torch.cuda.current_stream()
 * .cuda_stream, where 0 is the default stream) for a CUDA engine; the calling
 * thread's queued work on it is what "complete" means, and the stream never
 * waits for the engine. A host engine (DEPOT_DEVICE_HOST: device memory is
 * host memory; for tests and CPU trainers) ignores `stream`: the calling
 * thread is its stream, so gradients are complete when the call is made and
 * depot_engine_wait_weights blocks until the bucket's weights are in place.
 * One thread drives an engine; the job must not be stepped otherwise while
 * the engine exists. */
typedef struct depot_engine depot_engine_t;

enum {
  DEPOT_DEVICE_HOST = 0,
  DEPOT_DEVICE_CUDA = 1,
};

typedef struct depot_engine_options {
  int32_t device;      /* DEPOT_DEVICE_HOST or DEPOT_DEVICE_CUDA */
  int32_t cuda_device; /* the CUDA device ordinal */
  /* This process's place in its node: the job's worker is the node. */
  uint32_t local_rank;
  uint32_t local_ranks;
  /* local_ranks > 1: the node's id from depot_engine_unique_id on one rank,
   * passed to every rank (NCCL's unique id on CUDA; on the host, the ranks
   * are threads of one process that name the same id). */
  uint8_t unique_id[128];
  uint64_t bucket_chunks; /* multiple of local_ranks; 0: 4 chunks per rank */
  int32_t d2h_slots;      /* pinned slots per ring, >= 1 */
  int32_t h2d_slots;
  int32_t streams_per_server;
  int32_t delayed_update; /* 1: ZeRO-Offload's DPU (docs/gpu.md) */
  /* Share of the parameters whose optimizer runs on the servers, in [0, 1];
   * the rest stays on this device (docs/gpu.md, "Offload fraction"). */
  double offload_fraction;
  /* Host engine only: > 0 throttles host<->device copies to this many bytes
   * per second, as a PCIe link (tests). */
  double host_copy_bytes_per_second;
  /* local_ranks > 1: how long one of the node's collectives may wait for
   * the other local ranks once this rank reached it (default 600). Past
   * it, or when another rank's collectives failed, this rank's are aborted:
   * steps in flight fail (DEADLINE_EXCEEDED; FAILED_PRECONDITION for
   * another rank's failure), and every later begin_step and check_node
   * fails: every rank's engine must be made anew. 0: no limit (a dead rank
   * leaves the others waiting for ever, as plain NCCL does). Keep it above
   * the client's step timeout (docs/gpu.md, "A rank that dies"). */
  double collective_timeout_seconds;
} depot_engine_options_t;

/* Fills `options` with the defaults: a host engine, one local rank, the
 * engine's default buckets and slots, no delayed update, fraction 1. */
DEPOT_API void depot_engine_options_init(depot_engine_options_t* options);

/* Writes a new node id into `id` (128 bytes) for `device`. UNAVAILABLE
 * when a CUDA id is asked for and the CUDA backend (libdepot_cuda.so) or
 * NCCL cannot be loaded. */
DEPOT_API int depot_engine_unique_id(int32_t device, uint8_t* id);

/* Creates the engine of `job` (which must outlive it). On success *out is an
 * engine to free with depot_engine_destroy. INVALID_ARGUMENT: options that
 * do not fit; UNAVAILABLE: no CUDA backend or device, saying why;
 * RESOURCE_EXHAUSTED: device or pinned memory. */
DEPOT_API int depot_engine_create(depot_job_t* job,
                                  const depot_engine_options_t* options,
                                  depot_engine_t** out);

/* The flat buffers (device pointers; host pointers for a host engine):
 * depot_engine_padded_elems elements each, of the job's grad dtype and weight
 * dtype. With the delayed update the gradient buffer alternates between two
 * from step to step: read it again after each begin_step. */
DEPOT_API void* depot_engine_grads(const depot_engine_t* engine);
/* The gradient buffer step `step`'s backward writes (the same for every step
 * without the delayed update), so that views can be pointed before
 * depot_engine_begin_step. */
DEPOT_API void* depot_engine_grads_of_step(const depot_engine_t* engine,
                                           uint64_t step);
DEPOT_API void* depot_engine_weights(const depot_engine_t* engine);
DEPOT_API uint64_t depot_engine_padded_elems(const depot_engine_t* engine);
DEPOT_API uint64_t depot_engine_num_buckets(const depot_engine_t* engine);
/* Bucket `bucket`'s elements [*begin, *end) of the job's index space (the
 * last bucket ends at the job's element count). OUT_OF_RANGE: no such
 * bucket. */
DEPOT_API int depot_engine_bucket_range(const depot_engine_t* engine,
                                        uint64_t bucket, uint64_t* begin,
                                        uint64_t* end);
/* The pinned host memory the engine holds, in bytes (slots x chunk bytes). */
DEPOT_API uint64_t depot_engine_pinned_bytes(const depot_engine_t* engine);
/* The tensors whose optimizer runs on this device (offload fraction < 1):
 * writes up to `capacity` layout indices into `out` and returns how many
 * there are. */
DEPOT_API size_t depot_engine_device_tensors(const depot_engine_t* engine,
                                             uint32_t* out, size_t capacity);

/* The optimizer state of the tensors kept on the node's devices (offload
 * fraction < 1), which the servers' state (depot_job_save_state) does not
 * hold: writes the kept elements' master weights and slots and the kept
 * tensors' step counts over `state`'s arrays (a whole job's, as
 * depot_job_decode_state fills them), leaving every other value as it is;
 * the result is the whole job's state. With several local ranks it is a
 * collective of the node (each rank holds its own chunks' part, all-gathered
 * here): every local rank calls it between the same two steps, or those that
 * did wait. FAILED_PRECONDITION: a step in flight, or an engine made on a job
 * that had applied steps whose kept state has not been loaded yet (the
 * servers never held it); INVALID_ARGUMENT: a NULL array the job needs. */
DEPOT_API int depot_engine_read_device_state(depot_engine_t* engine,
                                             depot_flat_state_t* state);
/* The reverse: loads those values from `state` onto the device (bf16 slots
 * rounded to nearest even), e.g. after depot_job_load_state of the same
 * state; each local rank loads its own chunks' part (not a collective: every
 * rank loads the same state). An engine whose step failed, or one made on a
 * job that had applied steps, may step again. The weights buffer is left as
 * it is. Same errors (but for the missing state). */
DEPOT_API int depot_engine_write_device_state(depot_engine_t* engine,
                                              const depot_flat_state_t* state);

/* TransferEngine::BeginStep: starts step `step` (options as depot_job_step;
 * weight overrides are refused). FAILED_PRECONDITION: a step in flight
 * (two with the delayed update), or, with several local ranks, the node's
 * collectives out of step (see depot_engine_check_node); ABORTED: with several
 * local ranks, an earlier step failed on another rank (the node's verdict). */
DEPOT_API int depot_engine_begin_step(depot_engine_t* engine, uint64_t step,
                                      const depot_step_options_t* options);
/* Bucket `bucket`'s gradients are complete once `stream`'s queued work has
 * run. Returns at once. INVALID_ARGUMENT: no such bucket, or named twice in
 * the step; FAILED_PRECONDITION: no step in flight; the step's error once it
 * failed (with one local rank: a node's ranks name every bucket of a failed
 * step too, so that every collective runs, and depot_engine_finish_step
 * reports the error). */
DEPOT_API int depot_engine_gradients_ready(depot_engine_t* engine,
                                           uint64_t bucket, void* stream);
/* `stream`'s later work waits until bucket `bucket`'s updated weights are in
 * the weights buffer (a host engine: returns once they are). */
DEPOT_API int depot_engine_wait_weights(depot_engine_t* engine,
                                        uint64_t bucket, void* stream);
/* Finishes the oldest step in flight: its result, or its first error (every
 * step in flight is then aborted and a step may begin again). `result` may
 * be NULL. With several local ranks, DEADLINE_EXCEEDED: one of the node's
 * collectives waited past collective_timeout_seconds for the other ranks;
 * FAILED_PRECONDITION: the node's collectives were aborted on another rank
 * (no later step may begin: make every rank's engine anew). */
DEPOT_API int depot_engine_finish_step(depot_engine_t* engine,
                                       depot_step_result_t* result);

/* The outcome of a send of the kept state into the servers' checkpoint
 * captures of a step (as depot_step_result_t's capture_* fields). */
typedef struct depot_capture_report {
  uint64_t step; /* the captured step; 0: nothing to report */
  uint64_t chunks;
  char error[512];
} depot_capture_report_t;

/* TransferEngine::WaitCaptures: with an offload fraction, the kept state of
 * a step the servers capture for a checkpoint is sent into the captures in
 * the background, started by depot_engine_finish_step (which waits only for
 * the send before, one at a time, and reports a send that has ended). This
 * waits for a send still under way and returns the outcome not yet
 * reported in `report` (step 0: none). depot_engine_store_device_state,
 * and depot_engine_finish_step of a failed step, wait for it too; a trainer
 * that checkpoints, rolls back or loads the job by itself between steps
 * calls this first. */
DEPOT_API int depot_engine_wait_captures(depot_engine_t* engine,
                                         depot_capture_report_t* report);

/* TransferEngine::CheckNode: with several local ranks, the node's verdict on
 * every step depot_engine_finish_step returned without an error on this rank
 * and not yet checked (each is read once): DEPOT_ABORTED naming the first
 * that failed on another local rank (this rank's weights are then not the
 * servers': recover as from a failed step, on every rank), DEPOT_OK
 * otherwise. Waits for the device to reach the verdict. Every step's
 * collectives run on every rank whatever its outcome; depot_engine_begin_step
 * checks too. Call it after the last step, before the weights are used. One
 * local rank: DEPOT_OK. Once the node's collectives were aborted
 * (collective_timeout_seconds), their error, every time. */
DEPOT_API int depot_engine_check_node(depot_engine_t* engine);

/* TransferEngine::SynchronizeNode: with several local ranks, returns once
 * every rank's engine has called it (an all-reduce on the node's collective).
 * After a failed step every rank reconciles the job (depot_job_reconcile);
 * call this between that and the next step, so that no rank's next step
 * reaches the servers while another rank's reconcile may still roll them
 * back. FAILED_PRECONDITION: a step in flight, or the node's collectives out
 * of step or aborted; DEADLINE_EXCEEDED: another rank did not come within
 * collective_timeout_seconds. One local rank: DEPOT_OK at once. */
DEPOT_API int depot_engine_synchronize_node(depot_engine_t* engine);

/* TransferEngine::AgreeOnStep: the same collective, which also writes into
 * *agreed the least `step` any local rank passed. One local rank: `step`. */
DEPOT_API int depot_engine_agree_on_step(depot_engine_t* engine, uint64_t step,
                                         uint64_t* agreed);

/* TransferEngine::StoreGpuState / RestoreGpuState (docs/gpu.md, "Offload
 * fraction"): the kept tensors' state of this rank written into the servers'
 * own arrays at the servers' step, so that a checkpoint the servers take next
 * (depot_job_checkpoint) holds the whole state; and read back from them onto
 * the device, after the servers went back to such a checkpoint (or are still
 * at the step it was stored at). With several local ranks each rank stores
 * and restores its own part, and the store is a collective of the node: it
 * returns once every rank has stored, DEPOT_OK only if all did (ABORTED:
 * another rank failed), after which one rank takes the checkpoint.
 * FAILED_PRECONDITION: a step in flight; store only: the state missing or
 * lost (a failed step), the servers at another step, or the node's verdict
 * failed. */
DEPOT_API int depot_engine_store_device_state(depot_engine_t* engine);
DEPOT_API int depot_engine_restore_device_state(depot_engine_t* engine);

/* Aborts a step in flight and frees the engine. NULL is ignored. */
DEPOT_API void depot_engine_destroy(depot_engine_t* engine);

/* ------------------------------------------------------------ grad scaler */

/* A loss scaler with Megatron's semantics (depot/grad_scaler.h): multiply
 * the loss by depot_grad_scaler_scale() before backward, pass that scale as
 * depot_step_options_t.loss_scale, and feed the step's found_inf back with
 * depot_grad_scaler_update(). Pure local state: no server is contacted. */
typedef struct depot_grad_scaler depot_grad_scaler_t;

/* The scaler Megatron builds for the job's config (depot::MakeGradScaler):
 * constant at optimizer.loss_scale when it is > 0; dynamic (from
 * initial_loss_scale, min_loss_scale, loss_scale_window, hysteresis) when it
 * is 0 and grad_dtype is fp16; otherwise a constant 1. On success *out is a
 * scaler to free with depot_grad_scaler_destroy. INVALID_ARGUMENT naming the
 * config field when those fields are invalid. */
DEPOT_API int depot_grad_scaler_create(const depot_job_t* job,
                                       depot_grad_scaler_t** out);

/* The current loss scale (> 0); 0 for NULL. */
DEPOT_API double depot_grad_scaler_scale(const depot_grad_scaler_t* scaler);

/* Feeds back the outcome of a step: found_inf (0 or 1) is the step's
 * depot_step_result_t.found_inf. NULL is ignored. */
DEPOT_API void depot_grad_scaler_update(depot_grad_scaler_t* scaler,
                                        int32_t found_inf);

/* Megatron's DynamicGradScaler.state_dict() (depot::GradScalerState), for
 * checkpoints. A constant scaler reports its scale with zero trackers. */
typedef struct depot_grad_scaler_state {
  double scale;
  int64_t growth_tracker;
  int64_t hysteresis_tracker;
} depot_grad_scaler_state_t;

/* Writes the scaler's state into *out. INVALID_ARGUMENT for NULL. */
DEPOT_API int depot_grad_scaler_get_state(const depot_grad_scaler_t* scaler,
                                          depot_grad_scaler_state_t* out);

/* Restores a state from depot_grad_scaler_get_state (a constant scaler
 * ignores it). INVALID_ARGUMENT naming the field when it does not fit the
 * scaler's options (depot::DynamicGradScaler::LoadStateDict); on error
 * nothing changes. */
DEPOT_API int depot_grad_scaler_load_state(
    depot_grad_scaler_t* scaler, const depot_grad_scaler_state_t* state);

/* Frees the scaler. NULL is ignored. */
DEPOT_API void depot_grad_scaler_destroy(depot_grad_scaler_t* scaler);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DEPOT_DEPOT_H_ */
