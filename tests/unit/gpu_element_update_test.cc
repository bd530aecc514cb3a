// The GPU kernels' fused update (client/src/gpu/kernels.h) is the server's,
// bit for bit, shown on the host: the element function the CUDA kernel runs
// (ElementFunctions::Update, client/src/gpu/element_update.h), with the math
// variant the kernel's launcher picks (WithOptimizerMath) and the arguments it
// builds (MakeUpdateArgs), is compiled here for the host over HostIeeeOps, a
// vector-ops type of the same single IEEE operations as the device's CudaOps
// (device_ops.h), and compared with OptimizerKernel::FusedUpdate on the same
// random finite inputs: every optimizer and variant, several steps, each
// gradient dtype, several parts, unscale and clip, fp32 and bf16 slots, and
// weights out in each dtype. What this cannot show, that CudaOps' intrinsics
// and conversions are those IEEE operations, tests/gpu/gpu_kernels_test.cc
// shows on a GPU.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/src/gpu/element_update.h"
#include "client/src/gpu/kernel_args.h"
#include "depot/dtype.h"
#include "depot/job_config.h"
#include "gtest/gtest.h"
#include "server/optimizer/fused_update.h"
#include "server/optimizer/optimizer_kernel.h"
#include "server/optimizer/slot_storage.h"
#include "tests/unit/gpu_update_cases.h"

namespace depot::gpu {
namespace {

using update_cases::Case;
using update_cases::Cases;
using update_cases::FirstDifference;
using update_cases::GradientParts;
using update_cases::InitialState;
using update_cases::MakeGradient;
using update_cases::State;
using update_cases::StepHyperParams;

// CudaOps' operations on the host: each +, -, *, / and sqrt rounds once, to
// nearest (this file is compiled with -ffp-contract=off, so nothing fuses);
// Neg, Max, Select as every vec_ops type; bf16 through the same
// slot_storage.h code CudaOps calls, fp16 through depot/dtype.h, which the
// device's conversions match (tested on a GPU). Inputs are finite, so the
// order of a NaN's operands never matters here.
struct HostIeeeOps {
  using F = float;
  using Mask = bool;
  static constexpr size_t kLanes = 1;

  static F Set(float x) { return x; }
  static F Add(F a, F b) { return a + b; }
  static F Mul(F a, F b) { return a * b; }
  static F Sub(F a, F b) { return a - b; }
  static F Div(F a, F b) { return a / b; }
  static F Sqrt(F a) { return std::sqrt(a); }
  static F Neg(F a) {
    return std::bit_cast<F>(std::bit_cast<uint32_t>(a) ^ 0x80000000u);
  }
  static F Max(F a, F b) { return a != a ? a : (a > b ? a : b); }
  static Mask Greater(F a, F b) { return a > b; }
  static Mask Less(F a, F b) { return a < b; }
  static F Select(Mask m, F if_true, F if_false) {
    return m ? if_true : if_false;
  }
  static F LoadF32(const float* p) { return *p; }
  static void StoreF32(float* p, F x) { *p = x; }
  static F LoadBF16(const uint16_t* p) { return LoadSlot(*p); }
  static void StoreBF16(uint16_t* p, F x) { StoreSlot(*p, x); }
  static F LoadF16(const uint16_t* p) { return HalfToFloat(*p); }
  static void StoreF16(uint16_t* p, F x) { *p = FloatToHalf(x); }
};

// What --use_fast_math's -prec-div=false would do: a / b as a * (1 / b), two
// roundings. The comparison must catch it.
struct ApproximateDivisionOps : HostIeeeOps {
  static F Div(F a, F b) { return a * (1.0f / b); }
};

class GpuElementUpdateTest : public ::testing::Test {
 protected:
  static constexpr size_t kN = 1027;  // not a multiple of any vector width
  static constexpr int kSteps = 4;

  // Runs kSteps updates of `c` on the server (scalar reference) and on the
  // GPU path's element function over Ops, from the same random state and
  // gradients; returns the first difference after any step ("" for none).
  // Swapped: the element path gets the unscale factor and the clip
  // coefficient in each other's place (the same factors, another order).
  template <class Ops>
  std::string Compare(const Case& c, bool swapped_factors = false) {
    std::mt19937 rng(12345);
    State server = InitialState(c, kN, rng);
    State element = server;
    const State initial = server;
    std::unique_ptr<OptimizerKernel> kernel = MakeOptimizerKernel(c.config);
    for (int step = 1; step <= kSteps; ++step) {
      const std::vector<std::vector<unsigned char>> parts =
          GradientParts(c, kN, rng);
      std::vector<const void*> part_pointers;
      for (const auto& part : parts) part_pointers.push_back(part.data());
      const GradientInput grad = MakeGradient(c, part_pointers);
      const UpdateHyperParams hparams = StepHyperParams(c, step);

      WeightsOutput server_weights;
      if (c.has_weights)
        server_weights = {c.weight_dtype, server.weights.data()};
      kernel->FusedUpdate(grad, server.Run(), hparams, server_weights,
                          KernelIsa::kScalar);

      WeightsOutput element_weights;
      if (c.has_weights) {
        element_weights = {c.weight_dtype, element.weights.data()};
      }
      const fused::OptimizerStep prepared = kernel->PrepareStep(hparams);
      absl::StatusOr<UpdateArgs> args = MakeUpdateArgs(
          c.config, prepared, grad, element.Run(), element_weights);
      if (!args.ok()) return std::string(args.status().message());
      if (swapped_factors) {
        std::swap(args->grad.unscale_factor, args->grad.clip_coef);
      }
      WithOptimizerMath<Ops, void>(prepared, [&](const auto& math) {
        for (size_t i = 0; i < kN; ++i) {
          ElementFunctions<Ops>::Update(math, *args, i);
        }
      });
      const std::string difference = FirstDifference(server, element);
      if (!difference.empty()) {
        return absl::StrCat("step ", step, ": ", difference);
      }
    }
    // The inputs were not trivial: almost every master weight moved, and
    // nothing overflowed.
    size_t moved = 0;
    for (size_t i = 0; i < kN; ++i) {
      EXPECT_TRUE(std::isfinite(server.master[i])) << c.name << " at " << i;
      moved += server.master[i] != initial.master[i];
    }
    EXPECT_GT(moved, kN * 9 / 10) << c.name;
    return "";
  }
};

TEST_F(GpuElementUpdateTest, EqualsTheServersFusedUpdateBitForBit) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(Compare<HostIeeeOps>(c), "");
  }
}

TEST_F(GpuElementUpdateTest, ComparisonCatchesAnApproximateDivision) {
  // Adam and Adagrad divide on every element: two roundings instead of one
  // must show within a few steps.
  for (const Case& c : Cases()) {
    if (c.config.kind != OptimizerKind::kAdamW &&
        c.config.kind != OptimizerKind::kAdagrad) {
      continue;
    }
    SCOPED_TRACE(c.name);
    EXPECT_NE(Compare<ApproximateDivisionOps>(c), "");
  }
}

TEST_F(GpuElementUpdateTest, ComparisonCatchesClipBeforeUnscale) {
  // (g * clip) * unscale rounds differently from (g * unscale) * clip for
  // some elements: the server's order is part of the contract.
  int compared = 0;
  for (const Case& c : Cases()) {
    if (!c.unscale || !c.clip) continue;
    SCOPED_TRACE(c.name);
    EXPECT_NE(Compare<HostIeeeOps>(c, /*swapped_factors=*/true), "");
    ++compared;
  }
  EXPECT_GT(compared, 3);
}

// MakeUpdateArgs: the launcher's checks, so a bad call queues nothing.
class MakeUpdateArgsTest : public ::testing::Test {
 protected:
  MakeUpdateArgsTest() : kernel_(MakeOptimizerKernel(config_)) {
    parts_[0] = grad_.data();
    input_.parts = parts_;
    input_.num_parts = 1;
    run_.master = master_.data();
    run_.slots[0] = exp_avg_.data();
    run_.slots[1] = exp_avg_sq_.data();
    run_.n = master_.size();
  }

  absl::StatusOr<UpdateArgs> Make() {
    return MakeUpdateArgs(config_, kernel_->PrepareStep(UpdateHyperParams()),
                          input_, run_, weights_);
  }

  OptimizerConfig config_;  // AdamW: two slots
  std::unique_ptr<OptimizerKernel> kernel_;
  std::vector<float> grad_ = std::vector<float>(16, 1.0f);
  std::vector<float> master_ = std::vector<float>(16, 0.0f);
  std::vector<float> exp_avg_ = std::vector<float>(16, 0.0f);
  std::vector<float> exp_avg_sq_ = std::vector<float>(16, 0.0f);
  const void* parts_[kMaxGradientParts + 1] = {};
  GradientInput input_;
  ParamRun run_;
  WeightsOutput weights_;
};

TEST_F(MakeUpdateArgsTest, AppliesTheOffsetAndTakesTheSlotsTheConfigKeeps) {
  input_.offset = 3;
  absl::StatusOr<UpdateArgs> args = Make();
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->grad.parts[0], grad_.data() + 3);
  EXPECT_EQ(args->slots[1], exp_avg_sq_.data());
  EXPECT_EQ(args->slots[2], nullptr);
  EXPECT_EQ(args->weights, nullptr);
}

TEST_F(MakeUpdateArgsTest, RejectsAMissingSlot) {
  run_.slots[1] = nullptr;
  EXPECT_EQ(Make().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Make().status().message().find("state slot 1"), std::string::npos);
}

TEST_F(MakeUpdateArgsTest, RejectsTooManyOrNoGradientParts) {
  for (size_t w = 0; w <= kMaxGradientParts; ++w) parts_[w] = grad_.data();
  input_.num_parts = kMaxGradientParts + 1;
  EXPECT_EQ(Make().status().code(), absl::StatusCode::kInvalidArgument);
  input_.num_parts = 0;
  EXPECT_EQ(Make().status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(MakeUpdateArgsTest, RejectsMisalignedOrNullArrays) {
  run_.master = reinterpret_cast<float*>(
      reinterpret_cast<unsigned char*>(master_.data()) + 2);
  EXPECT_EQ(Make().status().code(), absl::StatusCode::kInvalidArgument);
  run_.master = nullptr;
  EXPECT_EQ(Make().status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(MakeUpdateArgsTest, RejectsAnInvalidDType) {
  weights_ = {static_cast<DType>(9), master_.data()};
  EXPECT_EQ(Make().status().code(), absl::StatusCode::kInvalidArgument);
  weights_ = WeightsOutput();
  input_.dtype = static_cast<DType>(0);
  EXPECT_EQ(Make().status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace depot::gpu
