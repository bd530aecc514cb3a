// The gradient statistics and the casts of kernels.h, on the device.
#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "gpu/device_ops.h"
#include "gpu/element_update.h"
#include "gpu/kernel_launch.h"

namespace depot::gpu::internal {
namespace {

using Elements = ElementFunctions<CudaOps>;

constexpr int kThreads = kGradientCheckThreads;
constexpr int kPerThread = kGradientCheckTile / kGradientCheckThreads;
static_assert(kGradientCheckTile % kGradientCheckThreads == 0);
static_assert((kThreads & (kThreads - 1)) == 0, "the tree halves kThreads");

// Adds the block's kThreads values pairwise: t and t + half, halving until
// sum[0] holds the total (a fixed tree, whatever the data). Also ors the
// flags. REQUIRES: called by every thread of the block.
__device__ void BlockTree(double* sum, uint32_t* flag) {
  const int t = threadIdx.x;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (t < half) {
      sum[t] = __dadd_rn(sum[t], sum[t + half]);
      flag[t] |= flag[t + half];
    }
    __syncthreads();
  }
}

// Block b: the sum of squares and the non-finite flag of tile b.
__global__ void TileSums(DeviceGradientRange grad, double* tile_sums,
                         uint32_t* tile_flags) {
  __shared__ double sum[kThreads];
  __shared__ uint32_t flag[kThreads];
  const size_t first =
      static_cast<size_t>(blockIdx.x) * kGradientCheckTile + threadIdx.x;
  double acc = 0.0;
  uint32_t non_finite = 0;
  for (int k = 0; k < kPerThread; ++k) {
    const size_t i = first + static_cast<size_t>(k) * kThreads;
    if (i >= grad.n) break;
    float g = Elements::Load(grad.dtype, grad.device_data, i);
    if (grad.unscale) g = CudaOps::Mul(g, grad.unscale_factor);
    // Exact square (24 + 24 bits < 53), then one rounding in the add.
    acc = __dadd_rn(acc, __dmul_rn(g, g));
    non_finite |= !(fabsf(g) <= FLT_MAX);
  }
  sum[threadIdx.x] = acc;
  flag[threadIdx.x] = non_finite;
  BlockTree(sum, flag);
  if (threadIdx.x == 0) {
    tile_sums[blockIdx.x] = sum[0];
    tile_flags[blockIdx.x] = flag[0];
  }
}

// One block: the tiles' sums, thread t adding tiles t, t + kThreads, ... in
// order, then the same tree.
__global__ void CombineTiles(const double* tile_sums,
                             const uint32_t* tile_flags, size_t tiles,
                             GradientCheckResult* result) {
  __shared__ double sum[kThreads];
  __shared__ uint32_t flag[kThreads];
  double acc = 0.0;
  uint32_t non_finite = 0;
  for (size_t j = threadIdx.x; j < tiles; j += kThreads) {
    acc = __dadd_rn(acc, tile_sums[j]);
    non_finite |= tile_flags[j];
  }
  sum[threadIdx.x] = acc;
  flag[threadIdx.x] = non_finite;
  BlockTree(sum, flag);
  if (threadIdx.x == 0) {
    result->sum_squares = sum[0];
    result->non_finite = flag[0];
  }
}

__global__ void CastFromFloatKernel(const float* src, DType dtype, void* dst,
                                    size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    Elements::Store(dtype, dst, i, src[i]);
  }
}

__global__ void CastToFloatKernel(DType dtype, const void* src, float* dst,
                                  size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
       i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = Elements::Load(dtype, src, i);
  }
}

constexpr unsigned kCastThreads = 256;

}  // namespace

cudaError_t LaunchGradientCheck(const DeviceGradientRange& grad,
                                void* workspace, GradientCheckResult* result,
                                cudaStream_t stream) {
  const size_t tiles = (grad.n + kGradientCheckTile - 1) / kGradientCheckTile;
  auto* tile_sums = static_cast<double*>(workspace);
  auto* tile_flags = reinterpret_cast<uint32_t*>(tile_sums + tiles);
  TileSums<<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(
      grad, tile_sums, tile_flags);
  if (cudaError_t error = cudaGetLastError(); error != cudaSuccess) {
    return error;
  }
  CombineTiles<<<1, kThreads, 0, stream>>>(tile_sums, tile_flags, tiles,
                                           result);
  return cudaGetLastError();
}

cudaError_t LaunchCastFromFloat(const float* src, DType dtype, void* dst,
                                size_t n, cudaStream_t stream) {
  CastFromFloatKernel<<<ElementwiseBlocks(n, kCastThreads), kCastThreads, 0,
                        stream>>>(src, dtype, dst, n);
  return cudaGetLastError();
}

cudaError_t LaunchCastToFloat(DType dtype, const void* src, float* dst,
                              size_t n, cudaStream_t stream) {
  CastToFloatKernel<<<ElementwiseBlocks(n, kCastThreads), kCastThreads, 0,
                      stream>>>(dtype, src, dst, n);
  return cudaGetLastError();
}

}  // namespace depot::gpu::internal
