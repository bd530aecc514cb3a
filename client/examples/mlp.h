// A small multilayer perceptron in plain C++ (ReLU between layers, linear
// output) whose parameters live in one flat buffer laid out as a depot::Layout,
// the way a trainer hands its gradients to Depot.
//
// Layer l has a weight tensor "fc<l>.weight" of [out x in] elements (row-major,
// one row per output) in param group 0 and a bias "fc<l>.bias" of [out] in
// group 1.
#ifndef DEPOT_CLIENT_EXAMPLES_MLP_H_
#define DEPOT_CLIENT_EXAMPLES_MLP_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "depot/layout.h"

namespace depot::examples {

inline constexpr uint32_t kWeightGroup = 0;
inline constexpr uint32_t kBiasGroup = 1;

// The tensors of an MLP with these layer widths (input first, output last), in
// flat order. REQUIRES: at least two widths, all > 0.
std::vector<TensorSpec> MlpTensors(const std::vector<size_t>& widths);

class Mlp {
 public:
  // The activations of one batch, kept from Forward for Backward.
  struct Activations {
    size_t batch = 0;
    // values[0] is the input, values[l + 1] the output of layer l (after ReLU
    // for hidden layers): batch rows of widths[l + 1].
    std::vector<std::vector<float>> values;
  };

  // REQUIRES: layout was made from MlpTensors(widths).
  Mlp(std::vector<size_t> widths, const Layout& layout);

  size_t input_width() const { return widths_.front(); }
  size_t output_width() const { return widths_.back(); }

  // Writes He-normal weights and zero biases, drawn from `seed`, into `params`
  // (the flat buffer; padding is left as it is).
  void InitParams(uint64_t seed, float* params) const;

  // Runs `batch` rows of `input` through the network. The output is
  // acts->values.back().
  void Forward(const float* params, const float* input, size_t batch,
               Activations* acts) const;

  // Adds the gradient of the loss with respect to every parameter to `grads`,
  // given the loss's gradient with respect to the output (acts.batch rows) and
  // the activations Forward kept.
  void Backward(const float* params, const float* output_grad,
                const Activations& acts, float* grads) const;

 private:
  size_t num_layers() const { return widths_.size() - 1; }

  std::vector<size_t> widths_;
  std::vector<uint64_t> weight_offsets_;  // per layer, into the flat buffer
  std::vector<uint64_t> bias_offsets_;
};

}  // namespace depot::examples

#endif  // DEPOT_CLIENT_EXAMPLES_MLP_H_
