// DeviceOptimizer: the optimizer update of a run of parameters whose state
// lives in a Device's memory, queued on one of its streams. The transfer
// engine runs it for the tensors an offload fraction keeps on the GPU
// (docs/gpu.md, "Offload fraction"). Its contract is
// OptimizerKernel::FusedUpdate's (server/optimizer/optimizer_kernel.h), so
// the result is the server's bit for bit (NaNs aside on a GPU: kernels.h):
//  - MakeCudaDeviceOptimizer runs the CUDA kernels (gpu/kernels.h);
//  - MakeHostDeviceOptimizer runs the server's own kernel on the host, in
//    stream order (HostDevice, where device memory is host memory), so that
//    the engine's use of it is tested without a GPU.
#ifndef DEPOT_CLIENT_SRC_GPU_DEVICE_OPTIMIZER_H_
#define DEPOT_CLIENT_SRC_GPU_DEVICE_OPTIMIZER_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "depot/job_config.h"
#include "gpu/device.h"
#include "server/optimizer/optimizer_kernel.h"

namespace depot::gpu {

class DeviceOptimizer {
 public:
  virtual ~DeviceOptimizer() = default;
  // Queues on `stream` the update of run.n elements of param group
  // `param_group` (its optimizer config); grad.parts is a host array of
  // device pointers, read at the call. INVALID_ARGUMENT: a group the job
  // does not have, or arguments the kernel rejects.
  virtual absl::Status Update(uint32_t param_group, const GradientInput& grad,
                              const ParamRun& run,
                              const UpdateHyperParams& hparams,
                              const WeightsOutput& weights, Stream& stream) = 0;
  // Queues on `stream` weights = master[0, n) converted to weights.dtype, as
  // the update writes them (for a kept tensor that is not updated this step).
  virtual absl::Status WriteWeights(const float* master, size_t n,
                                    const WeightsOutput& weights,
                                    Stream& stream) = 0;
};

// 1 + the largest param group of config's tensors.
uint32_t ParamGroupCount(const JobConfig& config);

// INVALID_ARGUMENT unless param_group < groups.
absl::Status CheckParamGroup(uint32_t param_group, size_t groups);

// The server's kernels, one per param group of `config`, run by host
// functions on `device`'s streams. `device` must outlive it.
absl::StatusOr<std::unique_ptr<DeviceOptimizer>> MakeHostDeviceOptimizer(
    const JobConfig& config, Device& device);

#if defined(DEPOT_HAVE_CUDA)
// The CUDA kernels, one per param group; streams are CudaDevice's.
absl::StatusOr<std::unique_ptr<DeviceOptimizer>> MakeCudaDeviceOptimizer(
    const JobConfig& config);
#endif

}  // namespace depot::gpu

#endif  // DEPOT_CLIENT_SRC_GPU_DEVICE_OPTIMIZER_H_
