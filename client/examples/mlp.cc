#include "mlp.h"

#include <cmath>
#include <random>
#include <string>
#include <utility>

namespace depot::examples {

std::vector<TensorSpec> MlpTensors(const std::vector<size_t>& widths) {
  std::vector<TensorSpec> tensors;
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    const std::string name = "fc" + std::to_string(l);
    tensors.push_back(
        {name + ".weight", widths[l + 1] * widths[l], kWeightGroup});
    tensors.push_back({name + ".bias", widths[l + 1], kBiasGroup});
  }
  return tensors;
}

Mlp::Mlp(std::vector<size_t> widths, const Layout& layout)
    : widths_(std::move(widths)) {
  for (size_t l = 0; l < num_layers(); ++l) {
    weight_offsets_.push_back(layout.offset(2 * l));
    bias_offsets_.push_back(layout.offset(2 * l + 1));
  }
}

void Mlp::InitParams(uint64_t seed, float* params) const {
  std::mt19937_64 rng(seed);
  for (size_t l = 0; l < num_layers(); ++l) {
    const size_t in = widths_[l];
    const size_t out = widths_[l + 1];
    std::normal_distribution<float> normal(
        0.0f, std::sqrt(2.0f / static_cast<float>(in)));
    float* weight = params + weight_offsets_[l];
    for (size_t k = 0; k < out * in; ++k) weight[k] = normal(rng);
    float* bias = params + bias_offsets_[l];
    for (size_t o = 0; o < out; ++o) bias[o] = 0.0f;
  }
}

void Mlp::Forward(const float* params, const float* input, size_t batch,
                  Activations* acts) const {
  acts->batch = batch;
  acts->values.resize(widths_.size());
  acts->values[0].assign(input, input + batch * widths_[0]);
  for (size_t l = 0; l < num_layers(); ++l) {
    const size_t in = widths_[l];
    const size_t out = widths_[l + 1];
    const float* weight = params + weight_offsets_[l];
    const float* bias = params + bias_offsets_[l];
    const std::vector<float>& x = acts->values[l];
    std::vector<float>& y = acts->values[l + 1];
    y.assign(batch * out, 0.0f);
    const bool relu = l + 1 < num_layers();
    // Output-major: each weight row is read once per batch, not once per
    // sample.
    for (size_t o = 0; o < out; ++o) {
      const float* row = weight + o * in;
      for (size_t n = 0; n < batch; ++n) {
        const float* xn = x.data() + n * in;
        float sum = bias[o];
        for (size_t i = 0; i < in; ++i) sum += row[i] * xn[i];
        y[n * out + o] = relu && sum < 0.0f ? 0.0f : sum;
      }
    }
  }
}

void Mlp::Backward(const float* params, const float* output_grad,
                   const Activations& acts, float* grads) const {
  const size_t batch = acts.batch;
  std::vector<float> dy(output_grad, output_grad + batch * widths_.back());
  std::vector<float> dx;
  for (size_t l = num_layers(); l-- > 0;) {
    const size_t in = widths_[l];
    const size_t out = widths_[l + 1];
    const float* weight = params + weight_offsets_[l];
    float* weight_grad = grads + weight_offsets_[l];
    float* bias_grad = grads + bias_offsets_[l];
    const std::vector<float>& x = acts.values[l];
    const bool need_dx = l > 0;
    dx.assign(need_dx ? batch * in : 0, 0.0f);
    for (size_t o = 0; o < out; ++o) {
      const float* row = weight + o * in;
      float* row_grad = weight_grad + o * in;
      for (size_t n = 0; n < batch; ++n) {
        const float g = dy[n * out + o];
        if (g == 0.0f) continue;  // common behind a ReLU
        bias_grad[o] += g;
        const float* xn = x.data() + n * in;
        for (size_t i = 0; i < in; ++i) row_grad[i] += g * xn[i];
        if (!need_dx) continue;
        float* dxn = dx.data() + n * in;
        for (size_t i = 0; i < in; ++i) dxn[i] += g * row[i];
      }
    }
    if (!need_dx) break;
    // Through the ReLU that produced x: no gradient where it clipped.
    for (size_t k = 0; k < dx.size(); ++k) {
      if (x[k] <= 0.0f) dx[k] = 0.0f;
    }
    dy.swap(dx);
  }
}

}  // namespace depot::examples
