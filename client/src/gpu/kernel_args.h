// The argument checks of the GPU kernels (kernels.h) and the translation of a
// fused update's arguments into what its kernel reads (UpdateArgs). Plain
// C++, built with or without CUDA, so that host tests run exactly what the
// kernels' launchers run.
#ifndef DEPOT_CLIENT_SRC_GPU_KERNEL_ARGS_H_
#define DEPOT_CLIENT_SRC_GPU_KERNEL_ARGS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "depot/dtype.h"
#include "depot/job_config.h"
#include "gpu/element_update.h"
#include "server/optimizer/fused_update.h"
#include "server/optimizer/gradient_input.h"
#include "server/optimizer/optimizer_kernel.h"

namespace depot::gpu {

// OK for fp32, bf16 and fp16; INVALID_ARGUMENT naming `what` otherwise.
absl::Status CheckKernelDType(DType dtype, absl::string_view what);

// OK for a pointer that is not null and is a multiple of `alignment`;
// INVALID_ARGUMENT naming `what` otherwise. REQUIRES: alignment > 0 (check a
// dtype before passing its DTypeSize).
absl::Status CheckKernelArray(const void* data, size_t alignment,
                              absl::string_view what);

// What the fused update's kernel reads for OptimizerKernel::FusedUpdate's
// arguments, with `step` = the config's kernel's PrepareStep: the gradient
// parts with the offset applied, the flags, the slots the config keeps with
// their dtypes, the weights. INVALID_ARGUMENT for a part count outside
// [1, kMaxGradientParts], an invalid dtype, or a null or misaligned array the
// update would use. REQUIRES: run.n > 0; ValidateOptimizerConfig(config).ok().
absl::StatusOr<UpdateArgs> MakeUpdateArgs(const OptimizerConfig& config,
                                          const fused::OptimizerStep& step,
                                          const GradientInput& grad,
                                          const ParamRun& run,
                                          const WeightsOutput& weights);

}  // namespace depot::gpu

#endif  // DEPOT_CLIENT_SRC_GPU_KERNEL_ARGS_H_
