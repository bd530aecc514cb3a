// SumGradients: the sum of the workers' contributions to one chunk, the only
// place where the order of a floating-point reduction is chosen. It is fixed by
// worker rank, never by arrival, which is what makes the server's state
// deterministic.
#ifndef DEPOT_SERVER_GRADIENT_SUM_H_
#define DEPOT_SERVER_GRADIENT_SUM_H_

#include <cstddef>
#include <string>
#include <vector>

#include "depot/dtype.h"

namespace depot {

// sum[i] = g0[i] + g1[i] + ... + g(W-1)[i], evaluated left to right in fp32,
// where gw is payloads[w] (rank w's contribution) converted from `dtype`; then,
// unless `scale` is 1, sum[i] = sum[i] * scale, a separate fp32 multiply (how
// a loss scale is undone: scale = float(1 / loss_scale)). It is the gradient
// stage of the fused update (OptimizerKernel::FusedUpdate), which one-phase
// steps use directly; two-phase steps sum first, with this.
// REQUIRES: payloads is not empty; each holds n elements of `dtype`.
void SumGradients(DType dtype, const std::vector<std::string>& payloads,
                  float* sum, size_t n, float scale = 1.0f);

}  // namespace depot

#endif  // DEPOT_SERVER_GRADIENT_SUM_H_
