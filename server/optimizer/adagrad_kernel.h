// Adagrad (torch.optim, 1.13 single-tensor path, dense gradients). See
// docs/optimizers.md.
#ifndef DEPOT_SERVER_OPTIMIZER_ADAGRAD_KERNEL_H_
#define DEPOT_SERVER_OPTIMIZER_ADAGRAD_KERNEL_H_

#include <memory>

#include "server/optimizer/optimizer_kernel.h"

namespace depot {

// REQUIRES: config.kind is kAdagrad, and ValidateOptimizerConfig(config).ok().
// Slot 0 is state_sum, which must start at the config's
// adagrad_initial_accumulator_value (InitOptimizerSlots). Weight decay is L2
// (added to the gradient), as in torch.
std::unique_ptr<OptimizerKernel> MakeAdagradKernel(
    const OptimizerConfig& config);

}  // namespace depot

#endif  // DEPOT_SERVER_OPTIMIZER_ADAGRAD_KERNEL_H_
