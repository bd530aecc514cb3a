// C API structs <-> C++ client types (c_api_convert.h).
#include "c_api_convert.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "c_api_internal.h"

namespace depot::c_api {

namespace {
thread_local std::string last_error;
thread_local bool last_rolled_back = false;
thread_local uint64_t last_rolled_back_step = 0;
}  // namespace

int Record(const absl::Status& status) noexcept {
  const std::optional<uint64_t> rolled_back = RolledBackStep(status);
  last_rolled_back = rolled_back.has_value();
  last_rolled_back_step = rolled_back.value_or(0);
  try {
    last_error.assign(status.message().data(), status.message().size());
  } catch (...) {
    last_error.clear();  // no memory for the message; the code still tells
  }
  return static_cast<int>(status.code());
}

const char* LastError() noexcept { return last_error.c_str(); }

bool LastRolledBack(uint64_t* step) noexcept {
  if (last_rolled_back && step != nullptr) *step = last_rolled_back_step;
  return last_rolled_back;
}
namespace {

absl::Status CheckPositiveSeconds(double seconds, const char* field) {
  if (std::isfinite(seconds) && seconds > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("depot_client_options_t.", field, " is ", seconds,
                   ", must be a finite number of seconds > 0"));
}

// The enum fields are uint8_t in C++: a larger int must not wrap onto a valid
// value. Unknown values in range are left to ValidateOptimizerConfig.
absl::StatusOr<uint8_t> EnumField(int32_t value, const char* field) {
  if (value >= 0 && value <= UINT8_MAX) return static_cast<uint8_t>(value);
  return absl::InvalidArgumentError(absl::StrCat("depot_optimizer_config_t.",
                                                 field, " is ", value,
                                                 ", not a value of its enum"));
}

absl::StatusOr<OptimizerConfig> FromC(const depot_optimizer_config_t& c) {
  OptimizerConfig config;
  absl::StatusOr<uint8_t> kind = EnumField(c.kind, "kind");
  if (!kind.ok()) return kind.status();
  absl::StatusOr<uint8_t> norm =
      EnumField(c.clip_grad_norm_type, "clip_grad_norm_type");
  if (!norm.ok()) return norm.status();
  absl::StatusOr<DType> exp_avg =
      DTypeField(c.exp_avg_dtype, "optimizer.exp_avg_dtype");
  if (!exp_avg.ok()) return exp_avg.status();
  absl::StatusOr<DType> exp_avg_sq =
      DTypeField(c.exp_avg_sq_dtype, "optimizer.exp_avg_sq_dtype");
  if (!exp_avg_sq.ok()) return exp_avg_sq.status();
  config.kind = static_cast<OptimizerKind>(*kind);
  config.exp_avg_dtype = *exp_avg;
  config.exp_avg_sq_dtype = *exp_avg_sq;
  config.clip_grad_norm_type = static_cast<GradNormType>(*norm);
#define DEPOT_NUMBER_FROM_C(member) config.member = c.member;
#define DEPOT_FLAG_FROM_C(member) config.member = c.member != 0;
#define DEPOT_ENUM(member)
  DEPOT_OPTIMIZER_FIELDS(DEPOT_NUMBER_FROM_C, DEPOT_FLAG_FROM_C, DEPOT_ENUM)
#undef DEPOT_NUMBER_FROM_C
#undef DEPOT_FLAG_FROM_C
#undef DEPOT_ENUM
  return config;
}

}  // namespace

// INVALID_ARGUMENT naming the NULL argument `name` of `function`.
absl::Status NullArgument(const char* function, const char* name) {
  return absl::InvalidArgumentError(
      absl::StrCat(function, ": ", name, " is NULL"));
}

absl::StatusOr<ClientOptions> FromC(const char* const* servers,
                                    size_t num_servers,
                                    const depot_client_options_t& c) {
  ClientOptions options;
  for (size_t i = 0; i < num_servers; ++i) {
    if (servers[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("depot_client_create: servers[", i, "] is NULL"));
    }
    options.servers.emplace_back(servers[i]);
  }
  absl::Status valid =
      CheckPositiveSeconds(c.rpc_timeout_seconds, "rpc_timeout_seconds");
  if (!valid.ok()) return valid;
  valid = CheckPositiveSeconds(c.step_timeout_seconds, "step_timeout_seconds");
  if (!valid.ok()) return valid;
  options.rpc_timeout = absl::Seconds(c.rpc_timeout_seconds);
  options.step_timeout = absl::Seconds(c.step_timeout_seconds);
  options.max_inflight_chunks = c.max_inflight_chunks;
  options.connections_per_server = c.connections_per_server;
  if (!(c.unavailable_retry_seconds >= 0.0) ||
      !std::isfinite(c.unavailable_retry_seconds)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unavailable_retry_seconds is ", c.unavailable_retry_seconds,
        ", must be a finite number of seconds >= 0"));
  }
  options.unavailable_retry = absl::Seconds(c.unavailable_retry_seconds);
  const auto text = [](const char* value) {
    return value == nullptr ? std::string() : std::string(value);
  };
  options.tls_ca_file = text(c.tls_ca_file);
  options.tls_cert_file = text(c.tls_cert_file);
  options.tls_key_file = text(c.tls_key_file);
  options.auth_token = text(c.auth_token);
  options.auth_token_file = text(c.auth_token_file);
  return options;
}

absl::StatusOr<DType> DTypeField(int32_t value, const char* field) {
  absl::StatusOr<DType> dtype = DTypeFromWire(value);
  if (dtype.ok()) return dtype;
  return absl::InvalidArgumentError(
      absl::StrCat(field, " is ", value,
                   ", must be DEPOT_DTYPE_FP32 (1), DEPOT_DTYPE_BF16 (2) or "
                   "DEPOT_DTYPE_FP16 (3)"));
}

depot_optimizer_config_t ToC(const OptimizerConfig& config) {
  depot_optimizer_config_t c;
  c.kind = static_cast<int32_t>(config.kind);
  c.exp_avg_dtype = static_cast<int32_t>(config.exp_avg_dtype);
  c.exp_avg_sq_dtype = static_cast<int32_t>(config.exp_avg_sq_dtype);
  c.clip_grad_norm_type = static_cast<int32_t>(config.clip_grad_norm_type);
#define DEPOT_NUMBER_TO_C(member) c.member = config.member;
#define DEPOT_FLAG_TO_C(member) c.member = config.member ? 1 : 0;
#define DEPOT_ENUM(member)
  DEPOT_OPTIMIZER_FIELDS(DEPOT_NUMBER_TO_C, DEPOT_FLAG_TO_C, DEPOT_ENUM)
#undef DEPOT_NUMBER_TO_C
#undef DEPOT_FLAG_TO_C
#undef DEPOT_ENUM
  return c;
}

absl::StatusOr<JobConfig> FromC(const depot_job_config_t& c) {
  if (c.name == nullptr) return NullArgument("depot_job_open", "config->name");
  if (c.tensors == nullptr && c.num_tensors > 0) {
    return NullArgument("depot_job_open", "config->tensors");
  }
  JobConfig config;
  config.name = c.name;
  for (size_t i = 0; i < c.num_tensors; ++i) {
    const depot_tensor_spec_t& tensor = c.tensors[i];
    if (tensor.name == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "depot_job_open: config->tensors[", i, "].name is NULL"));
    }
    config.tensors.push_back({tensor.name, tensor.numel, tensor.param_group});
  }
  absl::StatusOr<OptimizerConfig> optimizer = FromC(c.optimizer);
  if (!optimizer.ok()) return optimizer.status();
  if (c.group_optimizers == nullptr && c.num_group_optimizers > 0) {
    return NullArgument("depot_job_open", "config->group_optimizers");
  }
  for (size_t g = 0; g < c.num_group_optimizers; ++g) {
    absl::StatusOr<OptimizerConfig> group = FromC(c.group_optimizers[g]);
    if (!group.ok()) {
      return absl::Status(group.status().code(),
                          absl::StrCat("config->group_optimizers[", g, "]: ",
                                       group.status().message()));
    }
    config.group_optimizers.push_back(*group);
  }
  absl::StatusOr<DType> grad = DTypeField(c.grad_dtype, "grad_dtype");
  if (!grad.ok()) return grad.status();
  absl::StatusOr<DType> weight = DTypeField(c.weight_dtype, "weight_dtype");
  if (!weight.ok()) return weight.status();
  config.num_workers = c.num_workers;
  config.optimizer = *optimizer;
  config.grad_dtype = *grad;
  config.weight_dtype = *weight;
  config.chunk_elems = c.chunk_elems;
  config.alignment_elems = c.alignment_elems;
  config.checkpoint_every_steps = c.checkpoint_every_steps;
  return config;
}

absl::StatusOr<StepOptions> FromC(const depot_step_options_t& c) {
  if (c.group_hparams == nullptr && c.num_group_hparams > 0) {
    return NullArgument("depot_job_step", "options->group_hparams");
  }
  StepOptions options;
  for (size_t i = 0; i < c.num_group_hparams; ++i) {
    const depot_group_hparams_t& group = c.group_hparams[i];
    options.group_hparams.push_back(
        {group.param_group, group.lr, group.weight_decay});
  }
  if (c.no_grad_tensors == nullptr && c.num_no_grad_tensors > 0) {
    return NullArgument("depot_job_step", "options->no_grad_tensors");
  }
  options.no_grad_tensors.assign(c.no_grad_tensors,
                                 c.no_grad_tensors + c.num_no_grad_tensors);
  if (c.weight_overrides == nullptr && c.num_weight_overrides > 0) {
    return NullArgument("depot_job_step", "options->weight_overrides");
  }
  for (size_t i = 0; i < c.num_weight_overrides; ++i) {
    options.weight_overrides.push_back(
        {c.weight_overrides[i].tensor_index, c.weight_overrides[i].values});
  }
  options.loss_scale = c.loss_scale;
  if (c.has_known_commit != 0) {
    options.known_commit =
        StepCommit{.clip_coef = c.known_clip_coef, .skip = c.known_skip != 0};
  }
  return options;
}

void ToC(const StepResult& result, depot_step_result_t* c) {
  c->step = result.step;
  c->chunks = result.chunks;
  c->chunks_replayed = result.chunks_replayed;
  c->bytes_sent = result.bytes_sent;
  c->bytes_received = result.bytes_received;
  c->update_seconds = result.update_seconds;
  c->wall_seconds = result.wall_seconds;
  c->two_phase = result.two_phase ? 1 : 0;
  c->grad_norm = result.grad_norm;
  c->zero_count = result.zero_count;
  c->found_inf = result.found_inf ? 1 : 0;
  c->skipped = result.skipped ? 1 : 0;
  c->clip_coef = result.clip_coef;
  c->capture_step = result.capture_step;
  c->capture_chunks = result.capture_chunks;
  ToCString(result.capture_error, c->capture_error, sizeof(c->capture_error));
}

void ToCString(absl::string_view text, char* out, size_t size) {
  const size_t n = std::min(text.size(), size - 1);
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
}

}  // namespace depot::c_api
