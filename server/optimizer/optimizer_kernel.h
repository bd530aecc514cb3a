// OptimizerKernel: the update of one contiguous run of parameters, all in one
// param group. FusedUpdate does the whole per-chunk work in one pass: the sum
// of the workers' gradients, unscaling, clipping, the update and the weights
// out; Update runs it on a gradient already summed, unscaled and clipped.
// Implementations follow torch.optim semantics exactly (Lion: its paper; see
// docs/optimizers.md); they work element by element, so any split of a shard
// into runs, any thread count and any instruction set (KernelIsa) gives the
// same bits.
#ifndef DEPOT_SERVER_OPTIMIZER_OPTIMIZER_KERNEL_H_
#define DEPOT_SERVER_OPTIMIZER_OPTIMIZER_KERNEL_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "depot/dtype.h"
#include "depot/job_config.h"
#include "server/optimizer/gradient_input.h"
#include "server/optimizer/kernel_isa.h"

namespace depot {

namespace fused {
struct OptimizerStep;
}  // namespace fused

// The hyperparameters of one update call.
struct UpdateHyperParams {
  double lr = 0.0;
  double weight_decay = 0.0;
  // The optimizer step count of these parameters after this update: 1 on the
  // first update (torch's state["step"] after its increment).
  uint64_t step = 1;
};

// The most state slots an optimizer keeps (Adam and AdamW with amsgrad).
inline constexpr int kMaxStateSlots = 3;

// The state of a run of n parameters: the fp32 master weights and the state
// slots. slots[k] is the k-th state array (Adam: 0 = exp_avg, 1 = exp_avg_sq,
// 2 = max_exp_avg_sq with amsgrad; SGD with momentum: 0 = momentum_buffer;
// Adagrad: 0 = state_sum; Lion: 0 = exp_avg), n elements of
// OptimizerSlotDType(config, k): `float` for fp32, the uint16_t bit pattern
// for bf16. Entries past OptimizerStateSlots(config) are unused.
struct ParamRun {
  float* master = nullptr;
  void* slots[kMaxStateSlots] = {nullptr, nullptr, nullptr};
  size_t n = 0;
};

// Where the updated weights go: run.n elements of `dtype` (rounded to
// nearest, ties to even, as ConvertFromFloat), or nowhere when data is null.
struct WeightsOutput {
  DType dtype = DType::kFloat32;
  void* data = nullptr;
};

class OptimizerKernel {
 public:
  virtual ~OptimizerKernel() = default;

  // Updates run.master and run.slots in place from the gradient `grad`, then
  // writes the new master weights to `weights`. bf16 slots are widened to
  // fp32, updated in fp32 and stored back rounded to nearest, ties to even;
  // the update of the weights uses the unrounded fp32 values. `isa` must be
  // one this CPU supports; every one gives the same bits.
  // REQUIRES: master holds run.n floats, every used slot run.n elements of its
  // dtype, each gradient part and the weights run.n elements of their dtype;
  // float arrays 4-byte and 2-byte ones 2-byte aligned; no two of the arrays
  // overlap (master and slots are updated in place).
  void FusedUpdate(const GradientInput& grad, const ParamRun& run,
                   const UpdateHyperParams& hparams,
                   const WeightsOutput& weights,
                   KernelIsa isa = ActiveKernelIsa()) const;

  // FusedUpdate from one fp32 gradient grad[0, run.n) used as it is (already
  // summed, unscaled and clipped), with no weights out.
  void Update(const float* grad, const ParamRun& run,
              const UpdateHyperParams& hparams,
              KernelIsa isa = ActiveKernelIsa()) const;

  // What FusedUpdate runs for these hyperparameters: the update's variant and
  // its scalars, derived in double and rounded to float once. For the other
  // implementations of the same update (the GPU kernels,
  // client/src/gpu/kernels.h), so that they use the server's scalars, not a
  // second derivation of them.
  fused::OptimizerStep PrepareStep(const UpdateHyperParams& hparams) const;

 protected:
  // What the kernel runs for these hyperparameters (fused_update.h).
  virtual fused::OptimizerStep Prepare(
      const UpdateHyperParams& hparams) const = 0;
};

// SumGradients' arithmetic without an update: out[i] = the gradient of `grad`
// (see GradientInput) for i in [0, n), with the fused kernel's instructions.
void SumGradientInput(const GradientInput& grad, float* out, size_t n,
                      KernelIsa isa = ActiveKernelIsa());

// ConvertFromFloat(master, weights.dtype, weights.data, n) (the same bits),
// with the fused kernel's instructions. REQUIRES: weights.data holds n
// elements.
void EncodeWeights(const float* master, size_t n, const WeightsOutput& weights,
                   KernelIsa isa = ActiveKernelIsa());

// The kernel for config.kind. REQUIRES: ValidateOptimizerConfig(config).ok().
// The config's betas, eps, momentum, dampening, nesterov, lr decay, amsgrad,
// maximize and slot dtypes are fixed for the kernel's life; lr and
// weight_decay come with each Update. With maximize, every kind (Lion too)
// updates from the negated gradient, as torch.optim's maximize does.
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
