// JobConfig: everything that defines a job, shared by client and server. The
// fingerprint hashes all of it, so a client and a server agree on a job exactly when
// their fingerprints match.
#ifndef DEPOT_JOB_CONFIG_H_
#define DEPOT_JOB_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "depot/dtype.h"
#include "depot/layout.h"

namespace depot {

// Values equal the wire enum depot.v1.OptimizerKind.
enum class OptimizerKind : uint8_t {
  kAdamW = 1,  // torch.optim.AdamW (decoupled weight decay)
  kAdam = 2,   // torch.optim.Adam (L2 weight decay added to the gradient)
  kSgd = 3,    // torch.optim.SGD (momentum, dampening, Nesterov)
};

// Field names and defaults follow Megatron-Core's OptimizerConfig where they apply.
struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdamW;
  double lr = 1e-3;
  double weight_decay = 0.01;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double sgd_momentum = 0.9;
  double sgd_dampening = 0.0;
  bool sgd_nesterov = false;
};

// INVALID_ARGUMENT with the offending field named when: lr or weight_decay is
// negative or not finite; betas outside [0, 1); eps <= 0; momentum negative;
// Nesterov without momentum or with dampening (as torch.optim.SGD).
absl::Status ValidateOptimizerConfig(const OptimizerConfig& config);

inline constexpr uint64_t kDefaultChunkElems = uint64_t{1} << 20;
inline constexpr uint64_t kDefaultAlignmentElems = 64;

struct JobConfig {
  std::string name;
  std::vector<TensorSpec> tensors;
  uint32_t num_workers = 1;  // W data-parallel contributors per chunk
  OptimizerConfig optimizer;
  DType grad_dtype = DType::kFloat32;
  DType weight_dtype = DType::kFloat32;
  uint64_t chunk_elems = kDefaultChunkElems;
  uint64_t alignment_elems = kDefaultAlignmentElems;
  uint32_t num_servers = 1;
};

// Per-step hyperparameters of one param group. A step may carry one per group; a
// group without one uses OptimizerConfig's lr and weight_decay.
struct GroupHyperParams {
  uint32_t param_group = 0;
  double lr = 0.0;
  double weight_decay = 0.0;
};

// Validates everything, the layout included. INVALID_ARGUMENT with a message naming
// the field when: name is empty; num_workers or num_servers is 0; chunk_elems is 0
// or not a multiple of alignment_elems; the layout or optimizer config is invalid.
absl::Status ValidateJobConfig(const JobConfig& config);

// A 64-bit hash of every field of `config`, stable across processes, builds and
// machines (it hashes a canonical byte encoding, not memory).
uint64_t Fingerprint(const JobConfig& config);

// Number of fp32 state slots per parameter besides the master weight:
// Adam/AdamW 2 (exp_avg, exp_avg_sq); SGD 1 when momentum > 0, else 0.
int OptimizerStateSlots(const OptimizerConfig& config);

}  // namespace depot

#endif  // DEPOT_JOB_CONFIG_H_
