// Golden trajectories: the optimizer runs tests/golden/generate.py recorded
// with PyTorch (and Lion in float64), replayed through two real depot-server
// processes. The fp32 master weights pulled after every step must match the
// recording: three tensors in two param groups, chunks of 32 elements (so
// tensors span chunks and servers), 24 steps with each group's lr and weight
// decay changing every step and sent with the step.
//
// What "match" means, per recorded variant (tests/golden/README.md):
//
// torch_default: torch 1.13's float32 single-tensor optimizers on its portable
//   CPU kernels (ATEN_CPU_CAPABILITY=default). They do the same fp32
//   operations in the same order as Depot's kernels (docs/optimizers.md), each
//   rounded once, so the servers must reproduce them BIT FOR BIT over all 24
//   steps. Any difference is a real divergence from torch.optim.
//
// torch_avx2: the same runs on torch's AVX2 kernels, which every recent x86-64
//   machine uses. There add(x, alpha=a) (Adam's first moment, every SGD update
//   and momentum, the L2 weight decay of Adam, SGD and Adagrad) and addcmul
//   (Adam's second moment, Adagrad's sum of squares) are fused multiply-adds:
//   torch rounds a*x + y once where Depot (built with -ffp-contract=off, so
//   that its bits never depend on the CPU) rounds the product and the sum.
//   (Checked: an fp32 model of Adam with exactly those two fusions reproduces
//   the torch_avx2 trajectory bit for bit.) The other places where an order
//   could differ, Adam's denominator (sqrt(v) / bc2_sqrt + eps) and addcdiv (p
//   + value * m / denom, which has a division and cannot fuse), round the same
//   on both kernel sets. A fused rounding differs from the two-rounding one by
//   at most half an ulp of the product; in a moment it changes the update by a
//   relative 2^-24 or so, and it reaches a weight as a flip of the weight's
//   final rounding, about one ulp of the weight, at most once per step; flips
//   mostly cancel over steps. We measure errors in units of u*W, where u =
//   2^-24 is fp32's unit roundoff and W the largest |weight| of the trajectory
//   so far (the magnitude at which the weights are rounded: an element that has
//   crossed zero keeps the error it picked up while it was large, so its own
//   magnitude is the wrong yardstick). Measured on the committed data: at most
//   2.96 u*W (sgd_maximize; sgd_weight_decay 2.66, step 9; Adam/AdamW <= 1.9,
//   other SGD <= 2.1, Adagrad 2.0), at most 1.2e-7 in absolute terms. Tolerance: 3 u*W. Semantic slips
//   are far larger (measured with an fp32 model of the kernels against the same
//   data): weight decay one step late 9200 u*W, a group's lr one step late
//   2.5e5, decay on the no-decay group 1.5e5, Adagrad's lr_decay ignored 2.2e5;
//   even eps 1e-7 instead of 1e-8 is 30 u*W. (The torch_default test above
//   catches all of them at the first differing bit.)
//
// float64 (Lion): the reference keeps its state in float64 and rounds only the
//   stored weights, so it is within u*W of the exact trajectory. The server
//   computes p = p * float(1 - lr*wd) - float(lr) * sign(c) in fp32: per step
//   at most u*W from the rounding of the product, u*W/2 from rounding the
//   decay factor (|1 - lr*wd| < 1) and u*W from the subtraction (the rounding
//   of float(lr) is below u*lr, negligible), while the decay factor does not
//   amplify earlier errors. So after step s the error is at most
//   (1 + 2.5 s) u*W. Measured: 6.06 u*W (step 11). A sign of c that differs
//   from the float64 one would move a weight by 2 lr >= 5e-4, over 10^4 u*W.
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bitwise_compare.h"
#include "client_training.h"
#include "golden_data.h"
#include "gtest/gtest.h"
#include "two_servers.h"

namespace depot::testing {
namespace {

constexpr uint64_t kChunkElems = 32;
constexpr uint64_t kAlignmentElems = 8;
constexpr double kUnitRoundoff = 0x1p-24;
constexpr double kFmaToleranceUW = 3.0;  // torch_avx2, see the file comment

// The committed data, loaded once; a load error fails the test that asks.
const absl::StatusOr<GoldenData>& Golden() {
  static const auto* const data =
      new absl::StatusOr<GoldenData>(LoadGoldenData(DEPOT_GOLDEN_DIR));
  return *data;
}

// "tensor[index]" for packed element `i`.
std::string ElementName(const std::vector<TensorSpec>& tensors, size_t i) {
  for (const TensorSpec& tensor : tensors) {
    if (i < tensor.numel) return absl::StrFormat("%s[%d]", tensor.name, i);
    i -= tensor.numel;
  }
  return absl::StrFormat("element %d past the tensors", i);
}

// Checks each step's weights against the recording, allowing
// allowed_uw(step) * u * W of error (W as in the file comment). The message
// names the first element over the bound; a passing result records the
// largest error seen, so a test log shows how much room is left.
::testing::AssertionResult WithinTolerance(
    const std::vector<TensorSpec>& tensors,
    const std::vector<std::vector<float>>& expected,
    const std::vector<std::vector<float>>& actual,
    const std::function<double(uint64_t step)>& allowed_uw) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << actual.size() << " steps, expected " << expected.size();
  }
  double w = 0;
  double worst_uw = 0;
  std::string worst;
  for (uint64_t s = 0; s < expected.size(); ++s) {
    for (float x : expected[s]) w = std::max<double>(w, std::fabs(x));
    const double unit = kUnitRoundoff * w;
    const double allowed = allowed_uw(s + 1);
    for (size_t i = 0; i < expected[s].size(); ++i) {
      const double error_uw =
          std::fabs(static_cast<double>(actual[s][i]) - expected[s][i]) / unit;
      // !(<=) so that a NaN fails too.
      const bool fails = !(error_uw <= allowed);
      if (!fails && error_uw <= worst_uw) continue;
      worst_uw = error_uw;
      worst = absl::StrFormat(
          "step %d %s: expected %.9g, got %.9g, error %.3g u*W (u*W = %.3g)",
          s + 1, ElementName(tensors, i), expected[s][i], actual[s][i],
          error_uw, unit);
      if (fails) {
        return ::testing::AssertionFailure()
               << worst << "; allowed " << allowed << " u*W";
      }
    }
  }
  ::testing::Test::RecordProperty("largest_error", worst.empty() ? "0" : worst);
  return ::testing::AssertionSuccess();
}

// Each worker's gradient for a step whose summed gradient is `g`. One worker
// sends g. Two split every element into its 12 leading significand bits (rank
// 0) and the rest (rank 1): both parts are exact in fp32 and their exact sum is
// g, so the servers' fp32 sum is g bit for bit, and a server that lost, doubled
// or swapped a contribution would be off by far more than any rounding.
absl::StatusOr<std::vector<std::vector<float>>> SplitGradient(
    std::vector<float> g, uint32_t num_workers) {
  if (num_workers == 1) return std::vector<std::vector<float>>{std::move(g)};
  if (num_workers != 2) {
    return absl::InvalidArgumentError("SplitGradient takes 1 or 2 workers");
  }
  std::vector<std::vector<float>> parts(2, std::vector<float>(g.size()));
  for (size_t i = 0; i < g.size(); ++i) {
    const float high =
        std::bit_cast<float>(std::bit_cast<uint32_t>(g[i]) & 0xfffff000u);
    parts[0][i] = high;
    parts[1][i] = g[i] - high;
    if (parts[0][i] + parts[1][i] != g[i]) {
      return absl::InternalError(
          absl::StrFormat("gradient element %d does not split exactly", i));
    }
  }
  return parts;
}

class GoldenTrajectoryTest : public TwoServers {
 protected:
  void SetUp() override {
    ASSERT_TRUE(Golden().ok()) << Golden().status();
    TwoServers::SetUp();
  }

  const GoldenData& data() const { return *Golden(); }

  // The recorded case `name`'s `variant` trajectory (fails the test if absent).
  const std::vector<std::vector<float>>* Recorded(const std::string& name,
                                                  const std::string& variant) {
    const GoldenCase* golden = data().Find(name);
    if (golden == nullptr) {
      ADD_FAILURE() << "tests/golden/manifest.json has no case " << name;
      return nullptr;
    }
    auto it = golden->trajectories.find(variant);
    if (it == golden->trajectories.end()) {
      ADD_FAILURE() << "case " << name << " has no " << variant
                    << " trajectory";
      return nullptr;
    }
    return &it->second;
  }

  // Trains case `name` on the servers with one worker, or two splitting each
  // recorded gradient in parts (SplitGradient) that the servers' sum puts
  // back together exactly, sending each step's recorded per-group lr and
  // weight decay. Returns the packed master weights pulled after every step.
  absl::StatusOr<std::vector<std::vector<float>>> Train(const std::string& name,
                                                        uint32_t num_workers) {
    const GoldenCase* golden = data().Find(name);
    if (golden == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("tests/golden/manifest.json has no case ", name));
    }
    JobConfig config;
    config.name = absl::StrCat("golden-", name);
    config.tensors = data().tensors;
    config.num_workers = num_workers;
    config.optimizer = golden->optimizer;
    config.chunk_elems = kChunkElems;
    config.alignment_elems = kAlignmentElems;
    absl::StatusOr<std::unique_ptr<ClientTraining>> training =
        ClientTraining::Open(Addresses(), config);
    if (!training.ok()) return training.status();
    const Layout& layout = (*training)->layout();
    const std::vector<float> initial = ToFlat(layout, data().initial_weights);
    if (absl::Status s =
            (*training)->job(0).InitWeights(initial.data(), DType::kFloat32);
        !s.ok()) {
      return s;
    }
    std::vector<std::vector<float>> trajectory;
    for (uint64_t step = 1; step <= data().steps; ++step) {
      absl::StatusOr<std::vector<std::vector<float>>> grads =
          SplitGradient(ToFlat(layout, data().grads[step - 1]), num_workers);
      if (!grads.ok()) return grads.status();
      StepOptions options;
      options.group_hparams = golden->hparams[step - 1];
      std::vector<absl::Status> statuses(num_workers);
      std::vector<std::thread> workers;
      for (uint32_t rank = 0; rank < num_workers; ++rank) {
        workers.emplace_back([&, rank] {
          std::vector<float> weights(layout.total_elems());
          statuses[rank] = (*training)->job(rank).Step(
              step, (*grads)[rank].data(), weights.data(), nullptr, options);
        });
      }
      for (std::thread& worker : workers) worker.join();
      for (const absl::Status& s : statuses) {
        if (!s.ok()) return s;
      }
      absl::StatusOr<std::vector<float>> master = (*training)->PullMaster();
      if (!master.ok()) return master.status();
      trajectory.push_back(ToPacked(layout, *master));
    }
    return trajectory;
  }

  // Asserts that the trajectory equals the recorded one bit for bit.
  void ExpectBitForBit(const std::string& name,
                       const std::vector<std::vector<float>>& actual) {
    const std::vector<std::vector<float>>* expected =
        Recorded(name, "torch_default");
    if (expected == nullptr) return;
    ASSERT_EQ(actual.size(), expected->size());
    for (size_t s = 0; s < expected->size(); ++s) {
      ASSERT_TRUE(BitwiseEqual((*expected)[s], actual[s]))
          << name << " after step " << s + 1;
    }
  }
};

// The torch.optim cases, one test per case and variant.
class TorchCaseTest : public GoldenTrajectoryTest,
                      public ::testing::WithParamInterface<std::string> {};

TEST_P(TorchCaseTest, MasterWeightsEqualTorchPortableKernelsBitForBit) {
  absl::StatusOr<std::vector<std::vector<float>>> trajectory =
      Train(GetParam(), /*num_workers=*/1);
  ASSERT_TRUE(trajectory.ok()) << trajectory.status();
  ExpectBitForBit(GetParam(), *trajectory);
}

TEST_P(TorchCaseTest, MasterWeightsWithinFmaRoundingOfTorchAvx2Kernels) {
  absl::StatusOr<std::vector<std::vector<float>>> trajectory =
      Train(GetParam(), /*num_workers=*/1);
  ASSERT_TRUE(trajectory.ok()) << trajectory.status();
  const std::vector<std::vector<float>>* expected =
      Recorded(GetParam(), "torch_avx2");
  ASSERT_NE(expected, nullptr);
  EXPECT_TRUE(WithinTolerance(data().tensors, *expected, *trajectory,
                              [](uint64_t) { return kFmaToleranceUW; }));
}

INSTANTIATE_TEST_SUITE_P(Golden, TorchCaseTest,
                         ::testing::Values("adam", "adam_l2", "adamw", "sgd",
                                           "sgd_momentum", "sgd_dampening",
                                           "sgd_nesterov", "sgd_weight_decay",
                                           "adagrad", "adam_amsgrad",
                                           "adamw_amsgrad", "adam_maximize",
                                           "adamw_amsgrad_maximize",
                                           "sgd_maximize",
                                           "sgd_nesterov_maximize",
                                           "adagrad_maximize"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST_F(GoldenTrajectoryTest, LionWithinPerStepFp32RoundingOfFloat64Reference) {
  absl::StatusOr<std::vector<std::vector<float>>> trajectory =
      Train("lion", /*num_workers=*/1);
  ASSERT_TRUE(trajectory.ok()) << trajectory.status();
  const std::vector<std::vector<float>>* expected = Recorded("lion", "float64");
  ASSERT_NE(expected, nullptr);
  EXPECT_TRUE(WithinTolerance(
      data().tensors, *expected, *trajectory,
      [](uint64_t step) { return 1 + 2.5 * static_cast<double>(step); }));
}

// Two workers each send a part of the recorded gradient; the servers' sum is
// the recorded gradient exactly, so the weights are torch's bit for bit.
TEST_F(GoldenTrajectoryTest,
       TwoWorkersSendingGradientPartsEqualTorchAdamWBitForBit) {
  absl::StatusOr<std::vector<std::vector<float>>> trajectory =
      Train("adamw", /*num_workers=*/2);
  ASSERT_TRUE(trajectory.ok()) << trajectory.status();
  ExpectBitForBit("adamw", *trajectory);
}

}  // namespace
}  // namespace depot::testing
