// Compiled with -ffp-contract=off, as the kernels it stands for were
// (server/tests/CMakeLists.txt).
#include "server/tests/unfused_reference.h"

#include <cmath>
#include <type_traits>
#include <utility>

#include "server/optimizer/slot_storage.h"

namespace depot::testing {
namespace {

template <typename F>
void WithBool(bool value, F&& f) {
  if (value) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

struct AdamScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, weight_decay,
      decay_factor, step_size, bias_correction2_sqrt, eps;
};

// torch.maximum as torch's portable vector kernel computes it: a NaN in
// either operand gives a NaN.
inline float Maximum(float a, float b) {
  return (a > b || std::isnan(a)) ? a : b;
}

template <bool kDecoupled, bool kHasWeightDecay, bool kAmsgrad, typename ExpAvg,
          typename ExpAvgSq, typename MaxExpAvgSq>
void AdamLoop(const float* grad, float* param, ExpAvg* exp_avg,
              ExpAvgSq* exp_avg_sq, MaxExpAvgSq* max_exp_avg_sq, size_t n,
              const AdamScalars& s) {
  for (size_t i = 0; i < n; ++i) {
    float g = grad[i];
    float p = param[i];
    if constexpr (kHasWeightDecay) {
      if constexpr (kDecoupled) {
        p = p * s.decay_factor;
      } else {
        g = g + s.weight_decay * p;
      }
    }
    const float m = LoadSlot(exp_avg[i]) * s.beta1 + s.one_minus_beta1 * g;
    const float v =
        LoadSlot(exp_avg_sq[i]) * s.beta2 + s.one_minus_beta2 * g * g;
    float second_moment = v;
    if constexpr (kAmsgrad) {
      second_moment = Maximum(LoadSlot(max_exp_avg_sq[i]), v);
      StoreSlot(max_exp_avg_sq[i], second_moment);
    }
    const float denom =
        std::sqrt(second_moment) / s.bias_correction2_sqrt + s.eps;
    StoreSlot(exp_avg[i], m);
    StoreSlot(exp_avg_sq[i], v);
    param[i] = p - s.step_size * m / denom;
  }
}

void Adam(const OptimizerConfig& config, const float* grad, const ParamRun& run,
          const UpdateHyperParams& hparams) {
  const double beta1 = config.adam_beta1;
  const double beta2 = config.adam_beta2;
  const double step = static_cast<double>(hparams.step);
  AdamScalars s;
  s.beta1 = static_cast<float>(beta1);
  s.one_minus_beta1 = static_cast<float>(1 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1 - beta2);
  s.weight_decay = static_cast<float>(hparams.weight_decay);
  s.decay_factor = static_cast<float>(1 - hparams.lr * hparams.weight_decay);
  s.step_size = static_cast<float>(hparams.lr / (1 - std::pow(beta1, step)));
  s.bias_correction2_sqrt =
      static_cast<float>(std::sqrt(1 - std::pow(beta2, step)));
  s.eps = static_cast<float>(config.adam_eps);
  const SlotFormat format = SlotFormat::Of(config);
  WithTypedSlot(format.dtypes[0], run.slots[0], [&](auto* exp_avg) {
    WithTypedSlot(format.dtypes[1], run.slots[1], [&](auto* exp_avg_sq) {
      // Null without amsgrad.
      WithTypedSlot(format.dtypes[2], run.slots[2], [&](auto* max_exp_avg_sq) {
        WithBool(config.kind == OptimizerKind::kAdamW, [&](auto decoupled) {
          WithBool(hparams.weight_decay != 0, [&](auto has_weight_decay) {
            WithBool(config.amsgrad, [&](auto amsgrad) {
              AdamLoop<decoupled, has_weight_decay, amsgrad>(
                  grad, run.master, exp_avg, exp_avg_sq, max_exp_avg_sq, run.n,
                  s);
            });
          });
        });
      });
    });
  });
}

struct SgdScalars {
  float weight_decay, momentum, one_minus_dampening, neg_lr;
};

template <bool kHasWeightDecay, bool kMomentum, bool kFirstStep, bool kNesterov,
          typename Buffer>
void SgdLoop(const float* grad, float* param, Buffer* momentum_buffer, size_t n,
             const SgdScalars& s) {
  for (size_t i = 0; i < n; ++i) {
    float g = grad[i];
    const float p = param[i];
    if constexpr (kHasWeightDecay) g = g + s.weight_decay * p;
    if constexpr (kMomentum) {
      float buf;
      if constexpr (kFirstStep) {
        buf = g;
      } else {
        buf = LoadSlot(momentum_buffer[i]) * s.momentum +
              s.one_minus_dampening * g;
      }
      StoreSlot(momentum_buffer[i], buf);
      if constexpr (kNesterov) {
        g = g + s.momentum * buf;
      } else {
        g = buf;
      }
    }
    param[i] = p + s.neg_lr * g;
  }
}

void Sgd(const OptimizerConfig& config, const float* grad, const ParamRun& run,
         const UpdateHyperParams& hparams) {
  SgdScalars s;
  s.weight_decay = static_cast<float>(hparams.weight_decay);
  s.momentum = static_cast<float>(config.sgd_momentum);
  s.one_minus_dampening = static_cast<float>(1 - config.sgd_dampening);
  s.neg_lr = static_cast<float>(-hparams.lr);
  const bool momentum = config.sgd_momentum > 0;
  const bool first_step = momentum && hparams.step == 1;
  const bool nesterov = momentum && config.sgd_nesterov;
  WithTypedSlot(
      SlotFormat::Of(config).dtypes[0], run.slots[0], [&](auto* buffer) {
        WithBool(hparams.weight_decay != 0, [&](auto has_weight_decay) {
          WithBool(momentum, [&](auto has_momentum) {
            WithBool(first_step, [&](auto is_first_step) {
              WithBool(nesterov, [&](auto is_nesterov) {
                SgdLoop<has_weight_decay, has_momentum, is_first_step,
                        is_nesterov>(grad, run.master, buffer, run.n, s);
              });
            });
          });
        });
      });
}

struct AdagradScalars {
  float weight_decay, clr, eps;
};

template <bool kHasWeightDecay, typename StateSum>
void AdagradLoop(const float* grad, float* param, StateSum* state_sum, size_t n,
                 const AdagradScalars& s) {
  for (size_t i = 0; i < n; ++i) {
    float g = grad[i];
    const float p = param[i];
    if constexpr (kHasWeightDecay) g = g + s.weight_decay * p;
    const float sum = LoadSlot(state_sum[i]) + g * g;
    const float std_dev = std::sqrt(sum) + s.eps;
    StoreSlot(state_sum[i], sum);
    param[i] = p - s.clr * g / std_dev;
  }
}

void Adagrad(const OptimizerConfig& config, const float* grad,
             const ParamRun& run, const UpdateHyperParams& hparams) {
  AdagradScalars s;
  s.weight_decay = static_cast<float>(hparams.weight_decay);
  s.clr = static_cast<float>(
      hparams.lr /
      (1 + static_cast<double>(hparams.step - 1) * config.adagrad_lr_decay));
  s.eps = static_cast<float>(config.adagrad_eps);
  WithTypedSlot(
      SlotFormat::Of(config).dtypes[0], run.slots[0], [&](auto* state_sum) {
        WithBool(hparams.weight_decay != 0, [&](auto has_weight_decay) {
          AdagradLoop<has_weight_decay>(grad, run.master, state_sum, run.n, s);
        });
      });
}

struct LionScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, decay_factor, lr;
};

inline float Sign(float x) {
  return static_cast<float>(static_cast<int>(x > 0.0f) -
                            static_cast<int>(x < 0.0f));
}

template <bool kHasWeightDecay, typename ExpAvg>
void LionLoop(const float* grad, float* param, ExpAvg* exp_avg, size_t n,
              const LionScalars& s) {
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float m = LoadSlot(exp_avg[i]);
    float p = param[i];
    const float c = m * s.beta1 + s.one_minus_beta1 * g;
    if constexpr (kHasWeightDecay) p = p * s.decay_factor;
    param[i] = p - s.lr * Sign(c);
    StoreSlot(exp_avg[i], m * s.beta2 + s.one_minus_beta2 * g);
  }
}

void Lion(const OptimizerConfig& config, const float* grad, const ParamRun& run,
          const UpdateHyperParams& hparams) {
  LionScalars s;
  s.beta1 = static_cast<float>(config.lion_beta1);
  s.one_minus_beta1 = static_cast<float>(1 - config.lion_beta1);
  s.beta2 = static_cast<float>(config.lion_beta2);
  s.one_minus_beta2 = static_cast<float>(1 - config.lion_beta2);
  s.decay_factor = static_cast<float>(1 - hparams.lr * hparams.weight_decay);
  s.lr = static_cast<float>(hparams.lr);
  WithTypedSlot(
      SlotFormat::Of(config).dtypes[0], run.slots[0], [&](auto* exp_avg) {
        WithBool(hparams.weight_decay != 0, [&](auto has_weight_decay) {
          LionLoop<has_weight_decay>(grad, run.master, exp_avg, run.n, s);
        });
      });
}

}  // namespace

void UnfusedUpdate(const OptimizerConfig& config, const UnfusedGradient& grad,
                   const ParamRun& run, const UpdateHyperParams& hparams,
                   DType weight_dtype, void* weights) {
  const size_t n = run.n;
  // SumGradients.
  std::vector<float> sum(n), part(n);
  ConvertToFloat(grad.dtype, grad.parts[0], sum.data(), n);
  for (size_t w = 1; w < grad.parts.size(); ++w) {
    ConvertToFloat(grad.dtype, grad.parts[w], part.data(), n);
    for (size_t i = 0; i < n; ++i) sum[i] += part[i];
  }
  if (grad.unscale_factor != 1.0f) {
    for (size_t i = 0; i < n; ++i) sum[i] *= grad.unscale_factor;
  }
  // ScaleGradient by the clip coefficient.
  if (grad.clip_coef < 1.0) {
    const float clip = static_cast<float>(grad.clip_coef);
    for (size_t i = 0; i < n; ++i) sum[i] *= clip;
  }
  // torch's maximize: `grad = -grad` before the optimizer's own arithmetic.
  if (config.maximize) {
    for (size_t i = 0; i < n; ++i) sum[i] = -sum[i];
  }
  switch (config.kind) {
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      Adam(config, sum.data(), run, hparams);
      break;
    case OptimizerKind::kSgd:
      Sgd(config, sum.data(), run, hparams);
      break;
    case OptimizerKind::kAdagrad:
      Adagrad(config, sum.data(), run, hparams);
      break;
    case OptimizerKind::kLion:
      Lion(config, sum.data(), run, hparams);
      break;
  }
  // EncodeMaster.
  if (weights != nullptr)
    ConvertFromFloat(run.master, weight_dtype, weights, n);
}

}  // namespace depot::testing
