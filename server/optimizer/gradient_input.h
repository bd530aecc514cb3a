// GradientInput: a run's gradient as the workers' contributions arrive, read
// by the fused update. Plain data in a header of its own, so that the
// instruction-set translation units (fused_update_<isa>.cc, built with their
// own -m flags) share it without including anything with inline code.
#ifndef DEPOT_SERVER_OPTIMIZER_GRADIENT_INPUT_H_
#define DEPOT_SERVER_OPTIMIZER_GRADIENT_INPUT_H_

#include <cstddef>

#include "depot/dtype.h"

namespace depot {

// The gradient of a run as it arrives: the sum of the workers' contributions
// g[i] = part_0[i] + part_1[i] + ... (each converted from `dtype` to fp32,
// added left to right in rank order, in fp32; SumGradients' order), then
// g[i] = g[i] * unscale_factor if `unscale`, then g[i] = g[i] * clip_coef if
// `clip`: each a separate fp32 multiply (docs/protocol.md, "Numerics").
struct GradientInput {
  DType dtype = DType::kFloat32;
  // num_parts pointers, each to the run's elements of one worker's gradient
  // from element `offset` on. REQUIRES: num_parts >= 1.
  const void* const* parts = nullptr;
  size_t num_parts = 0;
  size_t offset = 0;
  bool unscale = false;
  float unscale_factor = 1.0f;
  bool clip = false;
  float clip_coef = 1.0f;
};

}  // namespace depot

#endif  // DEPOT_SERVER_OPTIMIZER_GRADIENT_INPUT_H_
