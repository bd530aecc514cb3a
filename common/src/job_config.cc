#include "depot/job_config.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace depot {
namespace {

absl::Status FieldError(const char* field, const char* problem, double value) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", problem, ", got ", value));
}

// Non-negative and finite (lr, weight_decay).
absl::Status CheckNonNegativeFinite(const char* field, double value) {
  if (!std::isfinite(value) || value < 0) {
    return FieldError(field, "must be finite and >= 0", value);
  }
  return absl::OkStatus();
}

absl::Status CheckBeta(const char* field, double value) {
  // Written so that NaN fails too.
  if (!(value >= 0 && value < 1)) {
    return FieldError(field, "must be in [0, 1)", value);
  }
  return absl::OkStatus();
}

absl::Status CheckPositiveFinite(const char* field, double value) {
  if (!std::isfinite(value) || !(value > 0)) {
    return FieldError(field, "must be finite and > 0", value);
  }
  return absl::OkStatus();
}

// The dtype field that sets the storage of each state slot, per kind; nullptr
// for a slot the kind does not keep.
struct SlotDTypeField {
  const char* name;
  DType OptimizerConfig::*member;
};

constexpr SlotDTypeField kExpAvg = {"optimizer.exp_avg_dtype",
                                    &OptimizerConfig::exp_avg_dtype};
constexpr SlotDTypeField kExpAvgSq = {"optimizer.exp_avg_sq_dtype",
                                      &OptimizerConfig::exp_avg_sq_dtype};

// The field that sets slot `slot`'s dtype. REQUIRES: slot < the kind's slots.
const SlotDTypeField& SlotField(const OptimizerConfig& config, int slot) {
  switch (config.kind) {
    case OptimizerKind::kAdagrad:
      return kExpAvgSq;  // state_sum is a sum of squares
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdam:
      // exp_avg, exp_avg_sq, and with amsgrad max_exp_avg_sq.
      return slot == 0 ? kExpAvg : kExpAvgSq;
    default:
      return kExpAvg;  // SGD's momentum_buffer, Lion's exp_avg
  }
}

// Both moment dtypes are fp32 or bf16, and bf16 only where the optimizer keeps
// the slot that field describes (a bf16 request for a slot that does not exist
// is a mistake in the config, not something to ignore silently).
absl::Status CheckMomentDTypes(const OptimizerConfig& config) {
  for (const SlotDTypeField* field : {&kExpAvg, &kExpAvgSq}) {
    const DType dtype = config.*(field->member);
    if (dtype != DType::kFloat32 && dtype != DType::kBFloat16) {
      const std::string_view name = DTypeName(dtype);
      return absl::InvalidArgumentError(
          absl::StrCat(field->name, ": must be fp32 or bf16, got ",
                       absl::string_view(name.data(), name.size()),
                       " (dtype value ", static_cast<int>(dtype), ")"));
    }
    if (dtype == DType::kFloat32) continue;
    bool used = false;
    for (int k = 0; k < OptimizerStateSlots(config); ++k) {
      used = used || SlotField(config, k).member == field->member;
    }
    if (!used) {
      return absl::InvalidArgumentError(absl::StrCat(
          field->name,
          ": must be fp32 because this optimizer keeps no state that it "
          "describes (exp_avg_dtype: Adam/AdamW exp_avg, SGD momentum_buffer "
          "with sgd_momentum > 0, Lion exp_avg; exp_avg_sq_dtype: Adam/AdamW "
          "exp_avg_sq, Adagrad state_sum)"));
    }
  }
  return absl::OkStatus();
}

// The fields of the global gradient clipping and of the loss scaler, which the
// client and the servers' step flow use.
absl::Status CheckClippingAndLossScaling(const OptimizerConfig& config) {
  for (const auto& [field, value] :
       {std::pair<const char*, double>{"optimizer.clip_grad", config.clip_grad},
        {"optimizer.grad_norm_skip_threshold", config.grad_norm_skip_threshold},
        {"optimizer.loss_scale", config.loss_scale}}) {
    if (absl::Status s = CheckNonNegativeFinite(field, value); !s.ok()) {
      return s;
    }
  }
  if (config.clip_grad_norm_type != GradNormType::kL2 &&
      config.clip_grad_norm_type != GradNormType::kInf) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.clip_grad_norm_type: unknown norm type ",
                     static_cast<int>(config.clip_grad_norm_type),
                     " (expected 1 = L2, 2 = inf)"));
  }
  if (absl::Status s = CheckPositiveFinite("optimizer.initial_loss_scale",
                                           config.initial_loss_scale);
      !s.ok()) {
    return s;
  }
  if (!std::isfinite(config.min_loss_scale) || !(config.min_loss_scale > 0) ||
      config.min_loss_scale > config.initial_loss_scale) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer.min_loss_scale: must be finite, > 0 and <= "
        "initial_loss_scale (",
        config.initial_loss_scale, "), got ", config.min_loss_scale));
  }
  if (!std::isfinite(config.loss_scale_window) ||
      !(config.loss_scale_window >= 1)) {
    return FieldError("optimizer.loss_scale_window", "must be finite and >= 1",
                      config.loss_scale_window);
  }
  if (config.hysteresis < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer.hysteresis: must be >= 1, got ", config.hysteresis));
  }
  return absl::OkStatus();
}

// FNV-1a 64 over a canonical little-endian byte encoding, finished with the
// splitmix64 finaliser so that every input bit reaches every output bit (plain
// FNV-1a mixes the last bytes weakly into the high bits).
class FingerprintHasher {
 public:
  void Bytes(const unsigned char* data, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      hash_ = (hash_ ^ data[i]) * kFnvPrime;
    }
  }
  void U64(uint64_t value) {
    unsigned char bytes[8];
    for (int i = 0; i < 8; ++i)
      bytes[i] = static_cast<unsigned char>(value >> (8 * i));
    Bytes(bytes, sizeof(bytes));
  }
  void F64(double value) { U64(std::bit_cast<uint64_t>(value)); }
  // Length-prefixed, so that adjacent strings cannot trade characters.
  void Str(std::string_view value) {
    U64(value.size());
    Bytes(reinterpret_cast<const unsigned char*>(value.data()), value.size());
  }

  uint64_t Finish() const {
    uint64_t z = hash_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
  }

 private:
  static constexpr uint64_t kFnvOffsetBasis = 0xcbf29ce484222325u;
  static constexpr uint64_t kFnvPrime = 0x100000001b3u;
  uint64_t hash_ = kFnvOffsetBasis;
};

// The encoding's version; bump it when the encoding below changes.
constexpr std::string_view kFingerprintTag = "depot.JobConfig.v3";
// The encoding before the server count left the fingerprint
// (FingerprintWithServerCount: state blobs of format 1 and 2).
constexpr std::string_view kFingerprintTagWithServerCount =
    "depot.JobConfig.v2";

}  // namespace

absl::Status ValidateOptimizerConfig(const OptimizerConfig& config) {
  switch (config.kind) {
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdam:
    case OptimizerKind::kSgd:
    case OptimizerKind::kAdagrad:
    case OptimizerKind::kLion:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer.kind: unknown optimizer kind ",
          static_cast<int>(config.kind),
          " (expected 1 = AdamW, 2 = Adam, 3 = SGD, 4 = Adagrad, 5 = Lion)"));
  }
  // Every field is checked whatever the kind: a job's config is its identity,
  // and a value that is invalid today should not become meaningful when the
  // kind changes.
  for (const auto& [field, value] : {
           std::pair<const char*, double>{"optimizer.lr", config.lr},
           {"optimizer.min_lr", config.min_lr},
           {"optimizer.weight_decay", config.weight_decay},
           {"optimizer.adagrad_lr_decay", config.adagrad_lr_decay},
           {"optimizer.adagrad_initial_accumulator_value",
            config.adagrad_initial_accumulator_value},
       }) {
    if (absl::Status s = CheckNonNegativeFinite(field, value); !s.ok()) {
      return s;
    }
  }
  for (const auto& [field, value] : {
           std::pair<const char*, double>{"optimizer.adam_beta1",
                                          config.adam_beta1},
           {"optimizer.adam_beta2", config.adam_beta2},
           {"optimizer.lion_beta1", config.lion_beta1},
           {"optimizer.lion_beta2", config.lion_beta2},
       }) {
    if (absl::Status s = CheckBeta(field, value); !s.ok()) return s;
  }
  if (absl::Status s =
          CheckPositiveFinite("optimizer.adam_eps", config.adam_eps);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckPositiveFinite("optimizer.adagrad_eps", config.adagrad_eps);
      !s.ok()) {
    return s;
  }
  if (!(config.sgd_momentum >= 0)) {
    return FieldError("optimizer.sgd_momentum", "must be >= 0",
                      config.sgd_momentum);
  }
  if (config.sgd_nesterov &&
      (config.sgd_momentum <= 0 || config.sgd_dampening != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer.sgd_nesterov: Nesterov momentum requires "
        "sgd_momentum > 0 and sgd_dampening == 0, got momentum ",
        config.sgd_momentum, " and dampening ", config.sgd_dampening));
  }
  if (config.amsgrad && config.kind != OptimizerKind::kAdam &&
      config.kind != OptimizerKind::kAdamW) {
    return absl::InvalidArgumentError(
        "optimizer.amsgrad: only Adam and AdamW have an AMSGrad variant");
  }
  if (absl::Status s = CheckMomentDTypes(config); !s.ok()) return s;
  return CheckClippingAndLossScaling(config);
}

namespace {

// The fields a param group's config must share with the job's: what the
// kernel's storage and the step's global flow (clipping, loss scaling) read.
absl::Status CheckJobWideFields(const OptimizerConfig& job,
                                const OptimizerConfig& group, uint32_t index) {
  const auto differs = [&](const char* field) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group_optimizers[", index, "].", field,
        ": must equal optimizer.", field,
        " (a job-wide setting; only the optimizer's hyperparameters may "
        "differ between param groups)"));
  };
  if (group.kind != job.kind) return differs("kind");
  if (group.exp_avg_dtype != job.exp_avg_dtype) return differs("exp_avg_dtype");
  if (group.exp_avg_sq_dtype != job.exp_avg_sq_dtype) {
    return differs("exp_avg_sq_dtype");
  }
  if (group.clip_grad != job.clip_grad) return differs("clip_grad");
  if (group.clip_grad_norm_type != job.clip_grad_norm_type) {
    return differs("clip_grad_norm_type");
  }
  if (group.grad_norm_skip_threshold != job.grad_norm_skip_threshold) {
    return differs("grad_norm_skip_threshold");
  }
  if (group.loss_scale != job.loss_scale) return differs("loss_scale");
  if (group.initial_loss_scale != job.initial_loss_scale) {
    return differs("initial_loss_scale");
  }
  if (group.min_loss_scale != job.min_loss_scale) {
    return differs("min_loss_scale");
  }
  if (group.loss_scale_window != job.loss_scale_window) {
    return differs("loss_scale_window");
  }
  if (group.hysteresis != job.hysteresis) return differs("hysteresis");
  return absl::OkStatus();
}

absl::Status ValidateGroupOptimizers(const JobConfig& config) {
  if (config.group_optimizers.empty()) return absl::OkStatus();
  uint32_t max_group = 0;
  for (const TensorSpec& tensor : config.tensors) {
    max_group = std::max(max_group, tensor.param_group);
  }
  if (config.group_optimizers.size() != uint64_t{max_group} + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group_optimizers: has ", config.group_optimizers.size(),
        " entries, the layout's param groups need ", uint64_t{max_group} + 1,
        " (one per group 0 to ", max_group, ")"));
  }
  for (uint32_t g = 0; g < config.group_optimizers.size(); ++g) {
    const OptimizerConfig& group = config.group_optimizers[g];
    if (absl::Status s = ValidateOptimizerConfig(group); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("group_optimizers[", g,
                                                 "]: ", s.message()));
    }
    if (absl::Status s = CheckJobWideFields(config.optimizer, group, g);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

void HashOptimizer(FingerprintHasher& h, const OptimizerConfig& opt) {
  h.U64(static_cast<uint64_t>(opt.kind));
  h.F64(opt.lr);
  h.F64(opt.min_lr);
  h.F64(opt.weight_decay);
  h.F64(opt.adam_beta1);
  h.F64(opt.adam_beta2);
  h.F64(opt.adam_eps);
  h.F64(opt.sgd_momentum);
  h.F64(opt.sgd_dampening);
  h.U64(opt.sgd_nesterov ? 1 : 0);
  h.F64(opt.adagrad_lr_decay);
  h.F64(opt.adagrad_initial_accumulator_value);
  h.F64(opt.adagrad_eps);
  h.F64(opt.lion_beta1);
  h.F64(opt.lion_beta2);
  h.U64(static_cast<uint64_t>(opt.exp_avg_dtype));
  h.U64(static_cast<uint64_t>(opt.exp_avg_sq_dtype));
  h.F64(opt.clip_grad);
  h.U64(static_cast<uint64_t>(opt.clip_grad_norm_type));
  h.F64(opt.grad_norm_skip_threshold);
  h.F64(opt.loss_scale);
  h.F64(opt.initial_loss_scale);
  h.F64(opt.min_loss_scale);
  h.F64(opt.loss_scale_window);
  // Sign-extended, so that a negative value has one encoding.
  h.U64(static_cast<uint64_t>(static_cast<int64_t>(opt.hysteresis)));
}

// The fields added after the v2 encoding, hashed only when they are set, so
// that a config that does not use them keeps the fingerprint it always had
// (saved states carry it). Each is tagged, so no two settings collide.
void HashOptimizerFlags(FingerprintHasher& h, const OptimizerConfig& opt) {
  if (opt.amsgrad) h.Str("amsgrad");
  if (opt.maximize) h.Str("maximize");
}

}  // namespace

uint64_t MaxChunkElems(const JobConfig& config) {
  const uint64_t tensors = config.tensors.size();
  const uint64_t fixed =
      kStateChunkOverheadBytes +
      std::min(tensors, kMaxTensors + 1) * kStateChunkBytesPerTensor;
  if (fixed >= kWireMessageLimitBytes) return 0;
  return (kWireMessageLimitBytes - fixed) /
         OptimizerStateBytesPerParam(JobSlotConfig(config));
}

absl::Status ValidateJobConfig(const JobConfig& config) {
  if (config.name.empty()) {
    return absl::InvalidArgumentError("name: must not be empty");
  }
  if (config.name.size() > kMaxJobNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("name: must be at most ", kMaxJobNameBytes,
                     " bytes, got ", config.name.size()));
  }
  // Checked before the layout is built: these bound what it allocates.
  if (config.tensors.size() > kMaxTensors) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensors: at most ", kMaxTensors, " tensors, got ",
                     config.tensors.size()));
  }
  for (size_t i = 0; i < config.tensors.size(); ++i) {
    if (config.tensors[i].name.size() > kMaxTensorNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensors[", i, "].name: must be at most ", kMaxTensorNameBytes,
          " bytes, got ", config.tensors[i].name.size()));
    }
  }
  if (config.num_workers > kMaxWorkers) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_workers: must be at most ", kMaxWorkers, ", got ",
                     config.num_workers));
  }
  if (config.num_servers > kMaxServers) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_servers: must be at most ", kMaxServers, ", got ",
                     config.num_servers));
  }
  absl::StatusOr<Layout> layout =
      Layout::Create(config.tensors, config.alignment_elems);
  if (!layout.ok()) return layout.status();
  if (config.num_workers == 0) {
    return absl::InvalidArgumentError("num_workers: must be > 0");
  }
  if (absl::Status s = ValidateOptimizerConfig(config.optimizer); !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidateGroupOptimizers(config); !s.ok()) return s;
  if (!DTypeFromWire(static_cast<int>(config.grad_dtype)).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("grad_dtype: unknown dtype value ",
                     static_cast<int>(config.grad_dtype)));
  }
  if (!DTypeFromWire(static_cast<int>(config.weight_dtype)).ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_dtype: unknown dtype value ",
                     static_cast<int>(config.weight_dtype)));
  }
  if (config.chunk_elems == 0 ||
      config.chunk_elems % config.alignment_elems != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk_elems: must be a positive multiple of alignment_elems (",
        config.alignment_elems, "), got ", config.chunk_elems));
  }
  if (const uint64_t max_chunk = MaxChunkElems(config);
      config.chunk_elems > max_chunk) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk_elems: at most ", max_chunk, " for this job, got ",
        config.chunk_elems, ": a chunk's saved state (",
        OptimizerStateBytesPerParam(JobSlotConfig(config)),
        " bytes per element, and ", kStateChunkBytesPerTensor,
        " per tensor) must fit one ", kWireMessageLimitBytes,
        "-byte message, or the job could never be exported or imported"));
  }
  if (config.num_servers == 0) {
    return absl::InvalidArgumentError("num_servers: must be > 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<JobGeometry> MakeJobGeometry(const JobConfig& config) {
  if (absl::Status s = ValidateJobConfig(config); !s.ok()) return s;
  absl::StatusOr<Layout> layout =
      Layout::Create(config.tensors, config.alignment_elems);
  if (!layout.ok()) return layout.status();
  absl::StatusOr<ShardPlan> plan = ShardPlan::Create(
      layout->total_elems(), config.num_servers, config.chunk_elems);
  if (!plan.ok()) return plan.status();
  return JobGeometry{*std::move(layout), *std::move(plan)};
}

namespace {

uint64_t FingerprintOf(const JobConfig& config, bool with_server_count) {
  FingerprintHasher h;
  h.Str(with_server_count ? kFingerprintTagWithServerCount : kFingerprintTag);
  h.Str(config.name);
  h.U64(config.tensors.size());
  for (const TensorSpec& tensor : config.tensors) {
    h.Str(tensor.name);
    h.U64(tensor.numel);
    h.U64(tensor.param_group);
  }
  h.U64(config.num_workers);
  HashOptimizer(h, config.optimizer);
  h.U64(static_cast<uint64_t>(config.grad_dtype));
  h.U64(static_cast<uint64_t>(config.weight_dtype));
  h.U64(config.chunk_elems);
  h.U64(config.alignment_elems);
  if (with_server_count) h.U64(config.num_servers);
  HashOptimizerFlags(h, config.optimizer);
  if (!config.group_optimizers.empty()) {
    h.Str("group_optimizers");
    h.U64(config.group_optimizers.size());
    for (const OptimizerConfig& group : config.group_optimizers) {
      HashOptimizer(h, group);
      HashOptimizerFlags(h, group);
      h.Str(";");
    }
  }
  return h.Finish();
}

}  // namespace

uint64_t Fingerprint(const JobConfig& config) {
  return FingerprintOf(config, /*with_server_count=*/false);
}

uint64_t FingerprintWithServerCount(const JobConfig& config) {
  return FingerprintOf(config, /*with_server_count=*/true);
}

const OptimizerConfig& GroupOptimizer(const JobConfig& config,
                                      uint32_t param_group) {
  if (config.group_optimizers.empty()) return config.optimizer;
  return config.group_optimizers[param_group];
}

OptimizerConfig JobSlotConfig(const JobConfig& config) {
  OptimizerConfig slots = config.optimizer;
  for (const OptimizerConfig& group : config.group_optimizers) {
    slots.amsgrad = slots.amsgrad || group.amsgrad;
    if (group.sgd_momentum > 0 && !(slots.sgd_momentum > 0)) {
      slots.sgd_momentum = group.sgd_momentum;
    }
  }
  return slots;
}

int JobStateSlots(const JobConfig& config) {
  return OptimizerStateSlots(JobSlotConfig(config));
}

int OptimizerStateSlots(const OptimizerConfig& config) {
  switch (config.kind) {
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdam:
      return config.amsgrad ? 3 : 2;
    case OptimizerKind::kSgd:
      return config.sgd_momentum > 0 ? 1 : 0;
    case OptimizerKind::kAdagrad:
    case OptimizerKind::kLion:
      return 1;
  }
  return 0;
}

DType OptimizerSlotDType(const OptimizerConfig& config, int slot) {
  return config.*(SlotField(config, slot).member);
}

double OptimizerSlotInitialValue(const OptimizerConfig& config, int /*slot*/) {
  // Adagrad's one slot is state_sum; every other slot starts at zero.
  return config.kind == OptimizerKind::kAdagrad
             ? config.adagrad_initial_accumulator_value
             : 0.0;
}

uint64_t OptimizerStateBytesPerParam(const OptimizerConfig& config) {
  uint64_t bytes = sizeof(float);
  for (int k = 0; k < OptimizerStateSlots(config); ++k) {
    bytes += DTypeSize(OptimizerSlotDType(config, k));
  }
  return bytes;
}

}  // namespace depot
