// The launchers of the kernels in kernels_*.cu, for kernels.cc, which checks
// the arguments of the public calls (kernels.h) and turns the CUDA errors
// these return into absl::Status. Internal: the arguments are trusted.
#ifndef DEPOT_CLIENT_SRC_GPU_KERNEL_LAUNCH_H_
#define DEPOT_CLIENT_SRC_GPU_KERNEL_LAUNCH_H_

#include <cstddef>

#include "cuda_runtime_api.h"
#include "depot/dtype.h"
#include "gpu/element_update.h"
#include "gpu/kernels.h"
#include "server/optimizer/fused_update.h"

namespace depot::gpu::internal {

// GradientCheck (kernels.h); n > 0.
cudaError_t LaunchGradientCheck(const DeviceGradientRange& grad,
                                void* workspace, GradientCheckResult* result,
                                cudaStream_t stream);

// CastFromFloat and CastToFloat (kernels.h); n > 0.
cudaError_t LaunchCastFromFloat(const float* src, DType dtype, void* dst,
                                size_t n, cudaStream_t stream);
cudaError_t LaunchCastToFloat(DType dtype, const void* src, float* dst,
                              size_t n, cudaStream_t stream);

// The fused update of n > 0 elements with the variant and scalars of `step`
// (OptimizerKernel::PrepareStep); args.grad.negate is step.maximize.
cudaError_t LaunchFusedUpdate(const fused::OptimizerStep& step,
                              const UpdateArgs& args, size_t n,
                              cudaStream_t stream);

// Blocks for an element-wise kernel over n elements, each thread looping
// over the grid (the grid is capped, the loop is not).
inline unsigned ElementwiseBlocks(size_t n, unsigned threads) {
  constexpr size_t kMaxBlocks = 65536;
  const size_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

}  // namespace depot::gpu::internal

#endif  // DEPOT_CLIENT_SRC_GPU_KERNEL_LAUNCH_H_
