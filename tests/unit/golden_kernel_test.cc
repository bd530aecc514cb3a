// The update kernels against PyTorch itself: every torch.optim case that
// tests/golden/generate.py recorded (amsgrad and maximize included) replayed
// through OptimizerKernel directly, tensor by tensor with each param group's
// per-step lr and weight decay, on every instruction set this CPU has. The
// weights after every step must equal torch's portable kernels' (the
// torch_default variant) bit for bit, as tests/integration/golden_test.cc
// requires of the servers; here nothing but the kernel is involved, so a
// difference points at the kernel's arithmetic.
#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "server/optimizer/kernel_isa.h"
#include "server/optimizer/optimizer_kernel.h"
#include "tests/integration/golden_data.h"

namespace depot {
namespace {

using ::depot::testing::GoldenCase;
using ::depot::testing::GoldenData;
using ::depot::testing::LoadGoldenData;

const absl::StatusOr<GoldenData>& Golden() {
  static const auto* const data =
      new absl::StatusOr<GoldenData>(LoadGoldenData(DEPOT_GOLDEN_DIR));
  return *data;
}

std::vector<KernelIsa> SupportedIsas() {
  std::vector<KernelIsa> isas;
  for (KernelIsa isa : {KernelIsa::kScalar, KernelIsa::kAvx2,
                        KernelIsa::kAvx512, KernelIsa::kAvx512Bf16}) {
    if (CpuSupportsKernelIsa(isa)) isas.push_back(isa);
  }
  return isas;
}

// The index of the first element whose bits differ, or -1.
int64_t FirstDifference(const std::vector<float>& a,
                        const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) {
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

// The packed weights after every step of training `golden`'s inputs with
// `config` on `isa`.
std::vector<std::vector<float>> Train(const GoldenData& data,
                                      const GoldenCase& golden,
                                      const OptimizerConfig& config,
                                      KernelIsa isa) {
  const size_t n = data.initial_weights.size();
  std::vector<float> master = data.initial_weights;
  // fp32 slots, as torch keeps them; packed like the weights.
  std::vector<std::vector<float>> slots(OptimizerStateSlots(config),
                                        std::vector<float>(n, 0.0f));
  // The run of the packed elements [offset, offset + numel).
  const auto run_at = [&](uint64_t offset, uint64_t numel) {
    ParamRun run;
    run.master = master.data() + offset;
    for (size_t k = 0; k < slots.size(); ++k) {
      run.slots[k] = slots[k].data() + offset;
    }
    run.n = numel;
    return run;
  };
  InitOptimizerSlots(config, run_at(0, n));
  const auto kernel = MakeOptimizerKernel(config);
  std::vector<std::vector<float>> trajectory;
  for (uint64_t step = 1; step <= data.steps; ++step) {
    uint64_t offset = 0;
    for (const TensorSpec& tensor : data.tensors) {
      const GroupHyperParams& group =
          golden.hparams[step - 1][tensor.param_group];
      kernel->Update(data.grads[step - 1].data() + offset,
                     run_at(offset, tensor.numel),
                     {group.lr, group.weight_decay, step}, isa);
      offset += tensor.numel;
    }
    trajectory.push_back(master);
  }
  return trajectory;
}

// The cases recorded with torch (every one but Lion's float64 reference).
std::vector<const GoldenCase*> TorchCases(const GoldenData& data) {
  std::vector<const GoldenCase*> cases;
  for (const GoldenCase& golden : data.cases) {
    if (golden.trajectories.contains("torch_default")) {
      cases.push_back(&golden);
    }
  }
  return cases;
}

TEST(GoldenKernelTest, EveryTorchCaseEqualsTorchPortableKernelsBitForBit) {
  ASSERT_TRUE(Golden().ok()) << Golden().status();
  const GoldenData& data = *Golden();
  const std::vector<const GoldenCase*> cases = TorchCases(data);
  // The flag cases are among them (tests/golden/README.md lists the cases).
  EXPECT_GE(cases.size(), 16u);
  for (const GoldenCase* golden : cases) {
    const std::vector<std::vector<float>>& expected =
        golden->trajectories.at("torch_default");
    for (KernelIsa isa : SupportedIsas()) {
      SCOPED_TRACE(golden->name + " on " + std::string(KernelIsaName(isa)));
      const std::vector<std::vector<float>> actual =
          Train(data, *golden, golden->optimizer, isa);
      for (size_t s = 0; s < expected.size(); ++s) {
        const int64_t diff = FirstDifference(actual[s], expected[s]);
        ASSERT_EQ(diff, -1)
            << "step " << s + 1 << ", packed element " << diff << ": kernel "
            << actual[s][diff] << ", torch " << expected[s][diff];
      }
    }
  }
}

// The flags matter on this data: with amsgrad or maximize switched off, the
// kernel no longer reproduces the flag cases, so the test above would catch
// a kernel that ignored either.
TEST(GoldenKernelTest, FlagCasesNeedTheirFlags) {
  ASSERT_TRUE(Golden().ok()) << Golden().status();
  const GoldenData& data = *Golden();
  int flag_cases = 0;
  for (const GoldenCase* golden : TorchCases(data)) {
    for (bool OptimizerConfig::*flag :
         {&OptimizerConfig::amsgrad, &OptimizerConfig::maximize}) {
      if (!(golden->optimizer.*flag)) continue;
      ++flag_cases;
      OptimizerConfig without = golden->optimizer;
      without.*flag = false;
      const std::vector<float>& last =
          golden->trajectories.at("torch_default").back();
      EXPECT_NE(
          FirstDifference(
              Train(data, *golden, without, KernelIsa::kScalar).back(), last),
          -1)
          << golden->name;
    }
  }
  EXPECT_EQ(flag_cases, 8);  // 3 with amsgrad, 5 with maximize
}

}  // namespace
}  // namespace depot
