// JobConfig: everything that defines a job, shared by client and server. The
// fingerprint hashes all of it, so a client and a server agree on a job exactly
// when their fingerprints match.
#ifndef DEPOT_JOB_CONFIG_H_
#define DEPOT_JOB_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "depot/dtype.h"
#include "depot/export.h"
#include "depot/layout.h"
#include "depot/shard_plan.h"

namespace depot {

// Values equal the wire enum depot.v1.OptimizerKind.
enum class OptimizerKind : uint8_t {
  kAdamW = 1,    // torch.optim.AdamW (decoupled weight decay)
  kAdam = 2,     // torch.optim.Adam (L2 weight decay added to the gradient)
  kSgd = 3,      // torch.optim.SGD (momentum, dampening, Nesterov)
  kAdagrad = 4,  // torch.optim.Adagrad (lr decay, initial accumulator)
  kLion = 5,     // Lion (Chen et al. 2023, "Symbolic Discovery of Optimization
                 // Algorithms"), decoupled weight decay
};

// The norm used for global gradient clipping (Megatron's clip_grad norm_type).
// Values equal the wire enum depot.v1.GradNormType.
enum class GradNormType : uint8_t {
  kL2 = 1,
  kInf = 2,
};

// Field names and defaults follow Megatron-Core's OptimizerConfig where they
// apply (docs/optimizers.md maps every Megatron field and flag). Fields that
// only the client uses (schedules live elsewhere; loss scaling and clipping
// settings here) are still part of the job's identity and fingerprint.
struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdamW;
  // Base learning rate and weight decay; per-group values may travel with each
  // step (GroupHyperParams), e.g. from a schedule.
  double lr = 1e-3;
  double min_lr = 0.0;
  double weight_decay = 0.01;

  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;

  double sgd_momentum = 0.9;
  double sgd_dampening = 0.0;
  bool sgd_nesterov = false;

  double adagrad_lr_decay = 0.0;
  double adagrad_initial_accumulator_value = 0.0;
  double adagrad_eps = 1e-10;

  double lion_beta1 = 0.9;
  double lion_beta2 = 0.99;

  // Storage dtype of the optimizer's state slots (Megatron's precision-aware
  // optimizer): kFloat32 or kBFloat16. Arithmetic is fp32 either way.
  // exp_avg_dtype: Adam's exp_avg, SGD's momentum_buffer, Lion's exp_avg;
  // exp_avg_sq_dtype: Adam's exp_avg_sq (and max_exp_avg_sq with amsgrad),
  // Adagrad's state_sum. A field that
  // names a slot the optimizer does not keep must stay kFloat32.
  DType exp_avg_dtype = DType::kFloat32;
  DType exp_avg_sq_dtype = DType::kFloat32;

  // Global gradient clipping: clip when the total norm exceeds clip_grad; 0
  // turns it off. (Megatron's default is 1.0; Depot's is 0 so that a job
  // behaves like the torch.optim optimizer it replaces unless clipping is asked
  // for.)
  double clip_grad = 0.0;
  GradNormType clip_grad_norm_type = GradNormType::kL2;
  // Skip the step when the grad norm exceeds this; 0 turns it off.
  double grad_norm_skip_threshold = 0.0;

  // Loss scaling. loss_scale > 0: a constant scale. Otherwise, with fp16
  // gradients, a dynamic scale with the parameters below (Megatron's
  // DynamicGradScaler); otherwise none.
  double loss_scale = 0.0;
  double initial_loss_scale = 4294967296.0;  // 2^32
  double min_loss_scale = 1.0;
  double loss_scale_window = 1000;
  int hysteresis = 2;

  // torch.optim's flags. amsgrad (Adam/AdamW only): keep the maximum of
  // exp_avg_sq in a third slot (max_exp_avg_sq) and divide by its root.
  // maximize (every kind): the update ascends the gradient, as torch's
  // `grad = -grad` before everything else.
  bool amsgrad = false;
  bool maximize = false;
};

// Every field of OptimizerConfig, in declaration order, once: the
// conversions (the proto, the C API) and the field-by-field comparison
// (job_config_diff.h) expand it, so that a new hyperparameter is one line
// here plus its declaration above (and the proto, C and Python structs, whose
// round trips tests/unit/wire_test.cc and c_api_convert_test.cc check).
// NUMBER(f): a double or int, copied as it is; FLAG(f): a bool (an int32 in
// C); ENUM(f): converted by hand where its type needs it. The fingerprint's
// encoding is frozen (job_config.cc, HashOptimizer) and lists the fields
// itself.
#define DEPOT_OPTIMIZER_FIELDS(NUMBER, FLAG, ENUM) \
  ENUM(kind)                                       \
  NUMBER(lr)                                       \
  NUMBER(min_lr)                                   \
  NUMBER(weight_decay)                             \
  NUMBER(adam_beta1)                               \
  NUMBER(adam_beta2)                               \
  NUMBER(adam_eps)                                 \
  NUMBER(sgd_momentum)                             \
  NUMBER(sgd_dampening)                            \
  FLAG(sgd_nesterov)                               \
  NUMBER(adagrad_lr_decay)                         \
  NUMBER(adagrad_initial_accumulator_value)        \
  NUMBER(adagrad_eps)                              \
  NUMBER(lion_beta1)                               \
  NUMBER(lion_beta2)                               \
  ENUM(exp_avg_dtype)                              \
  ENUM(exp_avg_sq_dtype)                           \
  NUMBER(clip_grad)                                \
  ENUM(clip_grad_norm_type)                        \
  NUMBER(grad_norm_skip_threshold)                 \
  NUMBER(loss_scale)                               \
  NUMBER(initial_loss_scale)                       \
  NUMBER(min_loss_scale)                           \
  NUMBER(loss_scale_window)                        \
  NUMBER(hysteresis)                               \
  FLAG(amsgrad)                                    \
  FLAG(maximize)

// INVALID_ARGUMENT with the offending field named when: the kind is unknown;
// amsgrad with a kind other than Adam/AdamW;
// lr, min_lr, weight_decay, adagrad_lr_decay,
// adagrad_initial_accumulator_value, clip_grad, grad_norm_skip_threshold or
// loss_scale is negative or not finite; adam or lion betas outside [0, 1);
// adam_eps or adagrad_eps not a finite value > 0; momentum negative; Nesterov
// without momentum or with dampening (as torch.optim.SGD); a moment dtype other
// than fp32/bf16, or bf16 for a slot the optimizer does not keep;
// clip_grad_norm_type unknown; initial_loss_scale not a finite value > 0;
// min_loss_scale not in (0, initial_loss_scale]; loss_scale_window < 1 or not
// finite; hysteresis < 1.
DEPOT_API absl::Status ValidateOptimizerConfig(const OptimizerConfig& config);

inline constexpr uint64_t kDefaultChunkElems = uint64_t{1} << 20;
inline constexpr uint64_t kDefaultAlignmentElems = 64;

// Bounds on a job's size fields (docs/protocol.md, "Bounds"). Everything a
// server keeps per server, per worker, per tensor and per chunk of a job is
// counted against its memory budget, and these bounds keep what it builds
// before that check (the shard plan: one entry per server) small. kMaxServers
// is ShardPlan's own (shard_plan.h), which every plan checks.
inline constexpr uint32_t kMaxWorkers = uint32_t{1} << 16;
inline constexpr uint64_t kMaxTensors = uint64_t{1} << 20;
inline constexpr size_t kMaxJobNameBytes = 256;
inline constexpr size_t kMaxTensorNameBytes = 1024;
// The largest gRPC message client and server exchange (both set it).
inline constexpr uint64_t kWireMessageLimitBytes = uint64_t{64} << 20;
// What a StateChunk message (the largest message of a job, ExportState and
// ImportState) holds besides its arrays and its per-tensor step counts: field
// tags, lengths and the scalar fields, with room to spare.
inline constexpr uint64_t kStateChunkOverheadBytes = 4096;
// Each per-tensor optimizer step count of a StateChunk: at most 10 bytes
// (a varint; steps are at most 2^62).
inline constexpr uint64_t kStateChunkBytesPerTensor = 10;

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
  // Per-param-group optimizer configs (torch.optim's param groups with their
  // own betas, eps, momentum, amsgrad, ...). Empty: every group uses
  // `optimizer`. Otherwise entry g is param group g's config, for every group
  // of the layout; each has `optimizer`'s kind and its job-wide fields (moment
  // dtypes, clipping and loss scaling), which ValidateJobConfig checks.
  std::vector<OptimizerConfig> group_optimizers;
  // Server-side checkpoints of this job every this many steps (docs/
  // checkpoints.md); 0: the servers' --checkpoint_every_steps. Not part of
  // the job's identity: left out of the fingerprint and of the comparison
  // when a worker attaches (the job keeps the value it was created with).
  // Servers without --checkpoint_dir refuse a job that sets it.
  uint64_t checkpoint_every_steps = 0;
};

// The optimizer config of param group `param_group`: its entry in
// group_optimizers, or `optimizer` when that list is empty.
// REQUIRES: ValidateJobConfig(config).ok() and the group is in the layout.
DEPOT_API const OptimizerConfig& GroupOptimizer(const JobConfig& config,
                                                uint32_t param_group);

// The state slots a job keeps per element: the most any of its groups needs
// (OptimizerStateSlots), since the slot arrays span the whole flat space.
DEPOT_API int JobStateSlots(const JobConfig& config);

// The config that describes the job's slot arrays: `optimizer` with the slots
// of every group (amsgrad, SGD momentum) switched on where any group has them.
// OptimizerSlotDType and OptimizerStateBytesPerParam of it describe the job.
DEPOT_API OptimizerConfig JobSlotConfig(const JobConfig& config);

// Per-step hyperparameters of one param group. A step may carry one per group;
// a group without one uses OptimizerConfig's lr and weight_decay.
struct GroupHyperParams {
  uint32_t param_group = 0;
  double lr = 0.0;
  double weight_decay = 0.0;
};

// The largest chunk_elems a job of `config` may use: every message of the job
// fits kWireMessageLimitBytes, the largest being a chunk's StateChunk
// (chunk_elems * OptimizerStateBytesPerParam of its slots, plus
// kStateChunkBytesPerTensor for each tensor, plus kStateChunkOverheadBytes);
// step, pull and init messages carry at most 4 bytes per element, less.
// 0 when even one element does not fit (more tensors than that allows).
DEPOT_API uint64_t MaxChunkElems(const JobConfig& config);

// Validates everything, the layout included. INVALID_ARGUMENT with a message
// naming the field when: name is empty or longer than kMaxJobNameBytes;
// num_workers or num_servers is 0 or above kMaxWorkers / kMaxServers; more
// than kMaxTensors tensors, or a tensor name longer than kMaxTensorNameBytes;
// chunk_elems is 0, not a multiple of alignment_elems, or above
// MaxChunkElems; the layout or
// optimizer config is invalid; group_optimizers is not empty and does not have
// one valid entry per param group of the layout (0 to the largest), or an
// entry differs from `optimizer` in a job-wide field.
DEPOT_API absl::Status ValidateJobConfig(const JobConfig& config);

// The layout of a job's tensors and the shard plan over it: what client and
// server both derive from a config, with this one function.
struct JobGeometry {
  Layout layout;
  ShardPlan plan;
};

// INVALID_ARGUMENT as ValidateJobConfig (which it runs first).
DEPOT_API absl::StatusOr<JobGeometry> MakeJobGeometry(const JobConfig& config);

// A 64-bit hash of every field of `config` but num_servers, stable across
// processes, builds and machines (it hashes a canonical byte encoding, not
// memory). The server count is left out so that a job's state moves between
// server counts (a saved state or a checkpoint restores onto any number of
// servers); servers check num_servers on its own where it matters.
DEPOT_API uint64_t Fingerprint(const JobConfig& config);

// The fingerprint of earlier versions, which included num_servers: what state
// blobs of format version 1 and 2 carry.
uint64_t FingerprintWithServerCount(const JobConfig& config);

// Number of state slots per parameter besides the master weight:
// Adam/AdamW 2 (exp_avg, exp_avg_sq), 3 with amsgrad (max_exp_avg_sq);
// SGD 1 when momentum > 0, else 0;
// Adagrad 1 (state_sum); Lion 1 (exp_avg).
DEPOT_API int OptimizerStateSlots(const OptimizerConfig& config);

// The storage dtype of state slot `slot` (see OptimizerConfig::exp_avg_dtype).
// REQUIRES: 0 <= slot < OptimizerStateSlots(config).
DEPOT_API DType OptimizerSlotDType(const OptimizerConfig& config, int slot);

// The value every element of state slot `slot` holds before the first step:
// adagrad_initial_accumulator_value for Adagrad's state_sum, else 0.
// REQUIRES: 0 <= slot < OptimizerStateSlots(config).
DEPOT_API double OptimizerSlotInitialValue(const OptimizerConfig& config,
                                           int slot);

// Bytes of state per parameter: 4 for the fp32 master weight plus each slot's
// dtype size (AdamW: 12 with fp32 moments, 8 with bf16 ones).
DEPOT_API uint64_t OptimizerStateBytesPerParam(const OptimizerConfig& config);

}  // namespace depot

#endif  // DEPOT_JOB_CONFIG_H_
