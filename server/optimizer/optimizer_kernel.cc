#include "server/optimizer/optimizer_kernel.h"

#include <algorithm>
#include <cstdint>
#include <iterator>

#include "depot/dtype.h"
#include "server/optimizer/adagrad_kernel.h"
#include "server/optimizer/adam_kernel.h"
#include "server/optimizer/fused_update.h"
#include "server/optimizer/lion_kernel.h"
#include "server/optimizer/sgd_kernel.h"
#include "server/optimizer/slot_storage.h"

namespace depot {
namespace fused {

// The slot arrays of the public and the internal interface agree.
static_assert(std::size(ParamRun{}.slots) == kMaxStateSlots);
static_assert(std::size(FusedCall{}.slots) == kMaxStateSlots);
static_assert(std::size(OptimizerStep{}.slot_dtypes) == kMaxStateSlots);
static_assert(std::size(SlotFormat{}.dtypes) == kMaxStateSlots);

const IsaKernels& KernelsFor(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kScalar:
      break;
    case KernelIsa::kAvx2:
      return Avx2Kernels();
    case KernelIsa::kAvx512:
      return Avx512Kernels();
    case KernelIsa::kAvx512Bf16:
      return Avx512Bf16Kernels();
  }
  return ScalarKernels();
}

}  // namespace fused

void OptimizerKernel::FusedUpdate(const GradientInput& grad,
                                  const ParamRun& run,
                                  const UpdateHyperParams& hparams,
                                  const WeightsOutput& weights,
                                  KernelIsa isa) const {
  if (run.n == 0) return;
  fused::FusedCall call;
  call.grad = grad;
  call.step = Prepare(hparams);
  call.master = run.master;
  std::copy(std::begin(run.slots), std::end(run.slots), call.slots);
  call.n = run.n;
  call.weight_dtype = weights.dtype;
  call.weights = weights.data;
  fused::KernelsFor(isa).update(call);
}

void OptimizerKernel::Update(const float* grad, const ParamRun& run,
                             const UpdateHyperParams& hparams,
                             KernelIsa isa) const {
  const void* parts[1] = {grad};
  GradientInput input;
  input.parts = parts;
  input.num_parts = 1;
  FusedUpdate(input, run, hparams, WeightsOutput(), isa);
}

fused::OptimizerStep OptimizerKernel::PrepareStep(
    const UpdateHyperParams& hparams) const {
  return Prepare(hparams);
}

void SumGradientInput(const GradientInput& grad, float* out, size_t n,
                      KernelIsa isa) {
  if (n == 0) return;
  fused::KernelsFor(isa).sum(grad, out, n);
}

void EncodeWeights(const float* master, size_t n, const WeightsOutput& weights,
                   KernelIsa isa) {
  if (n == 0) return;
  fused::KernelsFor(isa).encode(master, weights.dtype, weights.data, n);
}

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
