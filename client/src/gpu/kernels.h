// The GPU kernels of a worker (issue 11; docs/gpu.md, "GPU kernels"): the
// statistics of a gradient shard, casts between fp32 and the 2-byte dtypes,
// and the fused optimizer update of the part of the model kept on the GPU.
// Built only with CUDA (DEPOT_HAVE_CUDA); this header has no CUDA types.
//
// Every call queues its work on `stream`, a cudaStream_t passed as void*
// (nullptr: the legacy default stream), and returns without waiting for it.
// Pointers named device_* are device memory (or memory the device can
// address). A call checks its arguments and the launch; an error of the
// kernel itself shows up at the stream's next synchronisation. Errors:
// INVALID_ARGUMENT for bad arguments (nothing is queued), UNAVAILABLE when
// there is no usable CUDA device, INTERNAL for another launch failure.
//
// The update and the casts give the server's bits (server/optimizer): the
// same element math source, IEEE fp32 operations in the same order, the same
// roundings. A NaN result is a NaN on both, but its payload may differ.
#ifndef DEPOT_CLIENT_SRC_GPU_KERNELS_H_
#define DEPOT_CLIENT_SRC_GPU_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "depot/dtype.h"
#include "depot/job_config.h"
#include "server/optimizer/gradient_input.h"
#include "server/optimizer/optimizer_kernel.h"

namespace depot::gpu {

// ---- Gradient statistics -------------------------------------------------

// A gradient range on the device: n elements of dtype; each is widened to
// fp32 and, if `unscale`, multiplied by unscale_factor in fp32 (as the
// server's gradient stage does) before it is counted.
struct DeviceGradientRange {
  DType dtype = DType::kFloat32;
  const void* device_data = nullptr;
  size_t n = 0;
  bool unscale = false;
  float unscale_factor = 1.0f;
};

// What GradientCheck writes, in device memory.
struct GradientCheckResult {
  // Sum of g * g in double (each square of an fp32 value is exact), in the
  // fixed order documented at GradientCheck.
  double sum_squares = 0.0;
  // 1 if some g is NaN or +-Inf, else 0.
  uint32_t non_finite = 0;
};

// The scratch device memory GradientCheck needs for n elements.
size_t GradientCheckWorkspaceBytes(size_t n);

// The shape of GradientCheck's sum: threads per tile, elements per tile.
inline constexpr int kGradientCheckThreads = 256;
inline constexpr int kGradientCheckTile = kGradientCheckThreads * 16;

// Writes the sum of squares and the non-finite flag of `grad` to
// *device_result. The order of the sum depends only on grad.n, so the result
// is the same bits on every run and every GPU: the range is cut into tiles of
// kGradientCheckTile elements; in tile b, thread t of kGradientCheckThreads
// adds the squares of elements b * tile + t + k * threads, k = 0, 1, ...,
// in order, and the threads' sums are added pairwise (thread t and
// t + threads/2, halving until one is left); the tiles' sums are then
// combined the same way, thread t of one block adding tiles t,
// t + threads, ... in order before the pairwise tree. (This is not the
// server's GradStats order, which is sequential per chunk.)
// REQUIRES: device_workspace holds GradientCheckWorkspaceBytes(grad.n) bytes
// (8-byte aligned) that no other queued work uses; device_result is 8-byte
// aligned. n == 0 writes zeros.
absl::Status GradientCheck(const DeviceGradientRange& grad,
                           void* device_workspace, size_t workspace_bytes,
                           GradientCheckResult* device_result, void* stream);

// ---- Casts -----------------------------------------------------------------

// device_dst[0, n) = device_src[0, n) rounded to `dtype` (ConvertFromFloat's
// bits: to nearest, ties to even; NaN kept a NaN by its bits).
// REQUIRES: dst holds n elements of dtype, aligned to their size; src and dst
// do not overlap.
absl::Status CastFromFloat(const float* device_src, DType dtype,
                           void* device_dst, size_t n, void* stream);

// device_dst[0, n) = device_src[0, n) of `dtype` widened to fp32 (exact;
// ConvertToFloat's bits). Same REQUIRES as CastFromFloat.
absl::Status CastToFloat(DType dtype, const void* device_src, float* device_dst,
                         size_t n, void* stream);

// ---- The fused optimizer update ---------------------------------------------

// The most gradient parts one FusedUpdate sums (element_update.h).
int MaxGradientParts();

// OptimizerKernel::FusedUpdate (server/optimizer/optimizer_kernel.h) on the
// GPU, for a job's optimizer config: the same contract and the same bits for
// the same inputs (the server's scalars, from the server's kernel, and its
// element math, optimizer_math.h, compiled for the device).
class GpuOptimizerKernel {
 public:
  // INVALID_ARGUMENT when ValidateOptimizerConfig(config) fails.
  static absl::StatusOr<std::unique_ptr<GpuOptimizerKernel>> Make(
      const OptimizerConfig& config);

  // Queues the update of run.n elements. grad.parts is a host array of
  // grad.num_parts (1 to MaxGradientParts()) device pointers; run.master,
  // run.slots and weights.data are device memory, laid out as
  // OptimizerKernel::FusedUpdate requires (slot k holds
  // OptimizerSlotDType(config, k) elements). INVALID_ARGUMENT for a null or
  // misaligned pointer the update would use, or a bad part count or dtype.
  absl::Status FusedUpdate(const GradientInput& grad, const ParamRun& run,
                           const UpdateHyperParams& hparams,
                           const WeightsOutput& weights, void* stream) const;

 private:
  GpuOptimizerKernel(const OptimizerConfig& config,
                     std::unique_ptr<OptimizerKernel> server_kernel);

  const OptimizerConfig config_;
  // The server's kernel, whose PrepareStep gives the update's scalars.
  const std::unique_ptr<OptimizerKernel> server_kernel_;
};

}  // namespace depot::gpu

#endif  // DEPOT_CLIENT_SRC_GPU_KERNELS_H_
