#include "gpu/kernels.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cuda_runtime_api.h"
#include "gpu/kernel_args.h"
#include "gpu/kernel_launch.h"
#include "server/optimizer/fused_update.h"

namespace depot::gpu {
namespace {

// The status of a launch: UNAVAILABLE when there is no device to run on.
absl::Status LaunchStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string detail = absl::StrCat(cudaGetErrorName(error), " (",
                                          cudaGetErrorString(error), ")");
  switch (error) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorDevicesUnavailable:
      return absl::UnavailableError(
          absl::StrCat("no CUDA device: ", what, " says ", detail));
    default:
      return absl::InternalError(absl::StrCat(what, ": ", detail));
  }
}

// A cast's checks: the dtypes, then the arrays (not null, aligned).
absl::Status CheckCast(DType src_dtype, const void* src, DType dst_dtype,
                       const void* dst) {
  if (absl::Status s = CheckKernelDType(src_dtype, "the source"); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckKernelDType(dst_dtype, "the destination");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckKernelArray(src, DTypeSize(src_dtype), "the source");
      !s.ok()) {
    return s;
  }
  return CheckKernelArray(dst, DTypeSize(dst_dtype), "the destination");
}

cudaStream_t AsStream(void* stream) {
  return static_cast<cudaStream_t>(stream);
}

}  // namespace

size_t GradientCheckWorkspaceBytes(size_t n) {
  const size_t tiles = (n + kGradientCheckTile - 1) / kGradientCheckTile;
  return tiles * (sizeof(double) + sizeof(uint32_t));
}

absl::Status GradientCheck(const DeviceGradientRange& grad,
                           void* device_workspace, size_t workspace_bytes,
                           GradientCheckResult* device_result, void* stream) {
  if (absl::Status s = CheckKernelDType(grad.dtype, "the gradient"); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckKernelArray(
          device_result, alignof(GradientCheckResult), "the result");
      !s.ok()) {
    return s;
  }
  if (grad.n == 0) {
    return LaunchStatus(
        cudaMemsetAsync(device_result, 0, sizeof(GradientCheckResult),
                        AsStream(stream)),
        "cudaMemsetAsync");
  }
  if (absl::Status s = CheckKernelArray(grad.device_data, DTypeSize(grad.dtype),
                                        "the gradient");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckKernelArray(device_workspace, alignof(double), "the workspace");
      !s.ok()) {
    return s;
  }
  if (workspace_bytes < GradientCheckWorkspaceBytes(grad.n)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the workspace holds ", workspace_bytes, " bytes; ", grad.n,
        " elements need ", GradientCheckWorkspaceBytes(grad.n)));
  }
  return LaunchStatus(
      internal::LaunchGradientCheck(grad, device_workspace, device_result,
                                    AsStream(stream)),
      "the gradient check's launch");
}

absl::Status CastFromFloat(const float* device_src, DType dtype,
                           void* device_dst, size_t n, void* stream) {
  if (n == 0) return CheckKernelDType(dtype, "the destination");
  if (absl::Status s =
          CheckCast(DType::kFloat32, device_src, dtype, device_dst);
      !s.ok()) {
    return s;
  }
  return LaunchStatus(internal::LaunchCastFromFloat(
                          device_src, dtype, device_dst, n, AsStream(stream)),
                      "the cast's launch");
}

absl::Status CastToFloat(DType dtype, const void* device_src, float* device_dst,
                         size_t n, void* stream) {
  if (n == 0) return CheckKernelDType(dtype, "the source");
  if (absl::Status s =
          CheckCast(dtype, device_src, DType::kFloat32, device_dst);
      !s.ok()) {
    return s;
  }
  return LaunchStatus(internal::LaunchCastToFloat(dtype, device_src, device_dst,
                                                  n, AsStream(stream)),
                      "the cast's launch");
}

int MaxGradientParts() { return kMaxGradientParts; }

absl::StatusOr<std::unique_ptr<GpuOptimizerKernel>> GpuOptimizerKernel::Make(
    const OptimizerConfig& config) {
  if (absl::Status s = ValidateOptimizerConfig(config); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid optimizer config: ", s.message()));
  }
  return std::unique_ptr<GpuOptimizerKernel>(
      new GpuOptimizerKernel(config, MakeOptimizerKernel(config)));
}

GpuOptimizerKernel::GpuOptimizerKernel(
    const OptimizerConfig& config,
    std::unique_ptr<OptimizerKernel> server_kernel)
    : config_(config), server_kernel_(std::move(server_kernel)) {}

absl::Status GpuOptimizerKernel::FusedUpdate(const GradientInput& grad,
                                             const ParamRun& run,
                                             const UpdateHyperParams& hparams,
                                             const WeightsOutput& weights,
                                             void* stream) const {
  if (run.n == 0) return absl::OkStatus();
  const fused::OptimizerStep step = server_kernel_->PrepareStep(hparams);
  absl::StatusOr<UpdateArgs> args =
      MakeUpdateArgs(config_, step, grad, run, weights);
  if (!args.ok()) return args.status();
  return LaunchStatus(
      internal::LaunchFusedUpdate(step, *args, run.n, AsStream(stream)),
      "the fused update's launch");
}

}  // namespace depot::gpu
