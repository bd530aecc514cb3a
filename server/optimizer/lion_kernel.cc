#include "server/optimizer/lion_kernel.h"

#include "server/optimizer/constant_bool.h"
#include "server/optimizer/slot_storage.h"

namespace depot {
namespace {

// The per-call scalars, derived in double and rounded to float once, like the
// torch-derived kernels' (Lion is not in torch.optim; the reference
// implementations are fp32 tensor code of the same shape).
struct LionScalars {
  float beta1 = 0;
  float one_minus_beta1 = 0;
  float beta2 = 0;
  float one_minus_beta2 = 0;
  float decay_factor = 1;  // 1 - lr * weight_decay
  float lr = 0;
};

// -1, 0 or +1; 0 for zero of either sign and for NaN (torch.sign's values).
inline float Sign(float x) {
  return static_cast<float>(static_cast<int>(x > 0.0f) -
                            static_cast<int>(x < 0.0f));
}

// One fused pass: c = m * b1 + (1 - b1) * g; p = p * (1 - lr * wd);
// p = p - lr * sign(c); m = m * b2 + (1 - b2) * g. lr * sign(c) is exact
// (sign is -1, 0 or 1), so the weight sees two roundings: the decay and the
// subtraction.
// ExpAvg is the slot's element type (slot_storage.h).
template <bool kHasWeightDecay, typename ExpAvg>
void LionLoop(const float* __restrict grad, float* __restrict param,
              ExpAvg* __restrict exp_avg, size_t n, const LionScalars& s) {
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

class LionKernel final : public OptimizerKernel {
 public:
  explicit LionKernel(const OptimizerConfig& config)
      : config_(config), format_(SlotFormat::Of(config)) {}

  void Update(const float* grad, const ParamRun& run,
              const UpdateHyperParams& hparams) const override {
    LionScalars s;
    s.beta1 = static_cast<float>(config_.lion_beta1);
    s.one_minus_beta1 = static_cast<float>(1 - config_.lion_beta1);
    s.beta2 = static_cast<float>(config_.lion_beta2);
    s.one_minus_beta2 = static_cast<float>(1 - config_.lion_beta2);
    s.decay_factor = static_cast<float>(1 - hparams.lr * hparams.weight_decay);
    s.lr = static_cast<float>(hparams.lr);
    WithTypedSlot(format_.dtypes[0], run.slots[0], [&](auto* exp_avg) {
      WithConstantBool(hparams.weight_decay != 0, [&](auto has_weight_decay) {
        LionLoop<has_weight_decay>(grad, run.master, exp_avg, run.n, s);
      });
    });
  }

 private:
  const OptimizerConfig config_;
  const SlotFormat format_;
};

}  // namespace

std::unique_ptr<OptimizerKernel> MakeLionKernel(const OptimizerConfig& config) {
  return std::make_unique<LionKernel>(config);
}

}  // namespace depot
