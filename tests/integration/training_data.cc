#include "training_data.h"

#include <utility>
#include <vector>

namespace depot::testing {
namespace {

// splitmix64: a fixed, portable generator, so inputs do not depend on the
// standard library's distributions.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1) from the top 24 bits: exactly representable in fp32.
float UnitValue(uint64_t stream, uint64_t index) {
  const uint64_t bits = Mix(stream ^ Mix(index)) >> 40;
  return static_cast<float>(bits) * (2.0f / 16777216.0f) - 1.0f;
}

// N fp32 values scale * UnitValue(stream, i) in tensors, garbage in padding,
// converted to `dtype`.
std::string MakeFlatBuffer(const Layout& layout, DType dtype, uint64_t stream,
                           float scale) {
  const uint64_t n = layout.total_elems();
  std::vector<float> values(n);
  for (uint64_t i = 0; i < n; ++i)
    values[i] = 1000.0f + static_cast<float>(i % 7);
  for (const Segment& segment : layout.SegmentsIn(0, n)) {
    for (uint64_t i = segment.begin; i < segment.end; ++i) {
      values[i] = scale * UnitValue(stream, i);
    }
  }
  std::string bytes(n * DTypeSize(dtype), '\0');
  ConvertFromFloat(values.data(), dtype, bytes.data(), n);
  return bytes;
}

JobConfig ScaledJobConfig(std::string name, uint64_t scale_divisor,
                          uint64_t chunk_elems, uint32_t num_workers,
                          uint32_t num_servers) {
  JobConfig config;
  config.name = std::move(name);
  config.tensors = {
      {"embedding", 409600 / scale_divisor, 0},
      {"layer0.weight", 262147 / scale_divisor, 0},
      {"layer0.bias", 1000 / scale_divisor, 1},
      {"layer1.weight", 393216 / scale_divisor, 0},
      {"norm.scale", 333 / scale_divisor + 1, 1},
  };
  config.num_workers = num_workers;
  config.num_servers = num_servers;
  config.optimizer.kind = OptimizerKind::kAdamW;
  config.optimizer.lr = 1e-3;
  config.optimizer.weight_decay = 0.01;
  config.chunk_elems = chunk_elems;
  config.alignment_elems = 64;
  return config;
}

}  // namespace

JobConfig LargeJobConfig(std::string name, DType grad_dtype, DType weight_dtype,
                         uint32_t num_workers) {
  JobConfig config = ScaledJobConfig(std::move(name), 1, uint64_t{1} << 16,
                                     num_workers, /*num_servers=*/2);
  config.grad_dtype = grad_dtype;
  config.weight_dtype = weight_dtype;
  return config;
}

JobConfig SmallJobConfig(std::string name, uint32_t num_workers,
                         uint32_t num_servers) {
  return ScaledJobConfig(std::move(name), 400, 256, num_workers, num_servers);
}

std::string MakeInitialWeights(const Layout& layout, DType dtype,
                               uint64_t seed) {
  return MakeFlatBuffer(layout, dtype, Mix(seed), 0.5f);
}

std::string MakeGradients(const Layout& layout, DType dtype, uint64_t seed,
                          uint64_t step, uint32_t rank) {
  return MakeFlatBuffer(layout, dtype,
                        Mix(Mix(seed + 1) ^ Mix((step << 8) + rank)), 0.1f);
}

std::vector<GroupHyperParams> StepHyperParams(uint64_t step) {
  if (step == 1) return {};
  return {{0, 1e-3 / static_cast<double>(step), 0.01}, {1, 5e-4, 0.0}};
}

}  // namespace depot::testing
