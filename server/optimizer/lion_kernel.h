// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms",
// Algorithm 2), with decoupled weight decay. See docs/optimizers.md.
#ifndef DEPOT_SERVER_OPTIMIZER_LION_KERNEL_H_
#define DEPOT_SERVER_OPTIMIZER_LION_KERNEL_H_

#include <memory>

#include "server/optimizer/optimizer_kernel.h"

namespace depot {

// REQUIRES: config.kind is kLion, and ValidateOptimizerConfig(config).ok().
// Slot 0 is exp_avg. The update does not depend on the step count.
std::unique_ptr<OptimizerKernel> MakeLionKernel(const OptimizerConfig& config);

}  // namespace depot

#endif  // DEPOT_SERVER_OPTIMIZER_LION_KERNEL_H_
