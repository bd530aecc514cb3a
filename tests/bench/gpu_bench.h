// depot-bench gpu: the GPU half of Depot on a CUDA device, each figure beside
// its limit measured in the same run (docs/performance.md, "depot-bench gpu"):
//
//   pipeline  the transfer engine (client/src/gpu/transfer_engine.h) on a
//             CudaDevice against depot-server processes on loopback: the
//             gradient bytes (D2H) and weight bytes (H2D) of one step over
//             the step's time, against pinned cudaMemcpyAsync's peak with
//             both directions copying at once (the engine overlaps them),
//             measured first over one large pinned buffer, with events,
//             median of repeats. Target (issue 11): ratio >= 0.85. Beside
//             it, the stages alone (pipeline_bench.h: the wire alone, the
//             chunked copies alone), so a step the loopback wire limits says
//             so.
//   kernel    GpuOptimizerKernel::FusedUpdate (client/src/gpu/kernels.h),
//             AdamW over N elements, against a device-to-device
//             cudaMemcpyAsync moving the same bytes (read + written): the
//             update's bandwidth over the copy's.
//
// Built with CUDA only (DEPOT_HAVE_CUDA); without it, or without a device,
// RunGpuBench returns the reason (FAILED_PRECONDITION, UNAVAILABLE) and
// measures nothing.
#ifndef DEPOT_TESTS_BENCH_GPU_BENCH_H_
#define DEPOT_TESTS_BENCH_GPU_BENCH_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "tests/bench/pipeline_bench.h"

namespace depot::bench {

struct GpuBenchOptions {
  // CUDA ordinal.
  int device = 0;
  // The memcpy peak: bytes of each pinned buffer, and timed repeats (after
  // two warm-ups) of D2H alone, H2D alone and both at once, interleaved.
  uint64_t memcpy_bytes = uint64_t{512} << 20;
  int memcpy_repeats = 20;
  // The engine's pipeline (one local rank: one GPU). link_gb_per_s and
  // local_ranks are not used.
  PipelineBenchOptions pipeline;
  // The update: elements, grad and weight dtype (bf16 or fp32), moment
  // dtype (fp32 or bf16), timed repeats of (update, copy) after two
  // warm-ups.
  uint64_t kernel_elems = uint64_t{256} << 20;
  std::string kernel_dtype = "bf16";
  std::string moment_dtype = "fp32";
  int kernel_repeats = 20;
  bool json = false;
};

absl::Status RunGpuBench(const GpuBenchOptions& options);

// RunGpuBench with the --gpu_* flags (gpu_bench.cc).
absl::Status RunGpuCommand(bool json);

}  // namespace depot::bench

#endif  // DEPOT_TESTS_BENCH_GPU_BENCH_H_
