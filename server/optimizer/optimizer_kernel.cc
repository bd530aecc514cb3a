#include "server/optimizer/optimizer_kernel.h"

#include <algorithm>
#include <cstdint>

#include "depot/dtype.h"
#include "server/optimizer/adagrad_kernel.h"
#include "server/optimizer/adam_kernel.h"
#include "server/optimizer/lion_kernel.h"
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
    case OptimizerKind::kAdagrad:
      return MakeAdagradKernel(config);
    case OptimizerKind::kLion:
      return MakeLionKernel(config);
  }
  // Unreachable for a validated config (see the REQUIRES).
  return nullptr;
}

void InitOptimizerSlots(const OptimizerConfig& config, const ParamRun& run) {
  for (int k = 0; k < OptimizerStateSlots(config); ++k) {
    const float value =
        static_cast<float>(OptimizerSlotInitialValue(config, k));
    if (value == 0.0f) continue;
    const DType dtype = OptimizerSlotDType(config, k);
    if (dtype == DType::kFloat32) {
      float* slot = static_cast<float*>(run.slots[k]);
      std::fill(slot, slot + run.n, value);
    } else {
      uint16_t encoded;
      ConvertFromFloat(&value, dtype, &encoded, 1);
      uint16_t* slot = static_cast<uint16_t*>(run.slots[k]);
      std::fill(slot, slot + run.n, encoded);
    }
  }
}

}  // namespace depot
