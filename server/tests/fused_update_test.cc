// The fused update kernel (server/optimizer/fused_*): every instruction set
// this CPU supports gives bit-identical master weights, slots and weights out
// to the scalar one, and the scalar one gives the bits of the unfused path it
// replaced (unfused_reference.h), for every optimizer variant (amsgrad and
// maximize included), slot, gradient and weight dtype, worker count and
// gradient transform, on random data mixed with special values and on lengths
// with vector tails.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "depot/dtype.h"
#include "depot/job_config.h"
#include "gtest/gtest.h"
#include "server/optimizer/kernel_isa.h"
#include "server/optimizer/optimizer_kernel.h"
#include "server/tests/unfused_reference.h"

namespace depot {
namespace {

using testing::UnfusedGradient;
using testing::UnfusedUpdate;

constexpr KernelIsa kEveryIsa[] = {KernelIsa::kScalar, KernelIsa::kAvx2,
                                   KernelIsa::kAvx512, KernelIsa::kAvx512Bf16};
constexpr DType kEveryDType[] = {DType::kFloat32, DType::kBFloat16,
                                 DType::kFloat16};

std::string Name(DType dtype) { return std::string(DTypeName(dtype)); }

std::vector<KernelIsa> SupportedIsas() {
  std::vector<KernelIsa> isas;
  for (KernelIsa isa : kEveryIsa) {
    if (CpuSupportsKernelIsa(isa)) isas.push_back(isa);
  }
  return isas;
}

struct NamedConfig {
  std::string name;
  OptimizerConfig config;
};

// Every update variant; the slot dtype goes to the fields of the slots the
// optimizer keeps.
std::vector<NamedConfig> EveryOptimizer(DType slots) {
  std::vector<NamedConfig> out;
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdam;
  c.exp_avg_dtype = c.exp_avg_sq_dtype = slots;
  out.push_back({"adam", c});
  c.kind = OptimizerKind::kAdamW;
  out.push_back({"adamw", c});
  c.exp_avg_dtype = DType::kFloat32;
  out.push_back({"adamw fp32 exp_avg", c});

  c = OptimizerConfig();
  c.kind = OptimizerKind::kSgd;
  c.sgd_momentum = 0;
  out.push_back({"sgd plain", c});
  c.sgd_momentum = 0.9;
  c.exp_avg_dtype = slots;
  out.push_back({"sgd momentum", c});
  c.sgd_dampening = 0.25;
  out.push_back({"sgd dampening", c});
  c.sgd_dampening = 0;
  c.sgd_nesterov = true;
  out.push_back({"sgd nesterov", c});

  c = OptimizerConfig();
  c.kind = OptimizerKind::kAdagrad;
  c.adagrad_lr_decay = 0.1;
  c.adagrad_initial_accumulator_value = 0.1;
  c.exp_avg_sq_dtype = slots;
  out.push_back({"adagrad", c});

  c = OptimizerConfig();
  c.kind = OptimizerKind::kLion;
  c.exp_avg_dtype = slots;
  out.push_back({"lion", c});

  // amsgrad's third slot takes exp_avg_sq's dtype.
  c = OptimizerConfig();
  c.kind = OptimizerKind::kAdam;
  c.amsgrad = true;
  c.exp_avg_dtype = c.exp_avg_sq_dtype = slots;
  out.push_back({"adam amsgrad", c});
  c.kind = OptimizerKind::kAdamW;
  c.exp_avg_dtype = DType::kFloat32;
  out.push_back({"adamw amsgrad fp32 exp_avg", c});

  // maximize on every variant.
  const size_t unflagged = out.size();
  for (size_t i = 0; i < unflagged; ++i) {
    NamedConfig flagged = out[i];
    flagged.name += " maximize";
    flagged.config.maximize = true;
    out.push_back(flagged);
  }
  return out;
}

// fp32 values every conversion and update must treat alike: NaNs (quiet,
// signalling, with payloads, negative), infinities, subnormals, signed zeros,
// fp16's largest value and its rounding boundary, and huge values.
const uint32_t kSpecialBits[] = {
    0x7fc00000, 0xffc00000, 0x7fc12345, 0x7f800001, 0x7fa00000, 0xff800401,
    0x7f800000, 0xff800000, 0x00000001, 0x807fffff, 0x00400000, 0x00012345,
    0x00000000, 0x80000000, 0x477fe000, 0xc77fe000, 0x477ff000, 0x477fefff,
    0x7f7fffff, 0xff7fffff, 0x7e967699, 0x33800000, 0x33000000, 0x33400000,
    0x387fe000, 0x3f808000, 0x3f818000, 0x3f800001,
};

// Mostly normal values over many magnitudes; one in eight is special.
float RandomValue(std::mt19937& rng) {
  if (rng() % 8 == 0) {
    return std::bit_cast<float>(kSpecialBits[rng() % std::size(kSpecialBits)]);
  }
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> exponent(-8.0f, 3.0f);
  return normal(rng) * std::pow(10.0f, exponent(rng));
}

// n elements of `dtype`: RandomValue converted, plus, for the 2-byte dtypes,
// some of their own NaN (signalling too) and subnormal encodings.
std::string RandomPayload(DType dtype, size_t n, std::mt19937& rng) {
  std::vector<float> values(n);
  for (float& v : values) v = RandomValue(rng);
  std::string payload(n * DTypeSize(dtype), '\0');
  ConvertFromFloat(values.data(), dtype, payload.data(), n);
  if (dtype == DType::kFloat32) return payload;
  const uint16_t bf16_special[] = {0x7f81, 0xff81, 0x7fc1, 0x0001, 0x807f};
  const uint16_t fp16_special[] = {0x7c01, 0xfd00, 0x7e01, 0x0001,
                                   0x83ff, 0x7bff, 0x0400};
  for (size_t i = 0; i < n; ++i) {
    if (rng() % 16 != 0) continue;
    const uint16_t bits = dtype == DType::kBFloat16
                              ? bf16_special[rng() % std::size(bf16_special)]
                              : fp16_special[rng() % std::size(fp16_special)];
    std::memcpy(payload.data() + 2 * i, &bits, 2);
  }
  return payload;
}

// A run's state, owned, with one spare element in front of every array so
// that the run starts misaligned.
struct State {
  std::vector<float> master;
  std::string slots[kMaxStateSlots];
  size_t slot_bytes[kMaxStateSlots] = {0, 0, 0};
  size_t n = 0;

  State(const OptimizerConfig& config, size_t elems, std::mt19937& rng)
      : master(elems + 1), n(elems) {
    for (float& x : master) x = RandomValue(rng);
    for (int k = 0; k < OptimizerStateSlots(config); ++k) {
      const DType dtype = OptimizerSlotDType(config, k);
      slot_bytes[k] = DTypeSize(dtype);
      slots[k] = RandomPayload(dtype, elems + 1, rng);
    }
  }

  ParamRun Run() {
    ParamRun run;
    run.master = master.data() + 1;
    for (int k = 0; k < kMaxStateSlots; ++k) {
      if (slot_bytes[k] != 0) run.slots[k] = slots[k].data() + slot_bytes[k];
    }
    run.n = n;
    return run;
  }
};

bool IsNaN(uint32_t bits, DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return (bits & 0x7fffffffu) > 0x7f800000u;
    case DType::kBFloat16:
      return (bits & 0x7fffu) > 0x7f80u;
    case DType::kFloat16:
      return (bits & 0x7fffu) > 0x7c00u;
  }
  return false;
}

// "" when the n elements of `dtype` at a and b are equal, else where the first
// difference is. Bit for bit, except that with any_nan any two NaNs are equal
// (which NaN an operation on two NaNs propagates depends on the order the
// compiler put the operands in; see docs/optimizers.md).
std::string FirstDifference(const void* a, const void* b, size_t elems,
                            DType dtype, bool any_nan = false) {
  const size_t elem_bytes = DTypeSize(dtype);
  for (size_t i = 0; i < elems; ++i) {
    uint32_t va = 0, vb = 0;
    std::memcpy(&va, static_cast<const char*>(a) + i * elem_bytes, elem_bytes);
    std::memcpy(&vb, static_cast<const char*>(b) + i * elem_bytes, elem_bytes);
    if (va == vb || (any_nan && IsNaN(va, dtype) && IsNaN(vb, dtype))) {
      continue;
    }
    return absl::StrFormat("element %d: %#x vs %#x", i, va, vb);
  }
  return "";
}

DType SlotDType(size_t bytes) {
  return bytes == 4 ? DType::kFloat32 : DType::kBFloat16;
}

// "" when the two results are equal (FirstDifference), else the first
// difference.
std::string CompareResults(State& a, const std::string& weights_a, State& b,
                           const std::string& weights_b, DType weight_dtype,
                           bool any_nan = false) {
  std::string diff = FirstDifference(a.master.data(), b.master.data(), a.n + 1,
                                     DType::kFloat32, any_nan);
  if (!diff.empty()) return "master " + diff;
  for (int k = 0; k < kMaxStateSlots; ++k) {
    if (a.slot_bytes[k] == 0) continue;
    diff = FirstDifference(a.slots[k].data(), b.slots[k].data(), a.n + 1,
                           SlotDType(a.slot_bytes[k]), any_nan);
    if (!diff.empty()) return absl::StrCat("slot ", k, " ", diff);
  }
  diff = FirstDifference(weights_a.data(), weights_b.data(), a.n, weight_dtype,
                         any_nan);
  if (!diff.empty()) return "weights " + diff;
  return "";
}

struct Transform {
  const char* name;
  float unscale;  // 1: off
  double clip;    // 1: off
};

// 1037 elements: two full blocks of 512 and a tail that is not a whole vector
// for 8 or 16 lanes.
constexpr size_t kElems = 1037;
// Gradient parts start this many elements into their buffers.
constexpr size_t kPartOffset = 3;

TEST(FusedUpdateTest, EveryIsaMatchesScalarAndScalarMatchesTheUnfusedPath) {
  const Transform transforms[] = {{"none", 1.0f, 1.0},
                                  {"unscale", 1.0f / 1024, 1.0},
                                  {"clip", 1.0f, 0.3},
                                  {"unscale+clip", 0.75f, 0.999}};
  const std::vector<KernelIsa> isas = SupportedIsas();
  int failures = 0;
  uint32_t seed = 0;
  for (DType slot_dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (const NamedConfig& variant : EveryOptimizer(slot_dtype)) {
      const auto kernel = MakeOptimizerKernel(variant.config);
      for (double weight_decay : {0.0, 0.1}) {
        for (DType grad_dtype : kEveryDType) {
          for (DType weight_dtype : kEveryDType) {
            for (size_t workers = 1; workers <= 3; ++workers) {
              for (const Transform& transform : transforms) {
                const std::string what = absl::StrCat(
                    variant.name, ", slots ", Name(slot_dtype), ", wd ",
                    weight_decay, ", grads ", Name(grad_dtype), ", weights ",
                    Name(weight_dtype), ", W=", workers, ", ", transform.name);
                std::mt19937 rng(++seed);
                State reference(variant.config, kElems, rng);
                std::vector<State> fused(isas.size(), reference);
                // Steps 1 and 2: SGD's first momentum step differs.
                for (uint64_t step = 1; step <= 2; ++step) {
                  std::vector<std::string> payloads;
                  std::vector<const void*> parts;
                  UnfusedGradient unfused;
                  unfused.dtype = grad_dtype;
                  for (size_t w = 0; w < workers; ++w) {
                    payloads.push_back(
                        RandomPayload(grad_dtype, kElems + kPartOffset, rng));
                  }
                  for (const std::string& payload : payloads) {
                    parts.push_back(payload.data());
                    unfused.parts.push_back(
                        payload.data() + kPartOffset * DTypeSize(grad_dtype));
                  }
                  unfused.unscale_factor = transform.unscale;
                  unfused.clip_coef = transform.clip;
                  const UpdateHyperParams hparams{1e-2 * step, weight_decay,
                                                  step};
                  const size_t weight_bytes = kElems * DTypeSize(weight_dtype);
                  std::string expected_weights(weight_bytes, '\0');
                  UnfusedUpdate(variant.config, unfused, reference.Run(),
                                hparams, weight_dtype, expected_weights.data());

                  GradientInput input;
                  input.dtype = grad_dtype;
                  input.parts = parts.data();
                  input.num_parts = parts.size();
                  input.offset = kPartOffset;
                  input.unscale = transform.unscale != 1.0f;
                  input.unscale_factor = transform.unscale;
                  input.clip = transform.clip < 1.0;
                  input.clip_coef = static_cast<float>(transform.clip);
                  std::vector<std::string> weights(
                      isas.size(), std::string(weight_bytes, '\0'));
                  for (size_t i = 0; i < isas.size(); ++i) {
                    kernel->FusedUpdate(input, fused[i].Run(), hparams,
                                        {weight_dtype, weights[i].data()},
                                        isas[i]);
                  }
                  // isas[0] is scalar.
                  for (size_t i = 1; i < isas.size(); ++i) {
                    const std::string diff =
                        CompareResults(fused[i], weights[i], fused[0],
                                       weights[0], weight_dtype);
                    if (!diff.empty() && ++failures <= 10) {
                      ADD_FAILURE()
                          << KernelIsaName(isas[i]) << " vs scalar, " << what
                          << ", step " << step << ": " << diff;
                    }
                  }
                  const std::string diff = CompareResults(
                      fused[0], weights[0], reference, expected_weights,
                      weight_dtype, /*any_nan=*/true);
                  if (!diff.empty() && ++failures <= 10) {
                    ADD_FAILURE() << "scalar vs the unfused path, " << what
                                  << ", step " << step << ": " << diff;
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

// Every fp32 bit pattern whose low half is one of the rounding cases of bf16
// (16 dropped bits) and fp16 (13 dropped bits for normals, more for
// subnormals): ties, just below and above them, and the extremes.
std::vector<float> RoundingCases() {
  const uint32_t low_halves[] = {0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff,
                                 0x2000, 0x3000, 0x5000, 0x7fff, 0x8000, 0x8001,
                                 0x9000, 0xc000, 0xefff, 0xffff};
  std::vector<float> values;
  for (uint32_t high = 0; high < 0x10000; ++high) {
    for (uint32_t low : low_halves) {
      values.push_back(std::bit_cast<float>(high << 16 | low));
    }
  }
  return values;
}

TEST(FusedUpdateTest, WeightConversionMatchesConvertFromFloatOnEveryIsa) {
  const std::vector<float> values = RoundingCases();
  for (DType dtype : kEveryDType) {
    const size_t bytes = values.size() * DTypeSize(dtype);
    std::string expected(bytes, '\0');
    ConvertFromFloat(values.data(), dtype, expected.data(), values.size());
    for (KernelIsa isa : SupportedIsas()) {
      std::string actual(bytes, '\0');
      EncodeWeights(values.data(), values.size(), {dtype, actual.data()}, isa);
      EXPECT_EQ(
          FirstDifference(actual.data(), expected.data(), values.size(), dtype),
          "")
          << KernelIsaName(isa) << " to " << DTypeName(dtype);
    }
  }
}

TEST(FusedUpdateTest, GradientConversionMatchesConvertToFloatOnEveryIsa) {
  // Every 2-byte encoding (and as fp32, the rounding cases), one worker, no
  // transform: the gradient stage is the conversion alone.
  const std::vector<float> fp32_values = RoundingCases();
  for (DType dtype : kEveryDType) {
    std::string payload;
    size_t n = 0;
    if (dtype == DType::kFloat32) {
      n = fp32_values.size();
      payload.assign(reinterpret_cast<const char*>(fp32_values.data()), n * 4);
    } else {
      n = 0x10000;
      payload.resize(n * 2);
      for (uint32_t bits = 0; bits < n; ++bits) {
        const uint16_t half = static_cast<uint16_t>(bits);
        std::memcpy(payload.data() + 2 * bits, &half, 2);
      }
    }
    std::vector<float> expected(n);
    ConvertToFloat(dtype, payload.data(), expected.data(), n);
    const void* parts[] = {payload.data()};
    GradientInput input;
    input.dtype = dtype;
    input.parts = parts;
    input.num_parts = 1;
    for (KernelIsa isa : SupportedIsas()) {
      std::vector<float> actual(n);
      SumGradientInput(input, actual.data(), n, isa);
      EXPECT_EQ(
          FirstDifference(actual.data(), expected.data(), n, DType::kFloat32),
          "")
          << KernelIsaName(isa) << " from " << DTypeName(dtype);
    }
  }
}

TEST(FusedUpdateTest, SplittingARunAnywhereGivesTheSameBits) {
  // Runs that start and end inside vectors and blocks, with weights out;
  // AdamW plain, and with amsgrad's third slot and maximize's negation.
  for (bool flags : {false, true}) {
    OptimizerConfig config;
    config.kind = OptimizerKind::kAdamW;
    config.amsgrad = flags;
    config.maximize = flags;
    const auto kernel = MakeOptimizerKernel(config);
    for (KernelIsa isa : SupportedIsas()) {
      std::mt19937 rng(3);
      State whole(config, kElems, rng);
      State pieces = whole;
      const std::string grad = RandomPayload(DType::kBFloat16, kElems, rng);
      const void* parts[] = {grad.data()};
      const UpdateHyperParams hparams{1e-3, 0.01, 7};
      std::string whole_weights(kElems * 2, '\0');
      std::string piece_weights(kElems * 2, '\0');
      GradientInput input;
      input.dtype = DType::kBFloat16;
      input.parts = parts;
      input.num_parts = 1;
      kernel->FusedUpdate(input, whole.Run(), hparams,
                          {DType::kBFloat16, whole_weights.data()}, isa);
      const size_t cuts[] = {0, 1, 18, 530, 531, 1024, 1036, kElems};
      for (size_t i = 0; i + 1 < std::size(cuts); ++i) {
        ParamRun run = pieces.Run();
        run.master += cuts[i];
        for (int k = 0; k < kMaxStateSlots; ++k) {
          if (run.slots[k] == nullptr) continue;
          run.slots[k] = static_cast<char*>(run.slots[k]) + cuts[i] * 4;
        }
        run.n = cuts[i + 1] - cuts[i];
        input.offset = cuts[i];
        kernel->FusedUpdate(
            input, run, hparams,
            {DType::kBFloat16, piece_weights.data() + 2 * cuts[i]}, isa);
      }
      EXPECT_EQ(CompareResults(whole, whole_weights, pieces, piece_weights,
                               DType::kBFloat16),
                "")
          << KernelIsaName(isa) << (flags ? " amsgrad maximize" : "");
    }
  }
}

// A two-phase step sums the gradient parts first (SumGradientInput, unscaled,
// never negated) and updates from that fp32 sum later, clipping then. With
// maximize, the update negates that sum once: the result is the one-phase
// fused update's, bit for bit, on every instruction set.
TEST(FusedUpdateTest, TwoPhaseUpdateFromTheSumEqualsTheFusedUpdate) {
  const std::vector<KernelIsa> isas = SupportedIsas();
  for (const NamedConfig& variant : EveryOptimizer(DType::kBFloat16)) {
    const auto kernel = MakeOptimizerKernel(variant.config);
    for (KernelIsa isa : isas) {
      std::mt19937 rng(17);
      State one_phase(variant.config, kElems, rng);
      State two_phase = one_phase;
      std::vector<std::string> payloads;
      std::vector<const void*> parts;
      for (int w = 0; w < 2; ++w) {
        payloads.push_back(RandomPayload(DType::kBFloat16, kElems, rng));
      }
      for (const std::string& payload : payloads) {
        parts.push_back(payload.data());
      }
      GradientInput input;
      input.dtype = DType::kBFloat16;
      input.parts = parts.data();
      input.num_parts = parts.size();
      input.unscale = true;
      input.unscale_factor = 0.5f;
      const UpdateHyperParams hparams{1e-2, 0.1, 2};
      std::string one_phase_weights(kElems * 2, '\0');
      std::string two_phase_weights(kElems * 2, '\0');
      GradientInput clipped = input;
      clipped.clip = true;
      clipped.clip_coef = 0.75f;
      kernel->FusedUpdate(clipped, one_phase.Run(), hparams,
                          {DType::kBFloat16, one_phase_weights.data()}, isa);

      std::vector<float> sum(kElems);
      SumGradientInput(input, sum.data(), kElems, isa);
      const void* sum_part[] = {sum.data()};
      GradientInput from_sum;
      from_sum.parts = sum_part;
      from_sum.num_parts = 1;
      from_sum.clip = true;
      from_sum.clip_coef = 0.75f;
      kernel->FusedUpdate(from_sum, two_phase.Run(), hparams,
                          {DType::kBFloat16, two_phase_weights.data()}, isa);
      EXPECT_EQ(CompareResults(one_phase, one_phase_weights, two_phase,
                               two_phase_weights, DType::kBFloat16),
                "")
          << variant.name << " on " << KernelIsaName(isa);
    }
  }
}

TEST(KernelIsaTest, ResolvesNamesAsTheEnvironmentVariableSpellsThem) {
  EXPECT_EQ(ResolveKernelIsa("").value(), BestKernelIsa());
  EXPECT_EQ(ResolveKernelIsa("scalar").value(), KernelIsa::kScalar);
  for (const char* name : {"avx2", "avx512"}) {
    const absl::StatusOr<KernelIsa> isa = ResolveKernelIsa(name);
    const KernelIsa wanted =
        std::string(name) == "avx2" ? KernelIsa::kAvx2 : KernelIsa::kAvx512;
    if (CpuSupportsKernelIsa(wanted)) {
      ASSERT_TRUE(isa.ok()) << isa.status();
      EXPECT_TRUE(CpuSupportsKernelIsa(*isa));
      EXPECT_EQ(KernelIsaName(*isa).substr(0, std::string(name).size()), name);
    } else {
      EXPECT_EQ(isa.status().code(), absl::StatusCode::kFailedPrecondition)
          << isa.status();
    }
  }
  // avx512 means the BF16 variant wherever the CPU has it.
  if (CpuSupportsKernelIsa(KernelIsa::kAvx512Bf16)) {
    EXPECT_EQ(ResolveKernelIsa("avx512").value(), KernelIsa::kAvx512Bf16);
  }
}

TEST(KernelIsaTest, UnknownNameIsInvalidArgument) {
  const absl::StatusOr<KernelIsa> isa = ResolveKernelIsa("sse9");
  EXPECT_EQ(isa.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(isa.status().message().find("scalar, avx2 or avx512"),
            std::string::npos)
      << isa.status();
}

TEST(KernelIsaTest, BestIsaIsSupported) {
  EXPECT_TRUE(CpuSupportsKernelIsa(BestKernelIsa()));
  EXPECT_TRUE(CpuSupportsKernelIsa(KernelIsa::kScalar));
}

}  // namespace
}  // namespace depot
