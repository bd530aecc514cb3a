// The server's update path as it was before the fused kernel, kept as the
// reference the fused kernel must match bit for bit: SumGradients (each
// worker's part converted to fp32 and added in rank order, then the unscale
// multiply), ScaleGradient by the clip coefficient, one scalar loop per
// optimizer, and ConvertFromFloat of the master weights. Several passes, but
// obviously the arithmetic the documentation states.
#ifndef DEPOT_SERVER_TESTS_UNFUSED_REFERENCE_H_
#define DEPOT_SERVER_TESTS_UNFUSED_REFERENCE_H_

#include <cstddef>
#include <vector>

#include "depot/dtype.h"
#include "depot/job_config.h"
#include "server/optimizer/optimizer_kernel.h"

namespace depot::testing {

struct UnfusedGradient {
  DType dtype = DType::kFloat32;
  std::vector<const void*> parts;  // each run.n elements of dtype
  float unscale_factor = 1.0f;     // applied unless 1 (SumGradients' rule)
  double clip_coef = 1.0;          // applied when < 1 (RunUpdate's rule)
};

// Updates `run` from `grad` with `config`'s optimizer and, when weights is not
// null, writes the new master weights to it as weight_dtype.
void UnfusedUpdate(const OptimizerConfig& config, const UnfusedGradient& grad,
                   const ParamRun& run, const UpdateHyperParams& hparams,
                   DType weight_dtype, void* weights);

}  // namespace depot::testing

#endif  // DEPOT_SERVER_TESTS_UNFUSED_REFERENCE_H_
