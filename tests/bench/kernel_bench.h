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
  bool json = false;
};

// Allocates the state, runs --repeats rounds of (update, probe) and prints the
// medians. INVALID_ARGUMENT for a bad option.
absl::Status RunKernelBench(const KernelBenchOptions& options);

}  // namespace depot::bench

#endif  // DEPOT_TESTS_BENCH_KERNEL_BENCH_H_
