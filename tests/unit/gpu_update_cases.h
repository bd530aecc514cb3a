// The cases and random inputs of the GPU fused update's bitwise comparisons
// with the server's OptimizerKernel: gpu_element_update_test.cc (the element
// function on the host) and tests/gpu/gpu_kernels_test.cc (the kernels on a
// GPU) run the same ones.
#ifndef DEPOT_TESTS_UNIT_GPU_UPDATE_CASES_H_
#define DEPOT_TESTS_UNIT_GPU_UPDATE_CASES_H_

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "depot/dtype.h"
#include "depot/job_config.h"
#include "server/optimizer/gradient_input.h"
#include "server/optimizer/optimizer_kernel.h"

namespace depot::gpu::update_cases {

struct Case {
  std::string name;
  OptimizerConfig config;
  DType grad_dtype = DType::kFloat32;
  int parts = 1;
  bool unscale = false;
  bool clip = false;
  bool has_weights = false;
  DType weight_dtype = DType::kFloat32;
};

// Every optimizer and variant the server's fused update distinguishes, with
// the gradient's dtype, part count, unscale and clip, and the weights' dtype
// varied across them.
inline std::vector<Case> Cases() {
  std::vector<Case> cases;
  const auto add = [&](std::string name, OptimizerConfig config) {
    const int i = static_cast<int>(cases.size());
    Case c;
    c.config = config;
    c.grad_dtype = i % 3 == 0
                       ? DType::kFloat32
                       : (i % 3 == 1 ? DType::kBFloat16 : DType::kFloat16);
    c.parts = 1 + i % 3;
    c.unscale = i % 2 == 0;
    c.clip = (i / 2) % 2 == 0;
    c.has_weights = i % 4 != 3;
    c.weight_dtype = i % 4 == 0
                         ? DType::kFloat32
                         : (i % 4 == 1 ? DType::kBFloat16 : DType::kFloat16);
    c.name = absl::StrCat(
        name, ", grad ", std::string(DTypeName(c.grad_dtype)), " x", c.parts,
        c.unscale ? ", unscale" : "", c.clip ? ", clip" : "", ", weights ",
        c.has_weights ? std::string(DTypeName(c.weight_dtype)) : "none");
    cases.push_back(c);
  };
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
    for (double wd : {0.0, 0.05}) {
      for (bool amsgrad : {false, true}) {
        for (bool maximize : {false, true}) {
          OptimizerConfig c;
          c.kind = kind;
          c.weight_decay = wd;
          c.amsgrad = amsgrad;
          c.maximize = maximize;
          add(absl::StrCat(kind == OptimizerKind::kAdam ? "adam" : "adamw",
                           " wd ", wd, amsgrad ? " amsgrad" : "",
                           maximize ? " maximize" : ""),
              c);
        }
      }
    }
  }
  OptimizerConfig bf16_adam;
  bf16_adam.amsgrad = true;
  bf16_adam.exp_avg_dtype = DType::kBFloat16;
  bf16_adam.exp_avg_sq_dtype = DType::kBFloat16;
  add("adamw amsgrad, bf16 slots", bf16_adam);
  bf16_adam.kind = OptimizerKind::kAdam;
  bf16_adam.amsgrad = false;
  bf16_adam.exp_avg_dtype = DType::kFloat32;
  add("adam, exp_avg_sq bf16", bf16_adam);
  for (double wd : {0.0, 0.05}) {
    OptimizerConfig sgd;
    sgd.kind = OptimizerKind::kSgd;
    sgd.weight_decay = wd;
    sgd.sgd_momentum = 0;
    add(absl::StrCat("sgd wd ", wd), sgd);
    sgd.sgd_momentum = 0.9;
    sgd.sgd_dampening = 0.1;
    add(absl::StrCat("sgd momentum dampening wd ", wd), sgd);
    sgd.sgd_dampening = 0;
    sgd.sgd_nesterov = true;
    sgd.maximize = true;
    add(absl::StrCat("sgd nesterov maximize wd ", wd), sgd);
    sgd.exp_avg_dtype = DType::kBFloat16;
    add(absl::StrCat("sgd nesterov maximize bf16 wd ", wd), sgd);

    OptimizerConfig adagrad;
    adagrad.kind = OptimizerKind::kAdagrad;
    adagrad.weight_decay = wd;
    adagrad.adagrad_lr_decay = 0.05;
    add(absl::StrCat("adagrad wd ", wd), adagrad);
    adagrad.exp_avg_sq_dtype = DType::kBFloat16;
    adagrad.maximize = true;
    add(absl::StrCat("adagrad bf16 maximize wd ", wd), adagrad);

    OptimizerConfig lion;
    lion.kind = OptimizerKind::kLion;
    lion.weight_decay = wd;
    add(absl::StrCat("lion wd ", wd), lion);
    lion.exp_avg_dtype = DType::kBFloat16;
    lion.maximize = true;
    add(absl::StrCat("lion bf16 maximize wd ", wd), lion);
  }
  return cases;
}

// One run's state: master, slots and weights as bytes, and its gradient parts.
struct State {
  std::vector<float> master;
  std::vector<std::vector<unsigned char>> slots;  // one per state slot
  std::vector<unsigned char> weights;

  ParamRun Run() {
    ParamRun run;
    run.master = master.data();
    for (size_t k = 0; k < slots.size(); ++k) run.slots[k] = slots[k].data();
    run.n = master.size();
    return run;
  }
};

// n fp32 values, uniform in [-1, 1) times a magnitude between 1e-3 and 10, so
// that the update's roundings fall everywhere.
inline std::vector<float> RandomValues(std::mt19937& rng, size_t n,
                                       bool positive) {
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-3.0f, 1.0f);
  std::vector<float> values(n);
  for (float& v : values) {
    v = unit(rng) * std::pow(10.0f, exponent(rng));
    if (positive) v = std::fabs(v);
  }
  return values;
}

inline std::vector<unsigned char> Encode(const std::vector<float>& values,
                                         DType dtype) {
  std::vector<unsigned char> bytes(values.size() * DTypeSize(dtype));
  ConvertFromFloat(values.data(), dtype, bytes.data(), values.size());
  return bytes;
}

inline State InitialState(const Case& c, size_t n, std::mt19937& rng) {
  State state;
  state.master = RandomValues(rng, n, false);
  for (int k = 0; k < OptimizerStateSlots(c.config); ++k) {
    // Adam's second moments and Adagrad's sum are never negative.
    const bool positive = (c.config.kind == OptimizerKind::kAdagrad) ||
                          ((c.config.kind == OptimizerKind::kAdam ||
                            c.config.kind == OptimizerKind::kAdamW) &&
                           k > 0);
    state.slots.push_back(Encode(RandomValues(rng, n, positive),
                                 OptimizerSlotDType(c.config, k)));
  }
  if (c.has_weights) state.weights.assign(n * DTypeSize(c.weight_dtype), 0);
  return state;
}

// Where `a` and `b` differ first, or "" when they hold the same bits.
inline std::string FirstDifference(const State& a, const State& b) {
  for (size_t i = 0; i < a.master.size(); ++i) {
    if (std::bit_cast<uint32_t>(a.master[i]) !=
        std::bit_cast<uint32_t>(b.master[i])) {
      return absl::StrCat("master[", i, "]: ", a.master[i], " vs ",
                          b.master[i]);
    }
  }
  for (size_t k = 0; k < a.slots.size(); ++k) {
    if (a.slots[k] != b.slots[k]) return absl::StrCat("state slot ", k);
  }
  if (a.weights != b.weights) return "weights";
  return "";
}

// The gradient parts of one step: c.parts arrays of n elements of
// c.grad_dtype.
inline std::vector<std::vector<unsigned char>> GradientParts(
    const Case& c, size_t n, std::mt19937& rng) {
  std::vector<std::vector<unsigned char>> parts;
  for (int w = 0; w < c.parts; ++w) {
    parts.push_back(Encode(RandomValues(rng, n, false), c.grad_dtype));
  }
  return parts;
}

// The gradient of `c` over `parts` (one pointer per part).
inline GradientInput MakeGradient(const Case& c,
                                  const std::vector<const void*>& parts) {
  GradientInput grad;
  grad.dtype = c.grad_dtype;
  grad.parts = parts.data();
  grad.num_parts = parts.size();
  grad.unscale = c.unscale;
  grad.unscale_factor = 0.37f;
  grad.clip = c.clip;
  grad.clip_coef = 0.81f;
  return grad;
}

// Step `step`'s hyperparameters: a learning rate that changes every step.
inline UpdateHyperParams StepHyperParams(const Case& c, int step) {
  UpdateHyperParams hparams;
  hparams.lr = 1e-3 * (1 + 0.25 * step);
  hparams.weight_decay = c.config.weight_decay;
  hparams.step = static_cast<uint64_t>(step);
  return hparams;
}

}  // namespace depot::gpu::update_cases

#endif  // DEPOT_TESTS_UNIT_GPU_UPDATE_CASES_H_
