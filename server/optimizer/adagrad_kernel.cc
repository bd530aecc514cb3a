#include "server/optimizer/adagrad_kernel.h"

#include <cmath>

#include "server/optimizer/constant_bool.h"
#include "server/optimizer/slot_storage.h"

namespace depot {
namespace {

// The per-call scalars, derived in double and rounded to float once (as torch's
// fp32 tensor ops round their Python-float scalars).
struct AdagradScalars {
  float weight_decay = 0;
  float clr = 0;  // lr / (1 + (step - 1) * lr_decay)
  float eps = 0;
};

// One fused pass. The expression shapes are torch's: g.add(p, alpha=wd);
// state_sum.addcmul_(g, g, value=1); std = state_sum.sqrt().add_(eps);
// p.addcdiv_(g, std, value=-clr), which computes p + (-clr * g) / std: the
// same bits as p - clr * g / std, since negation is exact.
// StateSum is the slot's element type (slot_storage.h).
template <bool kHasWeightDecay, typename StateSum>
void AdagradLoop(const float* __restrict grad, float* __restrict param,
                 StateSum* __restrict state_sum, size_t n,
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

class AdagradKernel final : public OptimizerKernel {
 public:
  explicit AdagradKernel(const OptimizerConfig& config)
      : config_(config), format_(SlotFormat::Of(config)) {}

  void Update(const float* grad, const ParamRun& run,
              const UpdateHyperParams& hparams) const override {
    AdagradScalars s;
    s.weight_decay = static_cast<float>(hparams.weight_decay);
    s.clr = static_cast<float>(
        hparams.lr /
        (1 + static_cast<double>(hparams.step - 1) * config_.adagrad_lr_decay));
    s.eps = static_cast<float>(config_.adagrad_eps);
    WithTypedSlot(format_.dtypes[0], run.slots[0], [&](auto* state_sum) {
      WithConstantBool(hparams.weight_decay != 0, [&](auto has_weight_decay) {
        AdagradLoop<has_weight_decay>(grad, run.master, state_sum, run.n, s);
      });
    });
  }

 private:
  const OptimizerConfig config_;
  const SlotFormat format_;
};

}  // namespace

std::unique_ptr<OptimizerKernel> MakeAdagradKernel(
    const OptimizerConfig& config) {
  return std::make_unique<AdagradKernel>(config);
}

}  // namespace depot
