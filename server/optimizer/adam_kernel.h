// Adam and AdamW (torch.optim, 1.13 single-tensor path). See
// docs/optimizers.md.
#ifndef DEPOT_SERVER_OPTIMIZER_ADAM_KERNEL_H_
#define DEPOT_SERVER_OPTIMIZER_ADAM_KERNEL_H_

#include <memory>

#include "server/optimizer/optimizer_kernel.h"

namespace depot {

// REQUIRES: config.kind is kAdam or kAdamW, and
// ValidateOptimizerConfig(config).ok(). kAdam adds weight_decay * param to the
// gradient (L2); kAdamW scales the param by (1 - lr * weight_decay) before the
// update (decoupled). With config.amsgrad the run has a third slot,
// max_exp_avg_sq, and the denominator uses its running maximum.
std::unique_ptr<OptimizerKernel> MakeAdamKernel(const OptimizerConfig& config);

}  // namespace depot

#endif  // DEPOT_SERVER_OPTIMIZER_ADAM_KERNEL_H_
