// What the servers compute from the workers' gradients before the optimizer
// runs, recomputed in the test: the rank-order fp32 sum, the loss-scale
// unscaling, and the global statistics (in float64) that clipping and
// non-finite skipping use. Tests compare the servers' reports with these.
#ifndef DEPOT_TESTS_INTEGRATION_SUMMED_GRADIENT_H_
#define DEPOT_TESTS_INTEGRATION_SUMMED_GRADIENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "depot/dtype.h"
#include "depot/layout.h"

namespace depot::testing {

// sum = g0 + g1 + ... in rank order in fp32 (grads[r]: worker r's N elements
// of `dtype`), then sum * float(1 / loss_scale) unless loss_scale is 1.
// Padding elements hold whatever the sum gives; the statistics skip them.
std::vector<float> SummedGradient(const Layout& layout, DType dtype,
                                  const std::vector<std::string>& grads,
                                  double loss_scale = 1.0);

// sqrt of the sum of squares over the tensor elements, in float64 (each
// square of an fp32 value is exact in float64).
double L2Norm(const Layout& layout, const std::vector<float>& grad);
// max |g| over the tensor elements.
double InfNorm(const Layout& layout, const std::vector<float>& grad);
// Tensor elements exactly 0.
uint64_t ZeroCount(const Layout& layout, const std::vector<float>& grad);

// grad[i] * float(clip_coef) for every element when clip_coef < 1: the
// gradient the optimizer sees after clipping.
std::vector<float> Clipped(std::vector<float> grad, double clip_coef);

// `grad` (N fp32 values) as the bytes of one worker's fp32 contribution, to
// feed a ReferenceOptimizer of an fp32 job with the final gradient.
std::string AsFp32Bytes(const std::vector<float>& grad);

}  // namespace depot::testing

#endif  // DEPOT_TESTS_INTEGRATION_SUMMED_GRADIENT_H_
