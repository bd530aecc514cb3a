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
  return out;
}

// A run's arrays, owned; each slot holds its dtype's bytes.
struct RunState {
  std::vector<float> master;
  std::vector<unsigned char> slots[2];
  size_t slot_bytes[2] = {0, 0};

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
    return {master.data() + begin,
            {slots[0].data() + begin * slot_bytes[0],
             slots[1].data() + begin * slot_bytes[1]},
            end - begin};
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
  EXPECT_TRUE(a.slots[0] == b.slots[0]) << what << ": slot 0";
  EXPECT_TRUE(a.slots[1] == b.slots[1]) << what << ": slot 1";
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
