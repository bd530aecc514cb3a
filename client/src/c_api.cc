// The C API (depot/depot.h) over the C++ client (depot/client.h).
//
// Every entry point that can fail runs its body through Guarded(), which turns
// the absl::Status into the returned code and the thread's last error, and
// catches every C++ exception: none may unwind into a C (or ctypes) caller.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "c_api_convert.h"
#include "c_api_internal.h"
#include "depot/client.h"
#include "depot/depot.h"
#include "depot/grad_scaler.h"
#include "wire/transport_memory.h"

namespace depot {
using c_api::Guarded;
}  // namespace depot

extern "C" {

uint32_t depot_api_version(void) { return DEPOT_API_VERSION; }

const char* depot_last_error(void) { return depot::c_api::LastError(); }

int depot_last_error_rolled_back(uint64_t* step) {
  return depot::c_api::LastRolledBack(step) ? 1 : 0;
}

const char* depot_status_name(int code) {
  // Indexed by code: absl::StatusCode's names.
  static constexpr const char* kNames[] = {"OK",
                                           "CANCELLED",
                                           "UNKNOWN",
                                           "INVALID_ARGUMENT",
                                           "DEADLINE_EXCEEDED",
                                           "NOT_FOUND",
                                           "ALREADY_EXISTS",
                                           "PERMISSION_DENIED",
                                           "RESOURCE_EXHAUSTED",
                                           "FAILED_PRECONDITION",
                                           "ABORTED",
                                           "OUT_OF_RANGE",
                                           "UNIMPLEMENTED",
                                           "INTERNAL",
                                           "UNAVAILABLE",
                                           "DATA_LOSS",
                                           "UNAUTHENTICATED"};
  if (code < 0 || code >= static_cast<int>(std::size(kNames))) {
    return "UNKNOWN_CODE";
  }
  return kNames[code];
}

void depot_client_options_init(depot_client_options_t* options) {
  if (options == nullptr) return;
  const depot::ClientOptions defaults;
  options->rpc_timeout_seconds = absl::ToDoubleSeconds(defaults.rpc_timeout);
  options->step_timeout_seconds = absl::ToDoubleSeconds(defaults.step_timeout);
  options->max_inflight_chunks = defaults.max_inflight_chunks;
  options->unavailable_retry_seconds =
      absl::ToDoubleSeconds(defaults.unavailable_retry);
  options->connections_per_server = defaults.connections_per_server;
  options->tls_ca_file = nullptr;
  options->tls_cert_file = nullptr;
  options->tls_key_file = nullptr;
  options->auth_token = nullptr;
  options->auth_token_file = nullptr;
}

int depot_client_create(const char* const* servers, size_t num_servers,
                        const depot_client_options_t* options,
                        depot_client_t** out) {
  constexpr const char* kFunction = "depot_client_create";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (out == nullptr) return depot::c_api::NullArgument(kFunction, "out");
    *out = nullptr;
    if (servers == nullptr && num_servers > 0) {
      return depot::c_api::NullArgument(kFunction, "servers");
    }
    depot_client_options_t c_options;
    depot_client_options_init(&c_options);
    if (options != nullptr) c_options = *options;
    absl::StatusOr<depot::ClientOptions> converted =
        depot::c_api::FromC(servers, num_servers, c_options);
    if (!converted.ok()) return converted.status();
    absl::StatusOr<std::unique_ptr<depot::Client>> client =
        depot::Client::Connect(*std::move(converted));
    if (!client.ok()) return client.status();
    *out = new depot_client{*std::move(client)};
    return absl::OkStatus();
  });
}

int depot_client_wait_for_servers(depot_client_t* client,
                                  double timeout_seconds) {
  constexpr const char* kFunction = "depot_client_wait_for_servers";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (client == nullptr)
      return depot::c_api::NullArgument(kFunction, "client");
    if (!(std::isfinite(timeout_seconds) && timeout_seconds >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(kFunction, ": timeout_seconds is ", timeout_seconds,
                       ", must be finite and >= 0"));
    }
    return client->client->WaitForServers(absl::Seconds(timeout_seconds));
  });
}

void depot_client_destroy(depot_client_t* client) { delete client; }

int depot_retain_transport_buffers(void) {
  return depot::RetainTransportBuffers() ? 1 : 0;
}

void depot_job_config_init(depot_job_config_t* config) {
  if (config == nullptr) return;
  const depot::JobConfig defaults;
  config->name = nullptr;
  config->tensors = nullptr;
  config->num_tensors = 0;
  config->num_workers = defaults.num_workers;
  config->optimizer = depot::c_api::ToC(defaults.optimizer);
  config->grad_dtype = static_cast<int32_t>(defaults.grad_dtype);
  config->weight_dtype = static_cast<int32_t>(defaults.weight_dtype);
  config->chunk_elems = defaults.chunk_elems;
  config->alignment_elems = defaults.alignment_elems;
  config->group_optimizers = nullptr;
  config->num_group_optimizers = 0;
  config->checkpoint_every_steps = defaults.checkpoint_every_steps;
}

int depot_job_open(depot_client_t* client, const depot_job_config_t* config,
                   uint32_t worker_rank, depot_job_t** out) {
  constexpr const char* kFunction = "depot_job_open";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (out == nullptr) return depot::c_api::NullArgument(kFunction, "out");
    *out = nullptr;
    if (client == nullptr)
      return depot::c_api::NullArgument(kFunction, "client");
    if (config == nullptr)
      return depot::c_api::NullArgument(kFunction, "config");
    absl::StatusOr<depot::JobConfig> converted = depot::c_api::FromC(*config);
    if (!converted.ok()) return converted.status();
    absl::StatusOr<std::unique_ptr<depot::Job>> job =
        client->client->OpenJob(*std::move(converted), worker_rank);
    if (!job.ok()) return job.status();
    *out = new depot_job{*std::move(job), {}, {}};
    return absl::OkStatus();
  });
}

uint64_t depot_job_total_elems(const depot_job_t* job) {
  return job == nullptr ? 0 : job->job->total_elems();
}

size_t depot_job_num_tensors(const depot_job_t* job) {
  return job == nullptr ? 0 : job->job->layout().tensors().size();
}

uint64_t depot_job_tensor_offset(const depot_job_t* job, size_t tensor_index) {
  if (job == nullptr || tensor_index >= depot_job_num_tensors(job)) {
    return UINT64_MAX;  // a REQUIRES violation; UINT64_MAX is never an offset
  }
  return job->job->layout().offset(tensor_index);
}

uint64_t depot_job_fingerprint(const depot_job_t* job) {
  return job == nullptr ? 0 : job->job->fingerprint();
}

uint32_t depot_job_num_servers(const depot_job_t* job) {
  return job == nullptr ? 0 : job->job->plan().num_servers();
}

int depot_job_init_weights(depot_job_t* job, const void* weights,
                           int32_t dtype) {
  constexpr const char* kFunction = "depot_job_init_weights";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (job == nullptr) return depot::c_api::NullArgument(kFunction, "job");
    if (weights == nullptr)
      return depot::c_api::NullArgument(kFunction, "weights");
    absl::StatusOr<depot::DType> converted =
        depot::c_api::DTypeField(dtype, "dtype");
    if (!converted.ok()) return converted.status();
    return job->job->InitWeights(weights, *converted);
  });
}

void depot_step_options_init(depot_step_options_t* options) {
  if (options == nullptr) return;
  const depot::StepOptions defaults;
  options->group_hparams = nullptr;
  options->num_group_hparams = 0;
  options->loss_scale = defaults.loss_scale;
  options->has_known_commit = 0;
  const depot::StepCommit commit_defaults;
  options->known_clip_coef = commit_defaults.clip_coef;
  options->known_skip = commit_defaults.skip ? 1 : 0;
  options->no_grad_tensors = nullptr;
  options->num_no_grad_tensors = 0;
  options->weight_overrides = nullptr;
  options->num_weight_overrides = 0;
}

int depot_job_step(depot_job_t* job, uint64_t step, const void* grads,
                   void* weights_out, const depot_step_options_t* options,
                   depot_step_result_t* result) {
  constexpr const char* kFunction = "depot_job_step";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (job == nullptr) return depot::c_api::NullArgument(kFunction, "job");
    if (grads == nullptr) return depot::c_api::NullArgument(kFunction, "grads");
    if (weights_out == nullptr) {
      return depot::c_api::NullArgument(kFunction, "weights_out");
    }
    depot_step_options_t c_options;
    depot_step_options_init(&c_options);
    if (options != nullptr) c_options = *options;
    absl::StatusOr<depot::StepOptions> converted =
        depot::c_api::FromC(c_options);
    if (!converted.ok()) return converted.status();
    depot::StepResult step_result;
    absl::Status stepped =
        job->job->Step(step, grads, weights_out, &step_result, *converted);
    if (stepped.ok() && result != nullptr)
      depot::c_api::ToC(step_result, result);
    return stepped;
  });
}

int depot_job_reconcile(depot_job_t* job, uint64_t* step, int* rolled_back) {
  constexpr const char* kFunction = "depot_job_reconcile";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (job == nullptr) return depot::c_api::NullArgument(kFunction, "job");
    absl::StatusOr<depot::Reconciled> reconciled = job->job->Reconcile();
    if (!reconciled.ok()) return reconciled.status();
    if (step != nullptr) *step = reconciled->step;
    if (rolled_back != nullptr) *rolled_back = reconciled->rolled_back ? 1 : 0;
    return absl::OkStatus();
  });
}

int depot_job_roll_back(depot_job_t* job, uint64_t step) {
  constexpr const char* kFunction = "depot_job_roll_back";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (job == nullptr) return depot::c_api::NullArgument(kFunction, "job");
    return job->job->RollBack(step);
  });
}

int depot_job_newest_checkpoint_with_worker_state(depot_job_t* job, uint64_t at,
                                                  uint64_t* step) {
  constexpr const char* kFunction =
      "depot_job_newest_checkpoint_with_worker_state";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (job == nullptr) return depot::c_api::NullArgument(kFunction, "job");
    if (step == nullptr) return depot::c_api::NullArgument(kFunction, "step");
    absl::StatusOr<uint64_t> found =
        job->job->NewestCheckpointWithWorkerState(at);
    if (!found.ok()) return found.status();
    *step = *found;
    return absl::OkStatus();
  });
}

int depot_job_import_checkpoint(depot_job_t* job, uint64_t step,
                                const char* const* checkpoint_dirs,
                                size_t num_dirs) {
  constexpr const char* kFunction = "depot_job_import_checkpoint";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (job == nullptr) return depot::c_api::NullArgument(kFunction, "job");
    if (checkpoint_dirs == nullptr && num_dirs > 0) {
      return depot::c_api::NullArgument(kFunction, "checkpoint_dirs");
    }
    std::vector<std::string> dirs;
    for (size_t i = 0; i < num_dirs; ++i) {
      if (checkpoint_dirs[i] == nullptr) {
        return depot::c_api::NullArgument(kFunction, "checkpoint_dirs[i]");
      }
      dirs.emplace_back(checkpoint_dirs[i]);
    }
    return job->job->ImportCheckpoint(step, dirs);
  });
}

int depot_job_checkpoint(depot_job_t* job, uint64_t* step) {
  constexpr const char* kFunction = "depot_job_checkpoint";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (job == nullptr) return depot::c_api::NullArgument(kFunction, "job");
    absl::StatusOr<uint64_t> taken = job->job->Checkpoint();
    if (!taken.ok()) return taken.status();
    if (step != nullptr) *step = *taken;
    return absl::OkStatus();
  });
}

namespace {

// depot_job_pull and depot_job_pull_at, named `function` in errors.
int PullAt(const char* function, depot_job_t* job, uint64_t begin, uint64_t end,
           int32_t dtype, uint64_t step, void* out) {
  return depot::Guarded(function, [&]() -> absl::Status {
    if (job == nullptr) return depot::c_api::NullArgument(function, "job");
    if (out == nullptr && end > begin) {
      return depot::c_api::NullArgument(function, "out");
    }
    absl::StatusOr<depot::DType> converted =
        depot::c_api::DTypeField(dtype, "dtype");
    if (!converted.ok()) return converted.status();
    return job->job->Pull(begin, end, *converted, out, step);
  });
}

}  // namespace

int depot_job_pull(depot_job_t* job, uint64_t begin, uint64_t end,
                   int32_t dtype, void* out) {
  return PullAt("depot_job_pull", job, begin, end, dtype, 0, out);
}

int depot_job_pull_at(depot_job_t* job, uint64_t begin, uint64_t end,
                      int32_t dtype, uint64_t step, void* out) {
  return PullAt("depot_job_pull_at", job, begin, end, dtype, step, out);
}

int depot_job_status(depot_job_t* job, int32_t with_checksum,
                     depot_server_status_t* out, size_t capacity) {
  constexpr const char* kFunction = "depot_job_status";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (job == nullptr) return depot::c_api::NullArgument(kFunction, "job");
    if (out == nullptr) return depot::c_api::NullArgument(kFunction, "out");
    const uint32_t num_servers = depot_job_num_servers(job);
    if (capacity < num_servers) {
      return absl::InvalidArgumentError(
          absl::StrCat(kFunction, ": capacity ", capacity, " is below the ",
                       num_servers, " servers of the job"));
    }
    absl::StatusOr<std::vector<depot::ServerJobStatus>> statuses =
        job->job->Status(with_checksum != 0);
    if (!statuses.ok()) return statuses.status();
    job->status_servers.clear();
    job->status_missing_workers.clear();
    for (const depot::ServerJobStatus& status : *statuses) {
      job->status_servers.push_back(status.server);
      job->status_missing_workers.push_back(status.missing_workers);
    }
    for (size_t s = 0; s < statuses->size(); ++s) {
      const depot::ServerJobStatus& status = (*statuses)[s];
      out[s] = depot_server_status_t{
          .server = job->status_servers[s].c_str(),
          .job_id = status.job_id,
          .step = status.step,
          .shard_begin = status.shard_begin,
          .shard_end = status.shard_end,
          .state_bytes = status.state_bytes,
          .state_checksum = status.state_checksum,
          .pending_step = status.pending_step,
          .missing_workers = job->status_missing_workers[s].data(),
          .num_missing_workers = job->status_missing_workers[s].size(),
          .waiting_seconds = status.waiting_seconds,
      };
    }
    return absl::OkStatus();
  });
}

int depot_job_delete(depot_job_t* job) {
  constexpr const char* kFunction = "depot_job_delete";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (job == nullptr) return depot::c_api::NullArgument(kFunction, "job");
    return job->job->Delete();
  });
}

namespace {

// Hands `blob` to the caller as a malloc'ed buffer (freed with
// depot_buffer_free).
absl::Status GiveBlob(const char* function, const std::string& blob,
                      void** data, size_t* size) {
  // malloc(0) may return NULL; a blob is never empty (it has a header).
  void* buffer = std::malloc(blob.size());
  if (buffer == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat(function, ": cannot allocate ", blob.size(), " bytes"));
  }
  std::memcpy(buffer, blob.data(), blob.size());
  *data = buffer;
  *size = blob.size();
  return absl::OkStatus();
}

}  // namespace

int depot_job_save_state(depot_job_t* job, void** data, size_t* size) {
  constexpr const char* kFunction = "depot_job_save_state";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (job == nullptr) return depot::c_api::NullArgument(kFunction, "job");
    if (data == nullptr) return depot::c_api::NullArgument(kFunction, "data");
    if (size == nullptr) return depot::c_api::NullArgument(kFunction, "size");
    absl::StatusOr<std::string> blob = job->job->SaveState();
    if (!blob.ok()) return blob.status();
    return GiveBlob(kFunction, *blob, data, size);
  });
}

size_t depot_job_num_state_slots(const depot_job_t* job) {
  if (job == nullptr) return 0;
  return static_cast<size_t>(depot::JobStateSlots(job->job->config()));
}

int depot_job_decode_state(const depot_job_t* job, const void* data,
                           size_t size, depot_flat_state_t* out) {
  constexpr const char* kFunction = "depot_job_decode_state";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (job == nullptr) return depot::c_api::NullArgument(kFunction, "job");
    if (out == nullptr) return depot::c_api::NullArgument(kFunction, "out");
    if (data == nullptr && size > 0) {
      return depot::c_api::NullArgument(kFunction, "data");
    }
    const size_t slots = depot_job_num_state_slots(job);
    if (out->master == nullptr || out->tensor_steps == nullptr) {
      return depot::c_api::NullArgument(kFunction,
                                        "out->master or out->tensor_steps");
    }
    for (size_t k = 0; k < slots; ++k) {
      if (out->slots[k] == nullptr) {
        return depot::c_api::NullArgument(kFunction, "an out->slots entry");
      }
    }
    absl::StatusOr<depot::FlatState> state = job->job->DecodeState(
        std::string(static_cast<const char*>(data), data == nullptr ? 0 : size));
    if (!state.ok()) return state.status();
    out->applied_step = state->applied_step;
    std::copy(state->master.begin(), state->master.end(), out->master);
    for (size_t k = 0; k < slots; ++k) {
      std::copy(state->slots[k].begin(), state->slots[k].end(), out->slots[k]);
    }
    std::copy(state->tensor_steps.begin(), state->tensor_steps.end(),
              out->tensor_steps);
    return absl::OkStatus();
  });
}

int depot_job_encode_state(const depot_job_t* job,
                           const depot_flat_state_t* state, void** data,
                           size_t* size) {
  constexpr const char* kFunction = "depot_job_encode_state";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (job == nullptr) return depot::c_api::NullArgument(kFunction, "job");
    if (state == nullptr) return depot::c_api::NullArgument(kFunction, "state");
    if (data == nullptr) return depot::c_api::NullArgument(kFunction, "data");
    if (size == nullptr) return depot::c_api::NullArgument(kFunction, "size");
    const uint64_t n = job->job->total_elems();
    const size_t slots = depot_job_num_state_slots(job);
    if (state->master == nullptr || state->tensor_steps == nullptr) {
      return depot::c_api::NullArgument(kFunction,
                                        "state->master or state->tensor_steps");
    }
    depot::FlatState flat;
    flat.applied_step = state->applied_step;
    flat.master.assign(state->master, state->master + n);
    for (size_t k = 0; k < slots; ++k) {
      if (state->slots[k] == nullptr) {
        return depot::c_api::NullArgument(kFunction, "a state->slots entry");
      }
      flat.slots.emplace_back(state->slots[k], state->slots[k] + n);
    }
    flat.tensor_steps.assign(
        state->tensor_steps,
        state->tensor_steps + job->job->layout().tensors().size());
    absl::StatusOr<std::string> blob = job->job->EncodeState(flat);
    if (!blob.ok()) return blob.status();
    return GiveBlob(kFunction, *blob, data, size);
  });
}

int depot_job_load_state(depot_job_t* job, const void* data, size_t size) {
  constexpr const char* kFunction = "depot_job_load_state";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (job == nullptr) return depot::c_api::NullArgument(kFunction, "job");
    if (data == nullptr && size > 0) {
      return depot::c_api::NullArgument(kFunction, "data");
    }
    const size_t bytes = data == nullptr ? 0 : size;
    return job->job->LoadState(
        std::string(static_cast<const char*>(data), bytes));
  });
}

void depot_buffer_free(void* data) { std::free(data); }

void depot_job_destroy(depot_job_t* job) { delete job; }

int depot_grad_scaler_create(const depot_job_t* job,
                             depot_grad_scaler_t** out) {
  constexpr const char* kFunction = "depot_grad_scaler_create";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (out == nullptr) return depot::c_api::NullArgument(kFunction, "out");
    *out = nullptr;
    if (job == nullptr) return depot::c_api::NullArgument(kFunction, "job");
    absl::StatusOr<std::unique_ptr<depot::GradScaler>> scaler =
        depot::MakeGradScaler(job->job->config());
    if (!scaler.ok()) return scaler.status();
    *out = new depot_grad_scaler{*std::move(scaler)};
    return absl::OkStatus();
  });
}

double depot_grad_scaler_scale(const depot_grad_scaler_t* scaler) {
  return scaler == nullptr ? 0.0 : scaler->scaler->scale();
}

void depot_grad_scaler_update(depot_grad_scaler_t* scaler, int32_t found_inf) {
  if (scaler != nullptr) scaler->scaler->Update(found_inf != 0);
}

int depot_grad_scaler_get_state(const depot_grad_scaler_t* scaler,
                                depot_grad_scaler_state_t* out) {
  constexpr const char* kFunction = "depot_grad_scaler_get_state";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (scaler == nullptr)
      return depot::c_api::NullArgument(kFunction, "scaler");
    if (out == nullptr) return depot::c_api::NullArgument(kFunction, "out");
    const depot::GradScalerState state = scaler->scaler->StateDict();
    out->scale = state.scale;
    out->growth_tracker = state.growth_tracker;
    out->hysteresis_tracker = state.hysteresis_tracker;
    return absl::OkStatus();
  });
}

int depot_grad_scaler_load_state(depot_grad_scaler_t* scaler,
                                 const depot_grad_scaler_state_t* state) {
  constexpr const char* kFunction = "depot_grad_scaler_load_state";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (scaler == nullptr)
      return depot::c_api::NullArgument(kFunction, "scaler");
    if (state == nullptr) return depot::c_api::NullArgument(kFunction, "state");
    // A scale that does not survive the fp32 rounding (0, overflow) is left
    // to LoadStateDict, which names the field.
    return scaler->scaler->LoadStateDict(depot::GradScalerState{
        .scale = static_cast<float>(state->scale),
        .growth_tracker = state->growth_tracker,
        .hysteresis_tracker = state->hysteresis_tracker,
    });
  });
}

void depot_grad_scaler_destroy(depot_grad_scaler_t* scaler) { delete scaler; }

}  // extern "C"
