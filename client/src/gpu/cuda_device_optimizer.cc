// MakeCudaDeviceOptimizer: DeviceOptimizer over the CUDA kernels.
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu/cuda_device.h"
#include "gpu/device_optimizer.h"
#include "gpu/kernels.h"

namespace depot::gpu {
namespace {

class CudaDeviceOptimizer : public DeviceOptimizer {
 public:
  explicit CudaDeviceOptimizer(
      std::vector<std::unique_ptr<GpuOptimizerKernel>> kernels)
      : kernels_(std::move(kernels)) {}

  absl::Status Update(uint32_t param_group, const GradientInput& grad,
                      const ParamRun& run, const UpdateHyperParams& hparams,
                      const WeightsOutput& weights, Stream& stream) override {
    if (absl::Status s = CheckParamGroup(param_group, kernels_.size());
        !s.ok()) {
      return s;
    }
    absl::StatusOr<void*> handle = CudaStreamHandle(stream);
    if (!handle.ok()) return handle.status();
    return kernels_[param_group]->FusedUpdate(grad, run, hparams, weights,
                                              *handle);
  }

  absl::Status WriteWeights(const float* master, size_t n,
                            const WeightsOutput& weights,
                            Stream& stream) override {
    absl::StatusOr<void*> handle = CudaStreamHandle(stream);
    if (!handle.ok()) return handle.status();
    return CastFromFloat(master, weights.dtype, weights.data, n, *handle);
  }

 private:
  const std::vector<std::unique_ptr<GpuOptimizerKernel>> kernels_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceOptimizer>> MakeCudaDeviceOptimizer(
    const JobConfig& config) {
  if (absl::Status s = ValidateJobConfig(config); !s.ok()) return s;
  const uint32_t groups = ParamGroupCount(config);
  std::vector<std::unique_ptr<GpuOptimizerKernel>> kernels;
  for (uint32_t g = 0; g < groups; ++g) {
    absl::StatusOr<std::unique_ptr<GpuOptimizerKernel>> kernel =
        GpuOptimizerKernel::Make(GroupOptimizer(config, g));
    if (!kernel.ok()) return kernel.status();
    kernels.push_back(*std::move(kernel));
  }
  return std::make_unique<CudaDeviceOptimizer>(std::move(kernels));
}

}  // namespace depot::gpu
