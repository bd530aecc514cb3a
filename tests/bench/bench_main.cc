// depot-bench: Depot's performance measurements (docs/performance.md).
//
//   depot-bench kernel [--params=N --threads=T --repeats=R ...] [--json]
//   depot-bench memory [--params=N --server=PATH] [--json]
//   depot-bench transport [...] [--json]   (flags in transport_bench.cc)
//   depot-bench step [...] [--json]        (flags in step_bench.cc)
//   depot-bench pipeline [...] [--json]    (flags in pipeline_bench.cc)
//   depot-bench gpu [...] [--json]         (flags in gpu_bench.cc; CUDA)
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "depot/flags_usage.h"
#include "tests/bench/checkpoint_bench.h"
#include "tests/bench/gpu_bench.h"
#include "tests/bench/kernel_bench.h"
#include "tests/bench/memory_bench.h"
#include "tests/bench/pipeline_bench.h"
#include "tests/bench/step_bench.h"
#include "tests/bench/transport_bench.h"
#include "wire/transport_memory.h"

ABSL_FLAG(uint64_t, params, 0,
          "Parameters (0 = the subcommand's default: 100000000 for kernel, "
          "20000000 for memory).");
ABSL_FLAG(int32_t, threads, 2, "kernel: worker threads for update and probe.");
ABSL_FLAG(int32_t, repeats, 5,
          "kernel: rounds of (update, probe); medians are reported.");
ABSL_FLAG(uint64_t, chunk_elems, uint64_t{1} << 20,
          "kernel: parameters per chunk (the server's default chunk size).");
ABSL_FLAG(std::string, optimizer, "adamw",
          "kernel: adamw, adam, sgd, adagrad or lion.");
ABSL_FLAG(std::string, grad_dtype, "bf16", "kernel: gradient dtype (bf16).");
ABSL_FLAG(std::string, weight_dtype, "bf16", "kernel: weight dtype (bf16).");
ABSL_FLAG(std::string, moment_dtype, "fp32",
          "kernel: optimizer state slot dtype, fp32 or bf16.");
ABSL_FLAG(std::string, server, DEPOT_SERVER_PATH,
          "memory: the depot-server binary to start.");
ABSL_FLAG(std::string, isa, "",
          "kernel: the update kernel's instruction set, scalar, avx2 or avx512 "
          "(empty: DEPOT_KERNEL_ISA, or the best this CPU supports).");
ABSL_FLAG(uint64_t, tensor_elems, 65536,
          "kernel: elements per tensor of the per-tensor pass (the server's "
          "UpdateChunkTensors, timed against one pass per chunk in the same "
          "rounds: ratio_per_tensor); 0 skips it.");
ABSL_FLAG(bool, json, false,
          "Print one JSON object per result line instead of a table.");

int main(int argc, char** argv) {
  depot::SetFlagsUsage(
      "tests/bench/",
      "Depot benchmarks. Usage: depot-bench "
      "kernel|memory|transport|step|pipeline|gpu|checkpoint "
      "[flags]; each measures its limit in the same run and prints a ratio "
      "(docs/performance.md).");
  const std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::fprintf(stderr,
                 "usage: depot-bench "
                 "kernel|memory|transport|step|pipeline|gpu|checkpoint "
                 "[flags] (--help)\n");
    return 2;
  }
  // depot-bench is a process of its own, as a trainer's is: it lets Depot
  // tune malloc for transfers once, for every bench's clients (the opt-in
  // of ClientOptions::retain_transport_buffers; docs/protocol.md).
  depot::RetainTransportBuffers();
  const std::string command = args[1];
  const uint64_t params = absl::GetFlag(FLAGS_params);
  const bool json = absl::GetFlag(FLAGS_json);
  absl::Status status;
  if (command == "kernel") {
    depot::bench::KernelBenchOptions options;
    if (params != 0) options.params = params;
    options.threads = absl::GetFlag(FLAGS_threads);
    options.repeats = absl::GetFlag(FLAGS_repeats);
    options.chunk_elems = absl::GetFlag(FLAGS_chunk_elems);
    options.optimizer = absl::GetFlag(FLAGS_optimizer);
    options.grad_dtype = absl::GetFlag(FLAGS_grad_dtype);
    options.weight_dtype = absl::GetFlag(FLAGS_weight_dtype);
    options.moment_dtype = absl::GetFlag(FLAGS_moment_dtype);
    options.isa = absl::GetFlag(FLAGS_isa);
    options.tensor_elems = absl::GetFlag(FLAGS_tensor_elems);
    options.json = json;
    status = depot::bench::RunKernelBench(options);
  } else if (command == "memory") {
    depot::bench::MemoryBenchOptions options;
    if (params != 0) options.params = params;
    options.server = absl::GetFlag(FLAGS_server);
    options.json = json;
    status = depot::bench::RunMemoryBench(options);
  } else if (command == "transport") {
    status = depot::bench::RunTransportCommand(json);
  } else if (command == "step") {
    status = depot::bench::RunStepCommand(json);
  } else if (command == "pipeline") {
    status = depot::bench::RunPipelineCommand(json);
  } else if (command == "gpu") {
    status = depot::bench::RunGpuCommand(json);
  } else if (command == "checkpoint") {
    status = depot::bench::RunCheckpointCommand(json);
  } else {
    std::fprintf(stderr,
                 "unknown subcommand '%s': use kernel, memory, transport, "
                 "step, pipeline, gpu or checkpoint\n",
                 command.c_str());
    return 2;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "depot-bench %s: %s\n", command.c_str(),
                 status.ToString().c_str());
    // A bad flag value is a usage error, as a bad subcommand is.
    return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
