#include "server/optimizer/adagrad_kernel.h"

#include <algorithm>
#include <iterator>

#include "server/optimizer/fused_update.h"
#include "server/optimizer/slot_storage.h"

namespace depot {
namespace {

// The math is AdagradMath (optimizer_math.h).
class AdagradKernel final : public OptimizerKernel {
 public:
  explicit AdagradKernel(const OptimizerConfig& config)
      : config_(config), format_(SlotFormat::Of(config)) {}

 protected:
  fused::OptimizerStep Prepare(
      const UpdateHyperParams& hparams) const override {
    fused::OptimizerStep prepared;
    prepared.kind = OptimizerKind::kAdagrad;
    prepared.has_weight_decay = hparams.weight_decay != 0;
    prepared.maximize = config_.maximize;
    std::copy(std::begin(format_.dtypes), std::end(format_.dtypes),
              prepared.slot_dtypes);
    // Derived in double and rounded to float once, as torch's fp32 tensor ops
    // round their Python-float scalars.
    fused::AdagradScalars& s = prepared.adagrad;
    s.weight_decay = static_cast<float>(hparams.weight_decay);
    s.clr = static_cast<float>(
        hparams.lr /
        (1 + static_cast<double>(hparams.step - 1) * config_.adagrad_lr_decay));
    s.eps = static_cast<float>(config_.adagrad_eps);
    return prepared;
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
