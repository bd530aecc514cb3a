// depot-bench step: whole training steps through real depot-server processes
// against each of their stages alone and against a serial baseline, all in
// the same run (docs/performance.md):
//
//   step    one-phase Job::Step (push gradients, update, pull weights, per
//           chunk pipelined) against a normal server;
//   xfer    the same steps against a server started with --bench_noop_update
//           (the transfer alone: chunks are answered with the gradient
//           payload, nothing is summed or updated);
//   update  the server's update path in this process (ShardState fed one
//           worker's contribution for every chunk, weights discarded): the
//           update alone, with no transfer;
//   serial  a two-phase step (clip_grad = 1e30, so the clip never applies):
//           every chunk is pushed and summed before the commit starts the
//           updates; the pulls still overlap the updates as chunks finish, so
//           this baseline is, if anything, faster than a fully serial one.
//
// ratio = step / max(xfer, update) (medians); speedup = serial / step. The
// servers run in their own network namespace behind a veth pair shaped by tc
// to --step_rate, or on loopback where that is not possible (with a note).
#ifndef DEPOT_TESTS_BENCH_STEP_BENCH_H_
#define DEPOT_TESTS_BENCH_STEP_BENCH_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace depot::bench {

struct StepBenchOptions {
  uint64_t params = 100'000'000;
  // Rounds of (step, xfer, serial, update); medians are reported.
  int repeats = 5;
  // "veth" or "loopback".
  std::string link = "veth";
  // The veth link's rate in each direction, as tc writes it.
  std::string rate = "10gbit";
  // Update threads of the servers and of the in-process update; 0: one per
  // hardware thread (the server's default).
  int threads = 0;
  bool json = false;
};

absl::Status RunStepBench(const StepBenchOptions& options);

// RunStepBench with the --step_* flags (step_bench.cc).
absl::Status RunStepCommand(bool json);

}  // namespace depot::bench

#endif  // DEPOT_TESTS_BENCH_STEP_BENCH_H_
