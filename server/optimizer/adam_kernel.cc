#include "server/optimizer/adam_kernel.h"

#include <cmath>

#include "server/optimizer/constant_bool.h"
#include "server/optimizer/slot_storage.h"

namespace depot {
namespace {

// The per-call scalars. torch computes them from Python floats (double) and
// each fp32 tensor op rounds its scalar to float once; so do we.
struct AdamScalars {
  float beta1 = 0;
  float one_minus_beta1 = 0;
  float beta2 = 0;
  float one_minus_beta2 = 0;
  float weight_decay = 0;           // Adam: the L2 coefficient
  float decay_factor = 1;           // AdamW: 1 - lr * weight_decay
  float step_size = 0;              // lr / (1 - beta1^step)
  float bias_correction2_sqrt = 1;  // sqrt(1 - beta2^step)
  float eps = 0;
};

// One fused pass. The expression shapes (operand order included) are torch's:
// mul_(b1).add_(g, alpha=1-b1); mul_(b2).addcmul_(g, g, value=1-b2);
// (sqrt(v) / bc2_sqrt).add_(eps); addcdiv_(m, denom, value=-step_size).
// ExpAvg and ExpAvgSq are the slots' element types (slot_storage.h).
template <bool kDecoupled, bool kHasWeightDecay, typename ExpAvg,
          typename ExpAvgSq>
void AdamLoop(const float* __restrict grad, float* __restrict param,
              ExpAvg* __restrict exp_avg, ExpAvgSq* __restrict exp_avg_sq,
              size_t n, const AdamScalars& s) {
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
    const float denom = std::sqrt(v) / s.bias_correction2_sqrt + s.eps;
    StoreSlot(exp_avg[i], m);
    StoreSlot(exp_avg_sq[i], v);
    param[i] = p - s.step_size * m / denom;
  }
}

class AdamKernel final : public OptimizerKernel {
 public:
  AdamKernel(const OptimizerConfig& config, bool decoupled)
      : config_(config),
        format_(SlotFormat::Of(config)),
        decoupled_(decoupled) {}

  void Update(const float* grad, const ParamRun& run,
              const UpdateHyperParams& hparams) const override {
    const AdamScalars s = Scalars(hparams);
    WithTypedSlot(format_.dtypes[0], run.slots[0], [&](auto* exp_avg) {
      WithTypedSlot(format_.dtypes[1], run.slots[1], [&](auto* exp_avg_sq) {
        WithConstantBool(decoupled_, [&](auto is_decoupled) {
          WithConstantBool(
              hparams.weight_decay != 0, [&](auto has_weight_decay) {
                AdamLoop<is_decoupled, has_weight_decay>(
                    grad, run.master, exp_avg, exp_avg_sq, run.n, s);
              });
        });
      });
    });
  }

 private:
  AdamScalars Scalars(const UpdateHyperParams& hparams) const {
    const double beta1 = config_.adam_beta1;
    const double beta2 = config_.adam_beta2;
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
    s.eps = static_cast<float>(config_.adam_eps);
    return s;
  }

  const OptimizerConfig config_;
  const SlotFormat format_;
  const bool decoupled_;
};

}  // namespace

std::unique_ptr<OptimizerKernel> MakeAdamKernel(const OptimizerConfig& config) {
  return std::make_unique<AdamKernel>(config,
                                      config.kind == OptimizerKind::kAdamW);
}

}  // namespace depot
