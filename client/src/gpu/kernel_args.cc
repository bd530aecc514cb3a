#include "gpu/kernel_args.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace depot::gpu {

absl::Status CheckKernelDType(DType dtype, absl::string_view what) {
  if (dtype == DType::kFloat32 || dtype == DType::kBFloat16 ||
      dtype == DType::kFloat16) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, " has an invalid dtype (", static_cast<int>(dtype), ")"));
}

absl::Status CheckKernelArray(const void* data, size_t alignment,
                              absl::string_view what) {
  if (data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is null"));
  }
  if (reinterpret_cast<uintptr_t>(data) % alignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is not aligned to ", alignment, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<UpdateArgs> MakeUpdateArgs(const OptimizerConfig& config,
                                          const fused::OptimizerStep& step,
                                          const GradientInput& grad,
                                          const ParamRun& run,
                                          const WeightsOutput& weights) {
  UpdateArgs args;
  if (absl::Status s = CheckKernelDType(grad.dtype, "the gradient"); !s.ok()) {
    return s;
  }
  if (grad.parts == nullptr || grad.num_parts < 1 ||
      grad.num_parts > static_cast<size_t>(kMaxGradientParts)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the gradient has ", grad.num_parts, " parts",
        grad.parts == nullptr ? " and no part array" : "",
        "; a fused update on the GPU sums 1 to ", kMaxGradientParts));
  }
  const size_t grad_size = DTypeSize(grad.dtype);
  args.grad.dtype = grad.dtype;
  args.grad.num_parts = static_cast<int>(grad.num_parts);
  for (size_t w = 0; w < grad.num_parts; ++w) {
    if (absl::Status s = CheckKernelArray(grad.parts[w], grad_size,
                                          absl::StrCat("gradient part ", w));
        !s.ok()) {
      return s;
    }
    args.grad.parts[w] =
        static_cast<const char*>(grad.parts[w]) + grad.offset * grad_size;
  }
  args.grad.unscale = grad.unscale;
  args.grad.unscale_factor = grad.unscale_factor;
  args.grad.clip = grad.clip;
  args.grad.clip_coef = grad.clip_coef;
  args.grad.negate = step.maximize;
  if (absl::Status s =
          CheckKernelArray(run.master, sizeof(float), "the master weights");
      !s.ok()) {
    return s;
  }
  args.master = run.master;
  for (int k = 0; k < OptimizerStateSlots(config); ++k) {
    if (absl::Status s =
            CheckKernelArray(run.slots[k], DTypeSize(step.slot_dtypes[k]),
                             absl::StrCat("state slot ", k));
        !s.ok()) {
      return s;
    }
    args.slots[k] = run.slots[k];
    args.slot_dtypes[k] = step.slot_dtypes[k];
  }
  if (weights.data != nullptr) {
    if (absl::Status s = CheckKernelDType(weights.dtype, "the weights");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckKernelArray(
            weights.data, DTypeSize(weights.dtype), "the weights");
        !s.ok()) {
      return s;
    }
    args.weights = weights.data;
    args.weight_dtype = weights.dtype;
  }
  return args;
}

}  // namespace depot::gpu
