// depot-bench transport: gradient chunks pushed and weight chunks pulled
// through Depot's real client library and server code, against the same bytes
// over a raw TCP socket pair between the same two processes, in the same run
// (docs/performance.md). Flags: --transport_* in transport_bench.cc.
#ifndef DEPOT_TESTS_BENCH_TRANSPORT_BENCH_H_
#define DEPOT_TESTS_BENCH_TRANSPORT_BENCH_H_

#include "absl/status/status.h"

namespace depot::bench {

// Runs the benchmark with the --transport_* flags and prints one result line
// (a table, or one JSON object when `json`). Forks the server process: call
// it before anything in this process has used gRPC.
absl::Status RunTransportCommand(bool json);

}  // namespace depot::bench

#endif  // DEPOT_TESTS_BENCH_TRANSPORT_BENCH_H_
