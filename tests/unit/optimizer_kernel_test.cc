// Properties every kernel must have: the factory covers every kind, and an
// update is a pure element-wise function of (grad, state, hparams), so a shard
// may be split into runs (and threads) in any way and give the same bits. The
// integration tests rely on this to compare the server with an in-process
// kernel.
#include "server/optimizer/optimizer_kernel.h"

#include <bit>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace depot {
namespace {

struct NamedConfig {
  std::string name;
  OptimizerConfig config;
};

std::vector<NamedConfig> EveryKernelVariant() {
  std::vector<NamedConfig> out;
  OptimizerConfig config;
  config.kind = OptimizerKind::kAdamW;
  out.push_back({"adamw", config});
  config.kind = OptimizerKind::kAdam;
  out.push_back({"adam", config});
  config.kind = OptimizerKind::kSgd;
  config.sgd_momentum = 0;
  out.push_back({"sgd", config});
  config.sgd_momentum = 0.9;
  config.sgd_dampening = 0.1;
  out.push_back({"sgd momentum", config});
  config.sgd_dampening = 0;
  config.sgd_nesterov = true;
  out.push_back({"sgd nesterov", config});
  config.exp_avg_dtype = DType::kBFloat16;
  out.push_back({"sgd nesterov bf16", config});
  config = OptimizerConfig();
  config.kind = OptimizerKind::kAdagrad;
  config.adagrad_lr_decay = 0.1;
  config.adagrad_initial_accumulator_value = 0.1;
  out.push_back({"adagrad", config});
  config.exp_avg_sq_dtype = DType::kBFloat16;
  out.push_back({"adagrad bf16", config});
  config = OptimizerConfig();
  config.kind = OptimizerKind::kLion;
  out.push_back({"lion", config});
  config.exp_avg_dtype = DType::kBFloat16;
  out.push_back({"lion bf16", config});
  config = OptimizerConfig();
  config.exp_avg_dtype = DType::kBFloat16;
  config.exp_avg_sq_dtype = DType::kBFloat16;
  out.push_back({"adamw bf16", config});
  config.exp_avg_dtype = DType::kFloat32;
  config.kind = OptimizerKind::kAdam;
  out.push_back({"adam fp32 exp_avg, bf16 exp_avg_sq", config});
  config = OptimizerConfig();
  config.amsgrad = true;
  out.push_back({"adamw amsgrad", config});
  config.kind = OptimizerKind::kAdam;
  config.exp_avg_sq_dtype = DType::kBFloat16;
  out.push_back({"adam amsgrad, bf16 exp_avg_sq and max", config});
  // maximize on every kind.
  const size_t unflagged = out.size();
  for (size_t i = 0; i < unflagged; ++i) {
    if (out[i].config.maximize) continue;
    NamedConfig flagged = out[i];
    flagged.name += " maximize";
    flagged.config.maximize = true;
    out.push_back(flagged);
  }
  return out;
}

// A run's arrays, owned; each slot holds its dtype's bytes.
struct RunState {
  std::vector<float> master;
  std::vector<unsigned char> slots[kMaxStateSlots];
  size_t slot_bytes[kMaxStateSlots] = {0, 0, 0};

  RunState(const OptimizerConfig& config, size_t n, std::mt19937& rng) {
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    master.resize(n);
    for (float& x : master) x = value(rng);
    for (int k = 0; k < OptimizerStateSlots(config); ++k) {
      slot_bytes[k] = DTypeSize(OptimizerSlotDType(config, k));
      slots[k].assign(n * slot_bytes[k], 0);
    }
    InitOptimizerSlots(config, Run(0, n));
  }

  // The sub-run [begin, end).
  ParamRun Run(size_t begin, size_t end) {
    ParamRun run{master.data() + begin, {}, end - begin};
    for (int k = 0; k < kMaxStateSlots; ++k) {
      if (slot_bytes[k] != 0) {
        run.slots[k] = slots[k].data() + begin * slot_bytes[k];
      }
    }
    return run;
  }
};

std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> bits;
  for (float v : values) bits.push_back(std::bit_cast<uint32_t>(v));
  return bits;
}

void ExpectBitwiseEqual(const RunState& a, const RunState& b,
                        const std::string& what) {
  EXPECT_EQ(Bits(a.master), Bits(b.master)) << what << ": master";
  // Compared as a whole: printing thousands of bytes would help nobody.
  for (int k = 0; k < kMaxStateSlots; ++k) {
    EXPECT_TRUE(a.slots[k] == b.slots[k]) << what << ": slot " << k;
  }
}

std::vector<float> RandomGrad(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> value(0.0f, 0.5f);
  std::vector<float> grad(n);
  for (float& g : grad) g = value(rng);
  return grad;
}

TEST(MakeOptimizerKernelTest, ReturnsAKernelForEveryKind) {
  for (const NamedConfig& variant : EveryKernelVariant()) {
    EXPECT_NE(MakeOptimizerKernel(variant.config), nullptr) << variant.name;
  }
}

TEST(OptimizerKernelTest, SplittingARunGivesBitwiseIdenticalResults) {
  // Long enough that every piece below has a vectorised body and a tail.
  constexpr size_t kElems = 5000;
  constexpr int kSteps = 5;
  for (const NamedConfig& variant : EveryKernelVariant()) {
    std::mt19937 rng(11);
    RunState whole(variant.config, kElems, rng);
    RunState pieces = whole;
    const auto kernel = MakeOptimizerKernel(variant.config);
    for (int step = 1; step <= kSteps; ++step) {
      const std::vector<float> grad = RandomGrad(kElems, rng);
      const UpdateHyperParams hparams{1e-2 * step, 0.05,
                                      static_cast<uint64_t>(step)};
      kernel->Update(grad.data(), whole.Run(0, kElems), hparams);
      // Odd-sized, misaligned pieces that move from step to step.
      const size_t cuts[] = {0,
                             1,
                             17 + static_cast<size_t>(step),
                             513 - static_cast<size_t>(step) * 3,
                             2100 + static_cast<size_t>(step),
                             4999,
                             kElems};
      for (size_t i = 0; i + 1 < std::size(cuts); ++i) {
        kernel->Update(grad.data() + cuts[i], pieces.Run(cuts[i], cuts[i + 1]),
                       hparams);
      }
    }
    ExpectBitwiseEqual(whole, pieces, variant.name);
  }
}

// torch's maximize is `grad = -grad` before anything else: the update with
// maximize is, bit for bit, the update without it of the negated gradient.
TEST(OptimizerKernelTest, MaximizeIsTheUpdateOfTheNegatedGradient) {
  constexpr size_t kElems = 1000;
  constexpr int kSteps = 3;
  for (const NamedConfig& variant : EveryKernelVariant()) {
    if (!variant.config.maximize) continue;
    OptimizerConfig descending = variant.config;
    descending.maximize = false;
    std::mt19937 rng(13);
    RunState ascent(variant.config, kElems, rng);
    RunState descent = ascent;
    const auto kernel = MakeOptimizerKernel(variant.config);
    const auto plain_kernel = MakeOptimizerKernel(descending);
    for (int step = 1; step <= kSteps; ++step) {
      std::vector<float> grad = RandomGrad(kElems, rng);
      // The signs of a zero and of a NaN count too: torch's -grad flips both.
      grad[step] = 0.0f;
      grad[kElems - step] = std::bit_cast<float>(uint32_t{0x7fc12345});
      const UpdateHyperParams hparams{1e-2, 0.05, static_cast<uint64_t>(step)};
      kernel->Update(grad.data(), ascent.Run(0, kElems), hparams);
      for (float& g : grad) g = -g;
      plain_kernel->Update(grad.data(), descent.Run(0, kElems), hparams);
    }
    ExpectBitwiseEqual(ascent, descent, variant.name);
  }
}

TEST(OptimizerKernelTest, UpdateKeepsNoStateBetweenCalls) {
  constexpr size_t kElems = 257;
  for (const NamedConfig& variant : EveryKernelVariant()) {
    std::mt19937 rng(5);
    RunState first(variant.config, kElems, rng);
    RunState second = first;
    RunState unrelated(variant.config, kElems, rng);
    const std::vector<float> grad = RandomGrad(kElems, rng);
    const std::vector<float> other_grad = RandomGrad(kElems, rng);
    const UpdateHyperParams hparams{1e-2, 0.1, 3};
    const auto kernel = MakeOptimizerKernel(variant.config);
    kernel->Update(grad.data(), first.Run(0, kElems), hparams);
    // Another run with other hyperparameters in between changes nothing.
    kernel->Update(other_grad.data(), unrelated.Run(0, kElems), {0.5, 0.0, 1});
    kernel->Update(grad.data(), second.Run(0, kElems), hparams);
    ExpectBitwiseEqual(first, second, variant.name);
  }
}

}  // namespace
}  // namespace depot
