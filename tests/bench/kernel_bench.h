// `depot-bench kernel`: the server's fused per-chunk update path against a
// bandwidth probe over the same streams (docs/performance.md).
#ifndef DEPOT_TESTS_BENCH_KERNEL_BENCH_H_
#define DEPOT_TESTS_BENCH_KERNEL_BENCH_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"

namespace depot::bench {

struct KernelBenchOptions {
  size_t params = 100'000'000;
  int threads = 2;
  int repeats = 5;
  size_t chunk_elems = 1 << 20;
  std::string optimizer = "adamw";
  std::string grad_dtype = "bf16";
  std::string weight_dtype = "bf16";
  std::string moment_dtype = "fp32";
  // scalar, avx2 or avx512 (as DEPOT_KERNEL_ISA); empty: DEPOT_KERNEL_ISA, or
  // the best this CPU supports.
  std::string isa;
  // > 0: also time the server's per-tensor path (UpdateChunkTensors: each
  // chunk cut into tensors of this many elements, per-tensor step counts and
  // the absent-gradient check) in the same rounds, as ratio_per_tensor.
  size_t tensor_elems = 65536;
  bool json = false;
};

// Allocates the state, runs --repeats rounds of (update, per-tensor update,
// probe) and prints the medians. INVALID_ARGUMENT for a bad option.
absl::Status RunKernelBench(const KernelBenchOptions& options);

}  // namespace depot::bench

#endif  // DEPOT_TESTS_BENCH_KERNEL_BENCH_H_
