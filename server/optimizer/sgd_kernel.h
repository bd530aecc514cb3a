// SGD with momentum, dampening and Nesterov (torch.optim, 1.13 single-tensor
// path). See docs/optimizers.md.
#ifndef DEPOT_SERVER_OPTIMIZER_SGD_KERNEL_H_
#define DEPOT_SERVER_OPTIMIZER_SGD_KERNEL_H_

#include <memory>

#include "server/optimizer/optimizer_kernel.h"

namespace depot {

// REQUIRES: config.kind is kSgd, and ValidateOptimizerConfig(config).ok().
// Uses slot 0 (momentum_buffer) only when config.sgd_momentum > 0.
std::unique_ptr<OptimizerKernel> MakeSgdKernel(const OptimizerConfig& config);

}  // namespace depot

#endif  // DEPOT_SERVER_OPTIMIZER_SGD_KERNEL_H_
