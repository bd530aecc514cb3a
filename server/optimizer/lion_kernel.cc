#include "server/optimizer/lion_kernel.h"

#include <algorithm>
#include <iterator>

#include "server/optimizer/fused_update.h"
#include "server/optimizer/slot_storage.h"

namespace depot {
namespace {

// The math is LionMath (optimizer_math.h).
class LionKernel final : public OptimizerKernel {
 public:
  explicit LionKernel(const OptimizerConfig& config)
      : config_(config), format_(SlotFormat::Of(config)) {}

 protected:
  fused::OptimizerStep Prepare(
      const UpdateHyperParams& hparams) const override {
    fused::OptimizerStep prepared;
    prepared.kind = OptimizerKind::kLion;
    prepared.has_weight_decay = hparams.weight_decay != 0;
    prepared.maximize = config_.maximize;
    std::copy(std::begin(format_.dtypes), std::end(format_.dtypes),
              prepared.slot_dtypes);
    // Derived in double and rounded to float once, like the torch-derived
    // kernels' (Lion is not in torch.optim; the reference implementations are
    // fp32 tensor code of the same shape).
    fused::LionScalars& s = prepared.lion;
    s.beta1 = static_cast<float>(config_.lion_beta1);
    s.one_minus_beta1 = static_cast<float>(1 - config_.lion_beta1);
    s.beta2 = static_cast<float>(config_.lion_beta2);
    s.one_minus_beta2 = static_cast<float>(1 - config_.lion_beta2);
    s.decay_factor = static_cast<float>(1 - hparams.lr * hparams.weight_decay);
    s.lr = static_cast<float>(hparams.lr);
    return prepared;
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
