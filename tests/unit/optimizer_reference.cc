#include "tests/unit/optimizer_reference.h"

#include <bit>
#include <random>

#include "gtest/gtest.h"

namespace depot::testing {
namespace {

// The gradient the update uses: torch's `-grad` with maximize.
Tracked Gradient(const OptimizerConfig& config, float grad) {
  return Exact(config.maximize ? -grad : grad);
}

void ReferenceAdamStep(const OptimizerConfig& config,
                       const UpdateHyperParams& hparams,
                       const std::vector<float>& grad, ReferenceState& state) {
  const double b1 = config.adam_beta1;
  const double b2 = config.adam_beta2;
  const double lr = hparams.lr;
  const double wd = hparams.weight_decay;
  const double step = static_cast<double>(hparams.step);
  const double bias_correction1 = 1 - std::pow(b1, step);
  const double bias_correction2 = 1 - std::pow(b2, step);
  const bool decoupled = config.kind == OptimizerKind::kAdamW;
  for (size_t i = 0; i < grad.size(); ++i) {
    Tracked g = Gradient(config, grad[i]);
    Tracked& p = state.master[i];
    Tracked& m = state.slots[0][i];
    Tracked& v = state.slots[1][i];
    if (decoupled) {
      p = (1 - lr * wd) * p;
    } else if (wd != 0) {
      g = g + wd * p;
    }
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * (g * g);
    Tracked second_moment = v;
    if (config.amsgrad) {
      Tracked& max_v = state.slots[2][i];
      max_v = Max(max_v, v);
      second_moment = max_v;
    }
    const Tracked denom =
        (1 / std::sqrt(bias_correction2)) * Sqrt(second_moment) +
        Exact(config.adam_eps);
    p = p - (lr / bias_correction1) * (m / denom);
  }
}

void ReferenceSgdStep(const OptimizerConfig& config,
                      const UpdateHyperParams& hparams,
                      const std::vector<float>& grad, ReferenceState& state) {
  const double mu = config.sgd_momentum;
  for (size_t i = 0; i < grad.size(); ++i) {
    Tracked g = Gradient(config, grad[i]);
    Tracked& p = state.master[i];
    if (hparams.weight_decay != 0) g = g + hparams.weight_decay * p;
    if (mu > 0) {
      Tracked& buf = state.slots[0][i];
      buf = hparams.step == 1 ? g : mu * buf + (1 - config.sgd_dampening) * g;
      g = config.sgd_nesterov ? g + mu * buf : buf;
    }
    p = p - hparams.lr * g;
  }
}

void ReferenceAdagradStep(const OptimizerConfig& config,
                          const UpdateHyperParams& hparams,
                          const std::vector<float>& grad,
                          ReferenceState& state) {
  const double clr = hparams.lr / (1 + static_cast<double>(hparams.step - 1) *
                                           config.adagrad_lr_decay);
  for (size_t i = 0; i < grad.size(); ++i) {
    Tracked g = Gradient(config, grad[i]);
    Tracked& p = state.master[i];
    Tracked& sum = state.slots[0][i];
    if (hparams.weight_decay != 0) g = g + hparams.weight_decay * p;
    sum = sum + g * g;
    const Tracked std_dev = Sqrt(sum) + Exact(config.adagrad_eps);
    p = p - clr * (g / std_dev);
  }
}

// sign(c) as a kernel computes it from its own c, which lies within the
// tolerance of c.value after `step` steps (WithinTolerance): exact where c is
// clear of zero. Closer to zero either sign is a correct result, so the value
// is 0 with a magnitude whose tolerance at this step covers -1 and +1; the
// weight that takes lr * sign(c) then carries that much latitude from here on.
Tracked SignWithinTolerance(const Tracked& c, uint64_t step) {
  const double unit_roundoff = std::ldexp(1.0, -24);
  const double slack = kUlpsPerStep * static_cast<double>(step) * unit_roundoff;
  if (c.value > slack * c.magnitude) return Exact(1);
  if (c.value < -slack * c.magnitude) return Exact(-1);
  if (c.magnitude == 0) return Exact(0);  // computed exactly: a true zero
  return {0, 1 / slack};
}

void ReferenceLionStep(const OptimizerConfig& config,
                       const UpdateHyperParams& hparams,
                       const std::vector<float>& grad, ReferenceState& state) {
  const double b1 = config.lion_beta1;
  const double b2 = config.lion_beta2;
  const double lr = hparams.lr;
  for (size_t i = 0; i < grad.size(); ++i) {
    const Tracked g = Gradient(config, grad[i]);
    Tracked& p = state.master[i];
    Tracked& m = state.slots[0][i];
    const Tracked c = b1 * m + (1 - b1) * g;
    p = (1 - lr * hparams.weight_decay) * p;
    p = p - lr * SignWithinTolerance(c, hparams.step);
    m = b2 * m + (1 - b2) * g;
  }
}

// Random magnitudes spread over several decades, random signs.
float RandomSigned(std::mt19937& rng, double log10_min, double log10_max) {
  std::uniform_real_distribution<double> exponent(log10_min, log10_max);
  const float magnitude = static_cast<float>(std::pow(10.0, exponent(rng)));
  return (rng() & 1) != 0 ? magnitude : -magnitude;
}

}  // namespace

void ReferenceStep(const OptimizerConfig& config,
                   const UpdateHyperParams& hparams,
                   const std::vector<float>& grad, ReferenceState& state) {
  switch (config.kind) {
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdam:
      ReferenceAdamStep(config, hparams, grad, state);
      return;
    case OptimizerKind::kSgd:
      ReferenceSgdStep(config, hparams, grad, state);
      return;
    case OptimizerKind::kAdagrad:
      ReferenceAdagradStep(config, hparams, grad, state);
      return;
    case OptimizerKind::kLion:
      ReferenceLionStep(config, hparams, grad, state);
      return;
  }
  ADD_FAILURE() << "no reference for optimizer kind "
                << static_cast<int>(config.kind);
}

std::vector<UpdateHyperParams> VaryingLrSteps(int count, double base_lr,
                                              double weight_decay) {
  std::vector<UpdateHyperParams> steps;
  for (int k = 1; k <= count; ++k) {
    steps.push_back({base_lr * (0.5 + 0.25 * (k % 4)), weight_decay,
                     static_cast<uint64_t>(k)});
  }
  return steps;
}

void ExpectKernelTracksReference(const OptimizerConfig& config,
                                 const std::vector<UpdateHyperParams>& steps) {
  constexpr size_t kElems = 4099;  // odd, so vector loops leave a tail
  constexpr int kMaxReports = 5;
  std::mt19937 rng(7);
  const int slots = OptimizerStateSlots(config);
  std::vector<float> master(kElems);
  std::vector<float> slot_data[kMaxStateSlots];
  ReferenceState reference;
  // Every eighth weight starts at zero, where the update is the whole value and
  // its error is not hidden behind the weight's magnitude.
  for (size_t i = 0; i < kElems; ++i) {
    master[i] = i % 8 == 0 ? 0.0f : RandomSigned(rng, -0.3, 0.3);
  }
  for (float p : master) reference.master.push_back(Exact(p));
  for (int k = 0; k < slots; ++k) {
    ASSERT_EQ(OptimizerSlotDType(config, k), DType::kFloat32)
        << "the double reference tracks fp32 slots only";
    slot_data[k].assign(kElems, 0.0f);
    // The slot's initial value as the kernel's state holds it: in fp32.
    reference.slots[k].assign(
        kElems,
        Exact(static_cast<float>(OptimizerSlotInitialValue(config, k))));
  }
  ParamRun run{master.data(), {}, kElems};
  for (int k = 0; k < slots; ++k) run.slots[k] = slot_data[k].data();
  InitOptimizerSlots(config, run);
  const std::unique_ptr<OptimizerKernel> kernel = MakeOptimizerKernel(config);
  ASSERT_NE(kernel, nullptr);
  int reports = 0;
  int step_index = 0;
  for (const UpdateHyperParams& hparams : steps) {
    ++step_index;
    std::vector<float> grad(kElems);
    for (float& g : grad) g = RandomSigned(rng, -3, 0);
    kernel->Update(grad.data(), run, hparams);
    ReferenceStep(config, hparams, grad, reference);
    auto check = [&](const char* what, const std::vector<float>& actual,
                     const std::vector<Tracked>& expected) {
      for (size_t i = 0; i < kElems; ++i) {
        if (WithinTolerance(actual[i], expected[i], step_index)) continue;
        if (++reports > kMaxReports) return;
        ADD_FAILURE() << what << "[" << i << "] after step " << hparams.step
                      << ": kernel " << actual[i] << ", reference "
                      << expected[i].value << " (magnitude "
                      << expected[i].magnitude << ")";
      }
    };
    check("master", master, reference.master);
    for (int k = 0; k < slots; ++k) {
      check("slot", slot_data[k], reference.slots[k]);
    }
  }
}

}  // namespace depot::testing
