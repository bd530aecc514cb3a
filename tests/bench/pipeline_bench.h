// depot-bench pipeline: the GPU transfer engine (client/src/gpu/
// transfer_engine.h) on the host device, its copies throttled to a set
// bandwidth as over a PCIe link, the wire and the servers real, against each
// of its stages alone, in the same run (docs/performance.md):
//
//   step  the engine's whole step on every local rank of one node: BeginStep,
//         the gradients already in device memory, GradientsReady for every
//         bucket last to first, WaitWeights for every bucket first to last,
//         FinishStep, and the compute stream synchronized;
//   d2h   the rank's gradient bytes copied device -> pinned host, chunk by
//         chunk on a stream of the same throttled device (the link alone;
//         link_s beside it is the nominal bytes / bandwidth);
//   h2d   the rank's weight bytes copied pinned host -> device likewise;
//   wire  a plain Job::Step of the same job with the same gradients from host
//         memory: the wire and the servers' update alone, no device.
//
// ratio = step / max(d2h, h2d, wire) (medians over the steps); the target is
// <= 1.10. The engine's pinned memory is reported three ways, which must
// agree: what it says (pinned_bytes()), what it allocated from the device
// (counted), and slots x chunk bytes; and the same for an engine of a job a
// quarter the size, which must hold as much: pinned memory does not grow with
// the model.
#ifndef DEPOT_TESTS_BENCH_PIPELINE_BENCH_H_
#define DEPOT_TESTS_BENCH_PIPELINE_BENCH_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu/device.h"
#include "tests/bench/bench_output.h"

namespace depot::bench {

struct PipelineBenchOptions {
  // Elements of the job (one tensor, AdamW, fp32 master and moments).
  uint64_t elems = uint64_t{32} << 20;
  // Elements per chunk (the job's chunk_elems).
  uint64_t chunk_elems = uint64_t{1} << 20;
  // Gradient and weight dtype: "bf16" or "fp32".
  std::string dtype = "bf16";
  // depot-server processes on loopback, and update threads of each.
  int servers = 2;
  int server_threads = 1;
  // Local ranks of the one node (G); G > 1 runs HostCollective between them.
  int local_ranks = 1;
  // Each rank's HostDevice copy bandwidth, GB/s (1e9 bytes), per direction.
  double link_gb_per_s = 1.0;
  // TransferEngineOptions: slots of each ring, chunks per bucket (0: the
  // engine's default), step streams per server.
  int slots = 4;
  uint64_t bucket_chunks = 0;
  int streams_per_server = 1;
  // ClientOptions::connections_per_server (0: the client's default, raised
  // to streams_per_server).
  int connections = 0;
  // G > 1: TransferEngineOptions::collective_timeout in seconds (0: the
  // node's collectives are not watched), to time the watch's cost.
  double collective_timeout_s = 600;
  // Timed steps after one warm-up step; medians are reported.
  int steps = 10;
  // Time rank 0's engine copies and print trace_* fields (see the flag).
  bool trace = false;
  bool json = false;
};

absl::Status RunPipelineBench(const PipelineBenchOptions& options);

// Makes local rank `local_rank`'s device: the engine's and the stages'.
using DeviceFactory = std::function<absl::StatusOr<std::unique_ptr<gpu::Device>>(
    int local_rank)>;

// What one pipeline measurement found: the result line (bench "pipeline",
// the keys of docs/performance.md; link_* only on a HostDevice) and its
// medians.
struct PipelineFigures {
  ResultLine line;
  double step_s = 0, d2h_s = 0, h2d_s = 0, wire_s = 0;
  uint64_t rank_grad_bytes = 0, rank_weight_bytes = 0;
};

// The measurement of RunPipelineBench on devices from `make_device` (one per
// local rank), named `device_name` in the line; prints nothing. On a device
// that is not a HostDevice, link_gb_per_s is unused and no host-access
// checks are read. The GPU bench (gpu_bench.h) runs it on a CudaDevice.
absl::StatusOr<PipelineFigures> MeasurePipeline(
    const PipelineBenchOptions& options, const DeviceFactory& make_device,
    const std::string& device_name);

// RunPipelineBench with the --pipeline_* flags (pipeline_bench.cc).
absl::Status RunPipelineCommand(bool json);

}  // namespace depot::bench

#endif  // DEPOT_TESTS_BENCH_PIPELINE_BENCH_H_
