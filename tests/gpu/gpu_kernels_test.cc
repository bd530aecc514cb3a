// The GPU kernels (client/src/gpu/kernels.h) on a real GPU, against the
// server's code bit for bit: the fused update against OptimizerKernel on the
// cases of the host test (tests/unit/gpu_update_cases.h), the casts against
// ConvertFromFloat / ConvertToFloat on every 16-bit value and every rounding
// boundary, and the gradient check against its documented order computed on
// the host. Skips, saying why, without a CUDA device; one test checks what a
// launch returns then.
#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "depot/dtype.h"
#include "gpu/cuda_device.h"
#include "gpu/device.h"
#include "gpu/kernels.h"
#include "gtest/gtest.h"
#include "server/optimizer/optimizer_kernel.h"
#include "tests/unit/gpu_update_cases.h"

namespace depot::gpu {
namespace {

using update_cases::Case;
using update_cases::State;

class GpuKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Device>> device = MakeCudaDevice(0);
    if (!device.ok()) GTEST_SKIP() << device.status().message();
    device_ = *std::move(device);
    stream_ = device_->CreateStream().value();
    handle_ = CudaStreamHandle(*stream_).value();
  }

  // A device copy of bytes [data, data + bytes).
  std::unique_ptr<Buffer> ToDevice(const void* data, size_t bytes) {
    std::unique_ptr<Buffer> buffer = device_->Allocate(bytes).value();
    EXPECT_TRUE(device_
                    ->CopyAsync(*stream_, buffer->data(), data, bytes,
                                CopyKind::kHostToDevice)
                    .ok());
    Sync();
    return buffer;
  }
  template <class T>
  std::unique_ptr<Buffer> ToDevice(const std::vector<T>& values) {
    return ToDevice(values.data(), values.size() * sizeof(T));
  }

  void ToHost(const Buffer& buffer, void* out, size_t bytes) {
    EXPECT_TRUE(device_
                    ->CopyAsync(*stream_, out, buffer.data(), bytes,
                                CopyKind::kDeviceToHost)
                    .ok());
    Sync();
  }

  void Sync() { ASSERT_TRUE(device_->SynchronizeStream(*stream_).ok()); }

  std::unique_ptr<Device> device_;
  std::unique_ptr<Stream> stream_;
  void* handle_ = nullptr;
};

class FusedUpdateTest : public GpuKernelsTest {
 protected:
  // Runs `steps` updates of `c` over n elements on the server (scalar
  // reference) and on the GPU, the GPU's state staying on the device;
  // returns the first difference after any step ("" for none).
  std::string Compare(const Case& c, size_t n, int steps) {
    std::mt19937 rng(777);
    State server = update_cases::InitialState(c, n, rng);
    State gpu = server;
    std::unique_ptr<Buffer> master = ToDevice(gpu.master);
    std::vector<std::unique_ptr<Buffer>> slots;
    for (const auto& slot : gpu.slots) slots.push_back(ToDevice(slot));
    std::unique_ptr<Buffer> weights;
    if (c.has_weights) weights = ToDevice(gpu.weights);
    ParamRun run;
    run.master = static_cast<float*>(master->data());
    for (size_t k = 0; k < slots.size(); ++k) run.slots[k] = slots[k]->data();
    run.n = n;
    WeightsOutput gpu_weights;
    if (c.has_weights) gpu_weights = {c.weight_dtype, weights->data()};

    std::unique_ptr<OptimizerKernel> kernel = MakeOptimizerKernel(c.config);
    std::unique_ptr<GpuOptimizerKernel> gpu_kernel =
        GpuOptimizerKernel::Make(c.config).value();
    for (int step = 1; step <= steps; ++step) {
      const auto parts = update_cases::GradientParts(c, n, rng);
      std::vector<const void*> host_parts;
      std::vector<std::unique_ptr<Buffer>> device_parts;
      std::vector<const void*> device_part_pointers;
      for (const auto& part : parts) {
        host_parts.push_back(part.data());
        device_parts.push_back(ToDevice(part));
        device_part_pointers.push_back(device_parts.back()->data());
      }
      const UpdateHyperParams hparams = update_cases::StepHyperParams(c, step);
      WeightsOutput server_weights;
      if (c.has_weights)
        server_weights = {c.weight_dtype, server.weights.data()};
      kernel->FusedUpdate(update_cases::MakeGradient(c, host_parts),
                          server.Run(), hparams, server_weights,
                          KernelIsa::kScalar);
      const absl::Status launched = gpu_kernel->FusedUpdate(
          update_cases::MakeGradient(c, device_part_pointers), run, hparams,
          gpu_weights, handle_);
      if (!launched.ok()) return launched.ToString();
      ToHost(*master, gpu.master.data(), n * sizeof(float));
      for (size_t k = 0; k < slots.size(); ++k) {
        ToHost(*slots[k], gpu.slots[k].data(), gpu.slots[k].size());
      }
      if (c.has_weights)
        ToHost(*weights, gpu.weights.data(), gpu.weights.size());
      const std::string difference = update_cases::FirstDifference(server, gpu);
      if (!difference.empty()) {
        return absl::StrCat("step ", step, ": ", difference);
      }
    }
    return "";
  }
};

TEST_F(FusedUpdateTest, EqualsTheServersFusedUpdateBitForBit) {
  for (const Case& c : update_cases::Cases()) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(Compare(c, 100003, 3), "");
  }
}

TEST_F(FusedUpdateTest, CoversMoreElementsThanTheGrid) {
  // 65536 blocks of 256 threads: past 2^24 elements, threads loop.
  Case c = update_cases::Cases().front();
  EXPECT_EQ(Compare(c, (size_t{1} << 24) + 4099, 1), "");
}

TEST_F(FusedUpdateTest, RejectsAMissingMaster) {
  std::unique_ptr<GpuOptimizerKernel> kernel =
      GpuOptimizerKernel::Make(OptimizerConfig()).value();
  std::unique_ptr<Buffer> grad = device_->Allocate(64).value();
  const std::vector<const void*> parts = {grad->data()};
  GradientInput input;
  input.parts = parts.data();
  input.num_parts = 1;
  ParamRun run;
  run.n = 16;
  EXPECT_EQ(kernel
                ->FusedUpdate(input, run, UpdateHyperParams(), WeightsOutput(),
                              handle_)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// Floats around every rounding boundary of bf16 and fp16: every value of the
// 16-bit type, the midpoints to its neighbours and the floats next to those,
// the extremes, NaNs with payloads, and random bits.
std::vector<float> CastInputs() {
  std::vector<float> out;
  const auto around = [&](float x) {
    out.push_back(x);
    out.push_back(std::nextafter(x, INFINITY));
    out.push_back(std::nextafter(x, -INFINITY));
  };
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint32_t bf16 = h << 16;
    around(std::bit_cast<float>(bf16 | 0x8000u));  // midpoint to the next
    out.push_back(std::bit_cast<float>(bf16));
    const float half = HalfToFloat(static_cast<uint16_t>(h));
    const float next = HalfToFloat(static_cast<uint16_t>(h + 1));
    if (std::isfinite(half) && std::isfinite(next)) {
      around(half + (next - half) / 2);  // exact in fp32
    }
    out.push_back(half);
  }
  for (float x : {FLT_MAX, -FLT_MAX, FLT_MIN, FLT_TRUE_MIN, 65504.0f, 65520.0f,
                  0.0f, -0.0f, INFINITY, -INFINITY}) {
    around(x);
  }
  for (uint32_t nan : {0x7f800001u, 0x7fc00000u, 0xffc12345u, 0x7f80e000u}) {
    out.push_back(std::bit_cast<float>(nan));
  }
  std::mt19937 rng(5);
  for (int i = 0; i < 100000; ++i) {
    out.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  }
  return out;
}

TEST_F(GpuKernelsTest, CastFromFloatRoundsAsConvertFromFloat) {
  const std::vector<float> inputs = CastInputs();
  const std::unique_ptr<Buffer> src = ToDevice(inputs);
  for (DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    SCOPED_TRACE(DTypeName(dtype));
    const size_t bytes = inputs.size() * DTypeSize(dtype);
    std::vector<unsigned char> expected(bytes), actual(bytes);
    ConvertFromFloat(inputs.data(), dtype, expected.data(), inputs.size());
    const std::unique_ptr<Buffer> dst = device_->Allocate(bytes).value();
    ASSERT_TRUE(CastFromFloat(static_cast<const float*>(src->data()), dtype,
                              dst->data(), inputs.size(), handle_)
                    .ok());
    ToHost(*dst, actual.data(), bytes);
    EXPECT_EQ(actual, expected);
  }
}

TEST_F(GpuKernelsTest, CastToFloatWidensEveryValueAsConvertToFloat) {
  std::vector<uint16_t> every(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) every[h] = static_cast<uint16_t>(h);
  const std::unique_ptr<Buffer> src = ToDevice(every);
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    std::vector<float> expected(every.size()), actual(every.size());
    ConvertToFloat(dtype, every.data(), expected.data(), every.size());
    const std::unique_ptr<Buffer> dst =
        device_->Allocate(every.size() * sizeof(float)).value();
    ASSERT_TRUE(CastToFloat(dtype, src->data(),
                            static_cast<float*>(dst->data()), every.size(),
                            handle_)
                    .ok());
    ToHost(*dst, actual.data(), actual.size() * sizeof(float));
    EXPECT_EQ(std::memcmp(actual.data(), expected.data(),
                          actual.size() * sizeof(float)),
              0);
  }
}

// GradientCheck's documented order, on the host.
GradientCheckResult ReferenceCheck(const std::vector<float>& g) {
  const auto tree = [](std::vector<double> sums) {
    for (size_t half = sums.size() / 2; half > 0; half /= 2) {
      for (size_t t = 0; t < half; ++t) sums[t] += sums[t + half];
    }
    return sums[0];
  };
  const size_t threads = kGradientCheckThreads;
  const size_t tile = kGradientCheckTile;
  const size_t tiles = (g.size() + tile - 1) / tile;
  std::vector<double> tile_sums(tiles);
  GradientCheckResult result;
  for (size_t b = 0; b < tiles; ++b) {
    std::vector<double> sums(threads, 0.0);
    for (size_t t = 0; t < threads; ++t) {
      for (size_t i = b * tile + t; i < std::min(g.size(), (b + 1) * tile);
           i += threads) {
        sums[t] += static_cast<double>(g[i]) * static_cast<double>(g[i]);
        if (!(std::fabs(g[i]) <= FLT_MAX)) result.non_finite = 1;
      }
    }
    tile_sums[b] = tree(sums);
  }
  std::vector<double> sums(threads, 0.0);
  for (size_t j = 0; j < tiles; ++j) sums[j % threads] += tile_sums[j];
  result.sum_squares = tree(sums);
  return result;
}

class GradientCheckTest : public GpuKernelsTest {
 protected:
  // Runs GradientCheck on `values` stored as `dtype`.
  GradientCheckResult Run(const std::vector<float>& values, DType dtype,
                          bool unscale, float factor) {
    std::vector<unsigned char> bytes(values.size() * DTypeSize(dtype));
    ConvertFromFloat(values.data(), dtype, bytes.data(), values.size());
    const std::unique_ptr<Buffer> grad = ToDevice(bytes);
    const size_t workspace_bytes = GradientCheckWorkspaceBytes(values.size());
    const std::unique_ptr<Buffer> workspace =
        device_->Allocate(workspace_bytes).value();
    const std::unique_ptr<Buffer> result =
        device_->Allocate(sizeof(GradientCheckResult)).value();
    DeviceGradientRange range;
    range.dtype = dtype;
    range.device_data = grad->data();
    range.n = values.size();
    range.unscale = unscale;
    range.unscale_factor = factor;
    EXPECT_TRUE(GradientCheck(range, workspace->data(), workspace_bytes,
                              static_cast<GradientCheckResult*>(result->data()),
                              handle_)
                    .ok());
    GradientCheckResult out;
    ToHost(*result, &out, sizeof(out));
    return out;
  }
};

TEST_F(GradientCheckTest, SumsSquaresInItsDocumentedOrder) {
  // More tiles than threads, and a partial last tile.
  const size_t n = size_t{kGradientCheckTile} * 300 + 77;
  std::mt19937 rng(3);
  const std::vector<float> values = update_cases::RandomValues(rng, n, false);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (bool unscale : {false, true}) {
      SCOPED_TRACE(absl::StrCat(std::string(DTypeName(dtype)),
                                unscale ? " unscaled" : ""));
      // The gradient the kernel sees: the stored values, times the factor.
      std::vector<unsigned char> bytes(n * DTypeSize(dtype));
      std::vector<float> g(n);
      ConvertFromFloat(values.data(), dtype, bytes.data(), n);
      ConvertToFloat(dtype, bytes.data(), g.data(), n);
      if (unscale) {
        for (float& x : g) x *= 0.37f;
      }
      const GradientCheckResult expected = ReferenceCheck(g);
      const GradientCheckResult actual = Run(values, dtype, unscale, 0.37f);
      EXPECT_EQ(std::bit_cast<uint64_t>(actual.sum_squares),
                std::bit_cast<uint64_t>(expected.sum_squares));
      EXPECT_EQ(actual.non_finite, 0u);
    }
  }
}

TEST_F(GradientCheckTest, FlagsNaNInfAndOverflowOnUnscale) {
  std::vector<float> values(10000, 1.0f);
  values[9999] = NAN;
  EXPECT_EQ(Run(values, DType::kFloat32, false, 1.0f).non_finite, 1u);
  values[9999] = -INFINITY;
  EXPECT_EQ(Run(values, DType::kBFloat16, false, 1.0f).non_finite, 1u);
  values[9999] = 60000.0f;
  EXPECT_EQ(Run(values, DType::kFloat16, false, 1.0f).non_finite, 0u);
  EXPECT_EQ(Run(values, DType::kFloat16, true, 1e35f).non_finite, 1u);
}

TEST_F(GradientCheckTest, RejectsASmallWorkspace) {
  const std::unique_ptr<Buffer> buffer = device_->Allocate(1 << 16).value();
  DeviceGradientRange range;
  range.device_data = buffer->data();
  range.n = kGradientCheckTile + 1;
  EXPECT_EQ(
      GradientCheck(range, buffer->data(), 8,
                    static_cast<GradientCheckResult*>(buffer->data()), handle_)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

// Runs where the others skip: without a device, a launch says so.
TEST(GpuKernelsWithoutDeviceTest, ALaunchIsUnavailable) {
  if (MakeCudaDevice(0).ok()) GTEST_SKIP() << "a CUDA device is present";
  float src[4] = {};
  uint16_t dst[4];
  const absl::Status status =
      CastFromFloat(src, DType::kBFloat16, dst, 4, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_NE(status.message().find("no CUDA device"), std::string::npos);
}

}  // namespace
}  // namespace depot::gpu
