#include "server/optimizer/sgd_kernel.h"

#include <algorithm>
#include <iterator>

#include "server/optimizer/fused_update.h"
#include "server/optimizer/slot_storage.h"

namespace depot {
namespace {

// The math is SgdMath (optimizer_math.h).
class SgdKernel final : public OptimizerKernel {
 public:
  explicit SgdKernel(const OptimizerConfig& config)
      : config_(config), format_(SlotFormat::Of(config)) {}

 protected:
  fused::OptimizerStep Prepare(
      const UpdateHyperParams& hparams) const override {
    fused::OptimizerStep prepared;
    prepared.kind = OptimizerKind::kSgd;
    prepared.has_weight_decay = hparams.weight_decay != 0;
    prepared.momentum = config_.sgd_momentum > 0;
    // Without momentum there is no buffer and nothing differs on step 1.
    prepared.first_step = prepared.momentum && hparams.step == 1;
    prepared.nesterov = prepared.momentum && config_.sgd_nesterov;
    prepared.maximize = config_.maximize;
    std::copy(std::begin(format_.dtypes), std::end(format_.dtypes),
              prepared.slot_dtypes);
    // Derived in double and rounded to float once, as torch's fp32 tensor ops
    // round their Python-float scalars.
    fused::SgdScalars& s = prepared.sgd;
    s.weight_decay = static_cast<float>(hparams.weight_decay);
    s.momentum = static_cast<float>(config_.sgd_momentum);
    s.one_minus_dampening = static_cast<float>(1 - config_.sgd_dampening);
    s.neg_lr = static_cast<float>(-hparams.lr);
    return prepared;
  }

 private:
  const OptimizerConfig config_;
  const SlotFormat format_;
};

}  // namespace

std::unique_ptr<OptimizerKernel> MakeSgdKernel(const OptimizerConfig& config) {
  return std::make_unique<SgdKernel>(config);
}

}  // namespace depot
