// Kernels with bf16 state slots (Megatron's exp_avg_dtype / exp_avg_sq_dtype)
// against their reference: the same kernel with fp32 slots whose values are
// rounded to bf16 (nearest, ties to even) after every step. A bf16 slot is
// loaded exactly, updated in fp32 and stored rounded, so the two must agree bit
// for bit; the fp32 kernels themselves are held to the double-precision
// reference in the per-optimizer tests.
#include <bit>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "depot/dtype.h"
#include "gtest/gtest.h"
#include "server/optimizer/optimizer_kernel.h"
#include "server/optimizer/slot_storage.h"

namespace depot {
namespace {

struct Variant {
  std::string name;
  OptimizerConfig config;  // with some slot in bf16
};

std::vector<Variant> Bf16Variants() {
  std::vector<Variant> out;
  OptimizerConfig adamw;
  adamw.exp_avg_dtype = DType::kBFloat16;
  adamw.exp_avg_sq_dtype = DType::kBFloat16;
  out.push_back({"adamw, both moments bf16", adamw});
  OptimizerConfig adam = adamw;
  adam.kind = OptimizerKind::kAdam;
  adam.exp_avg_sq_dtype = DType::kFloat32;
  out.push_back({"adam, exp_avg bf16", adam});
  adam.exp_avg_dtype = DType::kFloat32;
  adam.exp_avg_sq_dtype = DType::kBFloat16;
  out.push_back({"adam, exp_avg_sq bf16", adam});
  // max_exp_avg_sq takes exp_avg_sq's dtype.
  OptimizerConfig amsgrad = adamw;
  amsgrad.amsgrad = true;
  out.push_back({"adamw amsgrad, every slot bf16", amsgrad});
  amsgrad.kind = OptimizerKind::kAdam;
  amsgrad.exp_avg_dtype = DType::kFloat32;
  amsgrad.maximize = true;
  out.push_back({"adam amsgrad maximize, exp_avg_sq and max bf16", amsgrad});
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.sgd_momentum = 0.9;
  sgd.sgd_dampening = 0.1;
  sgd.exp_avg_dtype = DType::kBFloat16;
  out.push_back({"sgd momentum bf16", sgd});
  sgd.sgd_dampening = 0;
  sgd.sgd_nesterov = true;
  out.push_back({"sgd nesterov bf16", sgd});
  OptimizerConfig adagrad;
  adagrad.kind = OptimizerKind::kAdagrad;
  adagrad.adagrad_lr_decay = 0.05;
  adagrad.adagrad_initial_accumulator_value = 0.1;  // not a bf16 value
  adagrad.exp_avg_sq_dtype = DType::kBFloat16;
  out.push_back({"adagrad state_sum bf16", adagrad});
  OptimizerConfig lion;
  lion.kind = OptimizerKind::kLion;
  lion.exp_avg_dtype = DType::kBFloat16;
  out.push_back({"lion bf16", lion});
  return out;
}

OptimizerConfig WithFp32Slots(OptimizerConfig config) {
  config.exp_avg_dtype = DType::kFloat32;
  config.exp_avg_sq_dtype = DType::kFloat32;
  return config;
}

// Rounds fp32 values to the nearest bf16 in place.
void RoundToBf16(std::vector<float>& values) {
  std::vector<uint16_t> bf16(values.size());
  ConvertFromFloat(values.data(), DType::kBFloat16, bf16.data(), values.size());
  ConvertToFloat(DType::kBFloat16, bf16.data(), values.data(), values.size());
}

// `values` stored as `dtype`: the bytes a slot of that dtype holds.
std::vector<unsigned char> StoredAs(const std::vector<float>& values,
                                    DType dtype) {
  std::vector<unsigned char> bytes(values.size() * DTypeSize(dtype));
  ConvertFromFloat(values.data(), dtype, bytes.data(), values.size());
  return bytes;
}

std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> bits;
  for (float v : values) bits.push_back(std::bit_cast<uint32_t>(v));
  return bits;
}

TEST(Bf16MomentsTest, MatchFp32KernelWithMomentsRoundedToBf16EachStep) {
  // More than two staging blocks, and a tail.
  constexpr size_t kElems = 4099 + 1000;
  constexpr int kSteps = 10;
  for (const Variant& variant : Bf16Variants()) {
    SCOPED_TRACE(variant.name);
    const OptimizerConfig& bf16_config = variant.config;
    const OptimizerConfig fp32_config = WithFp32Slots(bf16_config);
    const int slots = OptimizerStateSlots(bf16_config);
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> weight(-1.0f, 1.0f);
    std::normal_distribution<float> gradient(0.0f, 0.3f);

    std::vector<float> master(kElems);
    for (float& w : master) w = weight(rng);
    std::vector<float> emulated_master = master;
    // The kernel under test keeps its slots in their dtypes; the emulation
    // keeps fp32 slots and rounds the bf16 ones itself.
    std::vector<unsigned char> stored[kMaxStateSlots];
    std::vector<float> emulated[kMaxStateSlots];
    ParamRun run{master.data(), {}, kElems};
    ParamRun emulated_run{emulated_master.data(), {}, kElems};
    for (int k = 0; k < slots; ++k) {
      stored[k].assign(kElems * DTypeSize(OptimizerSlotDType(bf16_config, k)),
                       0);
      emulated[k].assign(kElems, 0.0f);
      run.slots[k] = stored[k].data();
      emulated_run.slots[k] = emulated[k].data();
    }
    InitOptimizerSlots(bf16_config, run);
    InitOptimizerSlots(fp32_config, emulated_run);
    auto round_emulated_bf16_slots = [&] {
      for (int k = 0; k < slots; ++k) {
        if (OptimizerSlotDType(bf16_config, k) == DType::kBFloat16) {
          RoundToBf16(emulated[k]);
        }
      }
    };
    round_emulated_bf16_slots();

    const auto kernel = MakeOptimizerKernel(bf16_config);
    const auto fp32_kernel = MakeOptimizerKernel(fp32_config);
    for (int step = 1; step <= kSteps; ++step) {
      std::vector<float> grad(kElems);
      for (float& g : grad) g = gradient(rng);
      const UpdateHyperParams hparams{0.01 * (1 + step % 3), 0.05,
                                      static_cast<uint64_t>(step)};
      kernel->Update(grad.data(), run, hparams);
      fp32_kernel->Update(grad.data(), emulated_run, hparams);
      round_emulated_bf16_slots();

      EXPECT_EQ(Bits(master), Bits(emulated_master)) << "step " << step;
      for (int k = 0; k < slots; ++k) {
        // Exact: the emulated bf16 slots hold bf16 values.
        EXPECT_TRUE(stored[k] ==
                    StoredAs(emulated[k], OptimizerSlotDType(bf16_config, k)))
            << "slot " << k << " step " << step;
      }
      if (::testing::Test::HasFailure()) break;
    }
  }
}

// SGD's first step stores the gradient itself in the buffer, which shows the
// rounding directly: 1 + 2^-8 + 2^-10 is above the midpoint of 1 and 1 + 2^-7
// (truncation would give 1), and 1 + 3 * 2^-8 is the midpoint of 1 + 2^-7
// and 1 + 2^-6, which goes to the even one, 1 + 2^-6.
TEST(Bf16MomentsTest, StoresMomentsRoundedToNearestEven) {
  OptimizerConfig config;
  config.kind = OptimizerKind::kSgd;
  config.sgd_momentum = 0.9;
  config.exp_avg_dtype = DType::kBFloat16;
  std::vector<float> master = {0.0f, 0.0f};
  std::vector<uint16_t> buffer = {0, 0};
  const std::vector<float> grad = {1.0f + 0x1p-8f + 0x1p-10f,
                                   1.0f + 3 * 0x1p-8f};
  MakeOptimizerKernel(config)->Update(
      grad.data(), {master.data(), {buffer.data(), nullptr}, 2}, {0.5, 0.0, 1});
  EXPECT_EQ(BFloat16ToFloat(buffer[0]), 1.0f + 0x1p-7f);
  EXPECT_EQ(BFloat16ToFloat(buffer[1]), 1.0f + 0x1p-6f);
}

// The rounding is storage only: the step's own weight update uses the fp32
// value it has just computed.
TEST(Bf16MomentsTest, UpdatesTheWeightsWithTheUnroundedMoment) {
  OptimizerConfig config;
  config.kind = OptimizerKind::kSgd;
  config.sgd_momentum = 0.9;
  config.exp_avg_dtype = DType::kBFloat16;
  std::vector<float> master = {4.0f};
  std::vector<uint16_t> buffer = {0};
  const float g = 1.0f + 0x1p-8f + 0x1p-10f;
  MakeOptimizerKernel(config)->Update(
      &g, {master.data(), {buffer.data(), nullptr}, 1}, {1.0, 0.0, 1});
  EXPECT_EQ(master[0], 4.0f - g);  // not 4 - (1 + 2^-7)
}

// The kernels' inlined bf16 load and store (slot_storage.h) against the
// shared conversions of depot/dtype.h: every bf16 value widens the same, and
// narrowing agrees for every upper half with every class of lower half (zero,
// just below, at and just above the tie, the largest) and a few others: all
// the ways rounding, carrying into the exponent, Inf and NaN can go.
TEST(Bf16MomentsTest, SlotLoadAndStoreAgreeWithTheSharedConversions) {
  for (uint32_t high = 0; high <= 0xffff; ++high) {
    const uint16_t bf16 = static_cast<uint16_t>(high);
    ASSERT_EQ(std::bit_cast<uint32_t>(LoadSlot(bf16)),
              std::bit_cast<uint32_t>(BFloat16ToFloat(bf16)))
        << std::hex << high;
    for (uint32_t low : {0x0000u, 0x0001u, 0x3c21u, 0x7fffu, 0x8000u, 0x8001u,
                         0xc5a9u, 0xffffu}) {
      const float value = std::bit_cast<float>((high << 16) | low);
      uint16_t stored = 0;
      StoreSlot(stored, value);
      ASSERT_EQ(stored, FloatToBFloat16(value))
          << std::hex << ((high << 16) | low);
    }
  }
}

TEST(Bf16MomentsTest, AdagradStateSumStartsAtTheBf16OfTheAccumulator) {
  OptimizerConfig config;
  config.kind = OptimizerKind::kAdagrad;
  config.adagrad_initial_accumulator_value = 0.1;
  config.exp_avg_sq_dtype = DType::kBFloat16;
  std::vector<float> master = {7.0f, 7.0f, 7.0f};
  std::vector<uint16_t> state_sum(3, 0);
  InitOptimizerSlots(config, {master.data(), {state_sum.data(), nullptr}, 3});
  EXPECT_EQ(state_sum, std::vector<uint16_t>(3, FloatToBFloat16(0.1f)));
  EXPECT_EQ(master, std::vector<float>(3, 7.0f));
}

}  // namespace
}  // namespace depot
