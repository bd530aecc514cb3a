#include "server/optimizer/adam_kernel.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "server/optimizer/fused_update.h"
#include "server/optimizer/slot_storage.h"

namespace depot {
namespace {

// The math is AdamMath (optimizer_math.h).
class AdamKernel final : public OptimizerKernel {
 public:
  AdamKernel(const OptimizerConfig& config, bool decoupled)
      : config_(config),
        format_(SlotFormat::Of(config)),
        decoupled_(decoupled) {}

 protected:
  fused::OptimizerStep Prepare(
      const UpdateHyperParams& hparams) const override {
    // torch computes the scalars from Python floats (double) and each fp32
    // tensor op rounds its scalar to float once; so do we.
    const double beta1 = config_.adam_beta1;
    const double beta2 = config_.adam_beta2;
    const double step = static_cast<double>(hparams.step);
    fused::OptimizerStep prepared;
    prepared.kind = config_.kind;
    prepared.decoupled = decoupled_;
    prepared.has_weight_decay = hparams.weight_decay != 0;
    prepared.amsgrad = config_.amsgrad;
    prepared.maximize = config_.maximize;
    std::copy(std::begin(format_.dtypes), std::end(format_.dtypes),
              prepared.slot_dtypes);
    fused::AdamScalars& s = prepared.adam;
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
    return prepared;
  }

 private:
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
