// The fused update's internal interface: what an optimizer kernel hands to the
// instruction-set-specific code (fused_update_<isa>.cc), as plain data. Not
// for use outside server/optimizer; OptimizerKernel is the public face.
//
// One call makes one pass over a run of n parameters, element block by
// element block:
//   g = convert(grad_0[i]) + convert(grad_1[i]) + ...  (rank order, fp32)
//   if unscale: g = g * unscale_factor;  if clip: g = g * clip_coef
//   if maximize: g = -g
//   the optimizer's update of master[i] and the slots (optimizer_math.h)
//   weights[i] = master[i] converted to weight_dtype     (if weights is set)
// The staging of a block (the summed gradient) lives in L1, so main memory
// sees each stream once.
#ifndef DEPOT_SERVER_OPTIMIZER_FUSED_UPDATE_H_
#define DEPOT_SERVER_OPTIMIZER_FUSED_UPDATE_H_

#include <cstddef>

#include "depot/dtype.h"
#include "depot/job_config.h"
#include "server/optimizer/gradient_input.h"
#include "server/optimizer/kernel_isa.h"

namespace depot::fused {

// The per-call scalars of each optimizer, derived in double and rounded to
// float once, as torch's fp32 tensor ops round their Python-float scalars.
struct AdamScalars {
  float beta1 = 0;
  float one_minus_beta1 = 0;
  float beta2 = 0;
  float one_minus_beta2 = 0;
  float weight_decay = 0;           // Adam: the L2 coefficient
  float decay_factor = 1;           // AdamW: 1 - lr * weight_decay
  float step_size = 0;              // lr / (1 - beta1^step)
  float bias_correction2_sqrt = 1;  // sqrt(1 - beta2^step)
  float eps = 0;
};

struct SgdScalars {
  float weight_decay = 0;
  float momentum = 0;
  float one_minus_dampening = 1;
  float neg_lr = 0;
};

struct AdagradScalars {
  float weight_decay = 0;
  float clr = 0;  // lr / (1 + (step - 1) * lr_decay)
  float eps = 0;
};

struct LionScalars {
  float beta1 = 0;
  float one_minus_beta1 = 0;
  float beta2 = 0;
  float one_minus_beta2 = 0;
  float decay_factor = 1;  // 1 - lr * weight_decay
  float lr = 0;
};

// Which update to run, with its compile-time variants as flags (each
// combination is its own loop, with no branch inside) and its scalars.
struct OptimizerStep {
  OptimizerKind kind = OptimizerKind::kAdamW;
  bool has_weight_decay = false;
  bool decoupled = false;   // Adam: AdamW's decoupled weight decay
  bool momentum = false;    // SGD
  bool first_step = false;  // SGD with momentum: the buffer is a copy of g
  bool nesterov = false;    // SGD with momentum
  bool amsgrad = false;     // Adam: slot 2 keeps the maximum of exp_avg_sq
  // Every kind: the update ascends, from the negated gradient (torch's
  // maximize). The gradient stage negates it, so the math never sees the flag.
  bool maximize = false;
  // The state slots' storage dtypes (fp32 or bf16); unused slots: fp32. As
  // many as ParamRun::slots (optimizer_kernel.cc checks).
  DType slot_dtypes[3] = {DType::kFloat32, DType::kFloat32, DType::kFloat32};
  AdamScalars adam;
  SgdScalars sgd;
  AdagradScalars adagrad;
  LionScalars lion;
};

struct FusedCall {
  GradientInput grad;
  OptimizerStep step;
  float* master = nullptr;
  void* slots[3] = {nullptr, nullptr, nullptr};
  size_t n = 0;
  DType weight_dtype = DType::kFloat32;
  void* weights = nullptr;  // n elements of weight_dtype; null: none
};

// The entry points of one instruction set (fused_update_<isa>.cc).
struct IsaKernels {
  // The fused update (see the file comment).
  void (*update)(const FusedCall& call);
  // The gradient stage alone: out[0, n) = the gradient of `grad`, never
  // negated (what the step's statistics need, whatever the optimizer).
  void (*sum)(const GradientInput& grad, float* out, size_t n);
  // The weights stage alone: out[0, n) = master[0, n) as `dtype`.
  void (*encode)(const float* master, DType dtype, void* out, size_t n);
};

const IsaKernels& ScalarKernels();
const IsaKernels& Avx2Kernels();
const IsaKernels& Avx512Kernels();
const IsaKernels& Avx512Bf16Kernels();

// The kernels of `isa`. REQUIRES: CpuSupportsKernelIsa(isa).
const IsaKernels& KernelsFor(KernelIsa isa);

}  // namespace depot::fused

#endif  // DEPOT_SERVER_OPTIMIZER_FUSED_UPDATE_H_
