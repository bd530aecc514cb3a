// OptimizerKernel: the update of one contiguous run of parameters, all in one param
// group, from an fp32 gradient already summed over the workers. Implementations
// follow torch.optim semantics exactly (see docs/optimizers.md); they work element by
// element, so any split of a shard into runs, and any thread count, gives the same
// bits.
#ifndef DEPOT_SERVER_OPTIMIZER_OPTIMIZER_KERNEL_H_
#define DEPOT_SERVER_OPTIMIZER_OPTIMIZER_KERNEL_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "depot/job_config.h"

namespace depot {

// The hyperparameters of one update call.
struct UpdateHyperParams {
  double lr = 0.0;
  double weight_decay = 0.0;
  // The optimizer step count of these parameters after this update: 1 on the first
  // update (torch's state["step"] after its increment).
  uint64_t step = 1;
};

// The fp32 state of a run of n parameters. slots[k] is the k-th state array
// (Adam: 0 = exp_avg, 1 = exp_avg_sq; SGD with momentum: 0 = momentum_buffer);
// entries past OptimizerStateSlots(config) are unused.
struct ParamRun {
  float* master = nullptr;
  float* slots[2] = {nullptr, nullptr};
  size_t n = 0;
};

class OptimizerKernel {
 public:
  virtual ~OptimizerKernel() = default;

  // Updates run.master and run.slots in place from grad[0, run.n).
  // REQUIRES: grad and every used array hold run.n floats and do not overlap.
  virtual void Update(const float* grad, const ParamRun& run,
                      const UpdateHyperParams& hparams) const = 0;
};

// The kernel for config.kind. REQUIRES: ValidateOptimizerConfig(config).ok().
// The config's betas, eps, momentum, dampening and nesterov are fixed for the
// kernel's life; lr and weight_decay come with each Update.
std::unique_ptr<OptimizerKernel> MakeOptimizerKernel(
    const OptimizerConfig& config);

}  // namespace depot

#endif  // DEPOT_SERVER_OPTIMIZER_OPTIMIZER_KERNEL_H_
