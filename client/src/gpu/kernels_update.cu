// The fused optimizer update of kernels.h on the device: one thread per
// element, each running ElementFunctions<CudaOps>::Update with the server's
// element math (server/optimizer/optimizer_math.h). The update's variant
// (kind, weight decay, amsgrad, ...) picks the kernel (WithOptimizerMath), as
// it picks the loop in the server's fused_loops.h; dtypes and the gradient's
// flags are read at run time (uniform branches, which change no result).
#include <cstddef>

#include "gpu/device_ops.h"
#include "gpu/element_update.h"
#include "gpu/kernel_launch.h"

namespace depot::gpu::internal {
namespace {

template <class Math>
__global__ void FusedUpdateKernel(Math math, UpdateArgs args, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    ElementFunctions<CudaOps>::Update(math, args, i);
  }
}

}  // namespace

cudaError_t LaunchFusedUpdate(const fused::OptimizerStep& step,
                              const UpdateArgs& args, size_t n,
                              cudaStream_t stream) {
  return WithOptimizerMath<CudaOps, cudaError_t>(
      step, [&](const auto& math) -> cudaError_t {
        using Math = std::decay_t<decltype(math)>;
        constexpr unsigned kThreads = 256;
        FusedUpdateKernel<Math>
            <<<ElementwiseBlocks(n, kThreads), kThreads, 0, stream>>>(math,
                                                                      args, n);
        return cudaGetLastError();
      });
}

}  // namespace depot::gpu::internal
