// `depot-bench memory`: a real depot-server's resident memory per parameter
// for an AdamW job, against the limits (docs/performance.md).
#ifndef DEPOT_TESTS_BENCH_MEMORY_BENCH_H_
#define DEPOT_TESTS_BENCH_MEMORY_BENCH_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"

namespace depot::bench {

struct MemoryBenchOptions {
  std::string server;  // the depot-server binary
  size_t params = 20'000'000;
  bool json = false;
};

// For fp32 and then bf16 moments: starts a server, reads its VmRSS before the
// job, after creating it and after 3 steps of one worker, and prints one line
// per (moments, point). Errors of the server or the client pass through.
absl::Status RunMemoryBench(const MemoryBenchOptions& options);

}  // namespace depot::bench

#endif  // DEPOT_TESTS_BENCH_MEMORY_BENCH_H_
