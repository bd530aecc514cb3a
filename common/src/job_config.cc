#include "depot/job_config.h"

#include <bit>
#include <cmath>
#include <string_view>

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
constexpr std::string_view kFingerprintTag = "depot.JobConfig.v1";

}  // namespace

absl::Status ValidateOptimizerConfig(const OptimizerConfig& config) {
  switch (config.kind) {
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdam:
    case OptimizerKind::kSgd:
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer.kind: unknown optimizer kind ",
                       static_cast<int>(config.kind),
                       " (expected 1 = AdamW, 2 = Adam, 3 = SGD)"));
  }
  if (absl::Status s = CheckNonNegativeFinite("optimizer.lr", config.lr);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckNonNegativeFinite("optimizer.weight_decay", config.weight_decay);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckBeta("optimizer.adam_beta1", config.adam_beta1);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckBeta("optimizer.adam_beta2", config.adam_beta2);
      !s.ok()) {
    return s;
  }
  if (!(config.adam_eps > 0)) {
    return FieldError("optimizer.adam_eps", "must be > 0", config.adam_eps);
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
  return absl::OkStatus();
}

absl::Status ValidateJobConfig(const JobConfig& config) {
  if (config.name.empty()) {
    return absl::InvalidArgumentError("name: must not be empty");
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
  if (config.num_servers == 0) {
    return absl::InvalidArgumentError("num_servers: must be > 0");
  }
  return absl::OkStatus();
}

uint64_t Fingerprint(const JobConfig& config) {
  FingerprintHasher h;
  h.Str(kFingerprintTag);
  h.Str(config.name);
  h.U64(config.tensors.size());
  for (const TensorSpec& tensor : config.tensors) {
    h.Str(tensor.name);
    h.U64(tensor.numel);
    h.U64(tensor.param_group);
  }
  h.U64(config.num_workers);
  const OptimizerConfig& opt = config.optimizer;
  h.U64(static_cast<uint64_t>(opt.kind));
  h.F64(opt.lr);
  h.F64(opt.weight_decay);
  h.F64(opt.adam_beta1);
  h.F64(opt.adam_beta2);
  h.F64(opt.adam_eps);
  h.F64(opt.sgd_momentum);
  h.F64(opt.sgd_dampening);
  h.U64(opt.sgd_nesterov ? 1 : 0);
  h.U64(static_cast<uint64_t>(config.grad_dtype));
  h.U64(static_cast<uint64_t>(config.weight_dtype));
  h.U64(config.chunk_elems);
  h.U64(config.alignment_elems);
  h.U64(config.num_servers);
  return h.Finish();
}

int OptimizerStateSlots(const OptimizerConfig& config) {
  switch (config.kind) {
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdam:
      return 2;
    case OptimizerKind::kSgd:
      return config.sgd_momentum > 0 ? 1 : 0;
  }
  return 0;
}

}  // namespace depot
