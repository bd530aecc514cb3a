#include "summed_gradient.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace depot::testing {

std::vector<float> SummedGradient(const Layout& layout, DType dtype,
                                  const std::vector<std::string>& grads,
                                  double loss_scale) {
  const uint64_t n = layout.total_elems();
  std::vector<float> sum(n);
  std::vector<float> addend(n);
  ConvertToFloat(dtype, grads[0].data(), sum.data(), n);
  for (size_t rank = 1; rank < grads.size(); ++rank) {
    ConvertToFloat(dtype, grads[rank].data(), addend.data(), n);
    for (uint64_t i = 0; i < n; ++i) sum[i] = sum[i] + addend[i];
  }
  if (loss_scale != 1.0) {
    const float unscale = static_cast<float>(1.0 / loss_scale);
    for (float& g : sum) g = g * unscale;
  }
  return sum;
}

double L2Norm(const Layout& layout, const std::vector<float>& grad) {
  double sum_squares = 0.0;
  for (const Segment& segment : layout.SegmentsIn(0, layout.total_elems())) {
    for (uint64_t i = segment.begin; i < segment.end; ++i) {
      sum_squares += static_cast<double>(grad[i]) * grad[i];
    }
  }
  return std::sqrt(sum_squares);
}

double InfNorm(const Layout& layout, const std::vector<float>& grad) {
  double max_abs = 0.0;
  for (const Segment& segment : layout.SegmentsIn(0, layout.total_elems())) {
    for (uint64_t i = segment.begin; i < segment.end; ++i) {
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(grad[i])));
    }
  }
  return max_abs;
}

uint64_t ZeroCount(const Layout& layout, const std::vector<float>& grad) {
  uint64_t zeros = 0;
  for (const Segment& segment : layout.SegmentsIn(0, layout.total_elems())) {
    for (uint64_t i = segment.begin; i < segment.end; ++i) {
      zeros += grad[i] == 0.0f ? 1 : 0;
    }
  }
  return zeros;
}

std::vector<float> Clipped(std::vector<float> grad, double clip_coef) {
  if (clip_coef < 1.0) {
    const float coef = static_cast<float>(clip_coef);
    for (float& g : grad) g = g * coef;
  }
  return grad;
}

std::string AsFp32Bytes(const std::vector<float>& grad) {
  std::string bytes(grad.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), grad.data(), bytes.size());
  return bytes;
}

}  // namespace depot::testing
