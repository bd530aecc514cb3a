#include "server/optimizer/sgd_kernel.h"

#include "server/optimizer/constant_bool.h"
#include "server/optimizer/slot_storage.h"

namespace depot {
namespace {

// The per-call scalars, derived in double and rounded to float once (as torch's
// fp32 tensor ops round their Python-float scalars).
struct SgdScalars {
  float weight_decay = 0;
  float momentum = 0;
  float one_minus_dampening = 1;
  float neg_lr = 0;
};

// One fused pass. The expression shapes are torch's: g.add(p, alpha=wd);
// buf.mul_(mu).add_(g, alpha=1-dampening); g.add(buf, alpha=mu);
// p.add_(g, alpha=-lr). On the first step the buffer is a copy of g.
// Buffer is the momentum buffer's element type (slot_storage.h).
template <bool kHasWeightDecay, bool kMomentum, bool kFirstStep, bool kNesterov,
          typename Buffer>
void SgdLoop(const float* __restrict grad, float* __restrict param,
             Buffer* __restrict momentum_buffer, size_t n,
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

class SgdKernel final : public OptimizerKernel {
 public:
  explicit SgdKernel(const OptimizerConfig& config)
      : config_(config), format_(SlotFormat::Of(config)) {}

  void Update(const float* grad, const ParamRun& run,
              const UpdateHyperParams& hparams) const override {
    SgdScalars s;
    s.weight_decay = static_cast<float>(hparams.weight_decay);
    s.momentum = static_cast<float>(config_.sgd_momentum);
    s.one_minus_dampening = static_cast<float>(1 - config_.sgd_dampening);
    s.neg_lr = static_cast<float>(-hparams.lr);
    const bool momentum = config_.sgd_momentum > 0;
    // Without momentum there is no buffer and nothing differs on step 1.
    const bool first_step = momentum && hparams.step == 1;
    const bool nesterov = momentum && config_.sgd_nesterov;
    WithTypedSlot(format_.dtypes[0], run.slots[0], [&](auto* buffer) {
      WithConstantBool(hparams.weight_decay != 0, [&](auto has_weight_decay) {
        WithConstantBool(momentum, [&](auto has_momentum) {
          WithConstantBool(first_step, [&](auto is_first_step) {
            WithConstantBool(nesterov, [&](auto is_nesterov) {
              SgdLoop<has_weight_decay, has_momentum, is_first_step,
                      is_nesterov>(grad, run.master, buffer, run.n, s);
            });
          });
        });
      });
    });
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
