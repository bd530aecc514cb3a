#include "gpu/device_optimizer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace depot::gpu {
namespace {

class HostDeviceOptimizer : public DeviceOptimizer {
 public:
  HostDeviceOptimizer(Device& device,
                      std::vector<std::unique_ptr<OptimizerKernel>> kernels)
      : device_(device), kernels_(std::move(kernels)) {}

  absl::Status Update(uint32_t param_group, const GradientInput& grad,
                      const ParamRun& run, const UpdateHyperParams& hparams,
                      const WeightsOutput& weights, Stream& stream) override {
    if (absl::Status s = CheckParamGroup(param_group, kernels_.size());
        !s.ok()) {
      return s;
    }
    if (grad.parts == nullptr || grad.num_parts == 0 || grad.num_parts > 8) {
      return absl::InvalidArgumentError(
          "DeviceOptimizer: 1 to 8 gradient parts");
    }
    // The part pointers are read at the call, like the CUDA kernel's.
    std::vector<const void*> parts(grad.parts, grad.parts + grad.num_parts);
    const OptimizerKernel* kernel = kernels_[param_group].get();
    return device_.LaunchHostFunc(
        stream, [kernel, g = grad, parts = std::move(parts), run, hparams,
                 weights]() mutable {
          g.parts = parts.data();
          kernel->FusedUpdate(g, run, hparams, weights);
        });
  }

  absl::Status WriteWeights(const float* master, size_t n,
                            const WeightsOutput& weights,
                            Stream& stream) override {
    if (master == nullptr || weights.data == nullptr) {
      return absl::InvalidArgumentError("DeviceOptimizer: a null pointer");
    }
    return device_.LaunchHostFunc(stream, [master, n, weights] {
      EncodeWeights(master, n, weights);
    });
  }

 private:
  Device& device_;
  const std::vector<std::unique_ptr<OptimizerKernel>> kernels_;
};

}  // namespace

absl::Status CheckParamGroup(uint32_t param_group, size_t groups) {
  if (param_group < groups) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "DeviceOptimizer: param group ", param_group, " of ", groups));
}

uint32_t ParamGroupCount(const JobConfig& config) {
  uint32_t groups = 1;
  for (const TensorSpec& tensor : config.tensors) {
    groups = std::max(groups, tensor.param_group + 1);
  }
  return groups;
}

absl::StatusOr<std::unique_ptr<DeviceOptimizer>> MakeHostDeviceOptimizer(
    const JobConfig& config, Device& device) {
  if (absl::Status s = ValidateJobConfig(config); !s.ok()) return s;
  std::vector<std::unique_ptr<OptimizerKernel>> kernels;
  for (uint32_t g = 0; g < ParamGroupCount(config); ++g) {
    kernels.push_back(MakeOptimizerKernel(GroupOptimizer(config, g)));
  }
  return std::make_unique<HostDeviceOptimizer>(device, std::move(kernels));
}

}  // namespace depot::gpu
