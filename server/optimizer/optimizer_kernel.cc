#include "server/optimizer/optimizer_kernel.h"

#include "server/optimizer/adam_kernel.h"
#include "server/optimizer/sgd_kernel.h"

namespace depot {

std::unique_ptr<OptimizerKernel> MakeOptimizerKernel(
    const OptimizerConfig& config) {
  switch (config.kind) {
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdam:
      return MakeAdamKernel(config);
    case OptimizerKind::kSgd:
      return MakeSgdKernel(config);
  }
  // Unreachable for a validated config (see the REQUIRES).
  return nullptr;
}

}  // namespace depot
