// OptimizerKernel: the update of one contiguous run of parameters, all in one
// param group, from an fp32 gradient already summed over the workers, unscaled
// and clipped. Implementations follow torch.optim semantics exactly (Lion: its
// paper; see docs/optimizers.md); they work element by element, so any split
// of a shard into runs, and any thread count, gives the same bits.
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
  // The optimizer step count of these parameters after this update: 1 on the
  // first update (torch's state["step"] after its increment).
  uint64_t step = 1;
};

// The state of a run of n parameters: the fp32 master weights and the state
// slots. slots[k] is the k-th state array (Adam: 0 = exp_avg, 1 = exp_avg_sq;
// SGD with momentum: 0 = momentum_buffer; Adagrad: 0 = state_sum; Lion: 0 =
// exp_avg), n elements of OptimizerSlotDType(config, k): `float` for fp32,
// the uint16_t bit pattern for bf16. Entries past OptimizerStateSlots(config)
// are unused.
struct ParamRun {
  float* master = nullptr;
  void* slots[2] = {nullptr, nullptr};
  size_t n = 0;
};

class OptimizerKernel {
 public:
  virtual ~OptimizerKernel() = default;

  // Updates run.master and run.slots in place from grad[0, run.n). bf16 slots
  // are widened to fp32, updated in fp32 and stored back rounded to nearest,
  // ties to even; the update of the weights uses the unrounded fp32 values.
  // REQUIRES: grad and master hold run.n floats, every used slot run.n elements
  // of its dtype, float arrays 4-byte and bf16 ones 2-byte aligned, none
  // overlapping.
  virtual void Update(const float* grad, const ParamRun& run,
                      const UpdateHyperParams& hparams) const = 0;
};

// The kernel for config.kind. REQUIRES: ValidateOptimizerConfig(config).ok().
// The config's betas, eps, momentum, dampening, nesterov, lr decay and slot
// dtypes are fixed for the kernel's life; lr and weight_decay come with each
// Update.
std::unique_ptr<OptimizerKernel> MakeOptimizerKernel(
    const OptimizerConfig& config);

// Gives the state slots of a freshly allocated run their values before the
// first update (OptimizerSlotInitialValue, rounded to fp32 and then to the
// slot's dtype): Adagrad's state_sum gets initial_accumulator_value. Slots
// whose initial value is 0 are not written, so freshly mapped zero pages stay
// uncommitted. run.master is not touched.
// REQUIRES: every used slot of `run` holds run.n zero elements.
void InitOptimizerSlots(const OptimizerConfig& config, const ParamRun& run);

}  // namespace depot

#endif  // DEPOT_SERVER_OPTIMIZER_OPTIMIZER_KERNEL_H_
