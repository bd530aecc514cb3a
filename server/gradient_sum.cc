#include "server/gradient_sum.h"

#include "absl/container/inlined_vector.h"
#include "server/optimizer/optimizer_kernel.h"

namespace depot {

void SumGradients(DType dtype, const std::vector<std::string>& payloads,
                  float* sum, size_t n, float scale) {
  absl::InlinedVector<const void*, 8> parts;
  for (const std::string& payload : payloads) parts.push_back(payload.data());
  GradientInput grad;
  grad.dtype = dtype;
  grad.parts = parts.data();
  grad.num_parts = parts.size();
  grad.unscale = scale != 1.0f;
  grad.unscale_factor = scale;
  // The fused kernel's gradient stage: the same arithmetic as the one-phase
  // update's, so a two-phase step sums exactly as a one-phase step would.
  SumGradientInput(grad, sum, n);
}

}  // namespace depot
