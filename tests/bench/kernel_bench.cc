#include "tests/bench/kernel_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "depot/dtype.h"
#include "depot/job_config.h"
#include "server/aligned_buffer.h"
#include "server/optimizer/cpu_affinity.h"
#include "server/optimizer/kernel_isa.h"
#include "server/optimizer/optimizer_kernel.h"
#include "server/tensor_update.h"
#include "tests/bench/bench_output.h"

namespace depot::bench {
namespace {

absl::StatusOr<OptimizerKind> ParseKind(const std::string& name) {
  if (name == "adamw") return OptimizerKind::kAdamW;
  if (name == "adam") return OptimizerKind::kAdam;
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "adagrad") return OptimizerKind::kAdagrad;
  if (name == "lion") return OptimizerKind::kLion;
  return absl::InvalidArgumentError(absl::StrCat(
      "--optimizer=", name, " is not one of adamw, adam, sgd, adagrad, lion"));
}

// Storage allocated as the server allocates job state (2 MiB-aligned, huge
// pages) and not yet touched, so that the first touch (in the worker threads)
// decides which NUMA node and page each element lands on.
struct RawArray {
  AlignedBuffer buffer;
  explicit RawArray(AlignedBuffer allocated) : buffer(std::move(allocated)) {}
  void* data() { return buffer.data(); }
};

absl::StatusOr<std::unique_ptr<RawArray>> NewArray(size_t bytes) {
  absl::StatusOr<AlignedBuffer> buffer = AlignedBuffer::Allocate(bytes);
  if (!buffer.ok()) return buffer.status();
  return std::make_unique<RawArray>(*std::move(buffer));
}

// The state of the whole run: n parameters cut into chunks of chunk_elems.
struct BenchState {
  OptimizerConfig config;
  DType grad_dtype;
  DType weight_dtype;
  int slots = 0;
  size_t n = 0;
  size_t chunk_elems = 0;
  std::unique_ptr<RawArray> grads, master, weights, slot[2];
  size_t chunks() const { return (n + chunk_elems - 1) / chunk_elems; }
};

// Runs body(chunk_begin, chunk_end, thread) for every chunk, chunk c on thread
// c % threads (the same split for the first touch, the update and the probe),
// and returns the wall seconds. Thread t is pinned like the server's update
// pool's thread t (ThreadPool).
double ForChunks(const BenchState& state, int threads,
                 const std::function<void(size_t, size_t, int)>& body) {
  static const std::vector<int> cpus = AllowedCpus();
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      // Unpinned threads still measure something: pinning is best effort.
      PinCurrentThread(t, cpus).IgnoreError();
      for (size_t c = t; c < state.chunks(); c += threads) {
        const size_t begin = c * state.chunk_elems;
        body(begin, std::min(state.n, begin + state.chunk_elems), t);
      }
    });
  }
  for (std::thread& thread : pool) thread.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

template <typename T>
T* At(RawArray& array, size_t elem_bytes, size_t begin) {
  return reinterpret_cast<T*>(static_cast<unsigned char*>(array.data()) +
                              begin * elem_bytes);
}

// The probe: the update's streams (grads in, master and slots read and
// written in place, weights out) with trivial arithmetic, so its time is the
// memory traffic alone. SlotT is float for fp32 slots, uint16_t for bf16;
// kSlots of them are used.
template <typename SlotT, int kSlots>
[[gnu::always_inline]] inline void ProbeLoop(size_t n, const uint16_t* g,
                                             float* master, uint16_t* w,
                                             SlotT* m, SlotT* v) {
  for (size_t i = 0; i < n; ++i) {
    const SlotT gi = static_cast<SlotT>(g[i]);
    if constexpr (kSlots > 0) m[i] = static_cast<SlotT>(m[i] + gi);
    if constexpr (kSlots > 1) v[i] = static_cast<SlotT>(v[i] + gi);
    master[i] = master[i] + 1.0f;
    uint32_t bits;
    std::memcpy(&bits, &master[i], 4);
    w[i] = static_cast<uint16_t>(bits >> 16);
  }
}

// The probe's loop compiled for AVX-512, AVX2 and the baseline and chosen at
// run time (GCC's target_clones), as the kernel is: so that the widest
// vectors this CPU has are the probe's too, and only memory limits it.
template <typename SlotT>
[[gnu::always_inline]] inline void ProbeSlots(size_t n, const uint16_t* g,
                                              float* master, uint16_t* w,
                                              SlotT* m, SlotT* v, int slots) {
  switch (slots) {
    case 0:
      return ProbeLoop<SlotT, 0>(n, g, master, w, m, v);
    case 1:
      return ProbeLoop<SlotT, 1>(n, g, master, w, m, v);
    default:
      return ProbeLoop<SlotT, 2>(n, g, master, w, m, v);
  }
}

[[gnu::target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")]] void ProbeFp32Slots(
    size_t n, const uint16_t* g, float* master, uint16_t* w, float* m,
    float* v, int slots) {
  ProbeSlots<float>(n, g, master, w, m, v, slots);
}

[[gnu::target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")]] void ProbeBf16Slots(
    size_t n, const uint16_t* g, float* master, uint16_t* w, uint16_t* m,
    uint16_t* v, int slots) {
  ProbeSlots<uint16_t>(n, g, master, w, m, v, slots);
}

template <typename SlotT>
void ProbeChunk(BenchState& s, size_t begin, size_t end) {
  const uint16_t* g = At<uint16_t>(*s.grads, 2, begin);
  float* master = At<float>(*s.master, 4, begin);
  uint16_t* w = At<uint16_t>(*s.weights, 2, begin);
  SlotT* m =
      s.slots > 0 ? At<SlotT>(*s.slot[0], sizeof(SlotT), begin) : nullptr;
  SlotT* v =
      s.slots > 1 ? At<SlotT>(*s.slot[1], sizeof(SlotT), begin) : nullptr;
  if constexpr (sizeof(SlotT) == 4) {
    ProbeFp32Slots(end - begin, g, master, w, m, v, s.slots);
  } else {
    ProbeBf16Slots(end - begin, g, master, w, m, v, s.slots);
  }
}

}  // namespace

absl::Status RunKernelBench(const KernelBenchOptions& options) {
  if (options.params == 0 || options.threads < 1 || options.repeats < 1 ||
      options.chunk_elems == 0) {
    return absl::InvalidArgumentError(
        "--params, --threads, --repeats and --chunk_elems must be positive");
  }
  BenchState s;
  absl::StatusOr<OptimizerKind> kind = ParseKind(options.optimizer);
  if (!kind.ok()) return kind.status();
  s.config.kind = *kind;
  absl::StatusOr<DType> grad = ParseDType(options.grad_dtype);
  absl::StatusOr<DType> weight = ParseDType(options.weight_dtype);
  absl::StatusOr<DType> moment = ParseDType(options.moment_dtype);
  if (!grad.ok()) return grad.status();
  if (!weight.ok()) return weight.status();
  if (!moment.ok()) return moment.status();
  // The probe's loads and stores are written for 2-byte grads and weights and
  // fp32 or bf16 slots: the configurations the targets name.
  if (*grad != DType::kBFloat16 || *weight != DType::kBFloat16 ||
      *moment == DType::kFloat16) {
    return absl::InvalidArgumentError(
        "the probe supports --grad_dtype=bf16 --weight_dtype=bf16 and "
        "--moment_dtype=fp32|bf16 only");
  }
  s.config.exp_avg_dtype = *moment;
  s.config.exp_avg_sq_dtype = *moment;
  if (absl::Status valid = ValidateOptimizerConfig(s.config); !valid.ok())
    return valid;
  s.grad_dtype = *grad;
  s.weight_dtype = *weight;
  s.slots = OptimizerStateSlots(s.config);
  s.n = options.params;
  s.chunk_elems = options.chunk_elems;
  const size_t slot_bytes = DTypeSize(*moment);

  std::vector<std::pair<std::unique_ptr<RawArray>*, size_t>> arrays = {
      {&s.grads, s.n * 2}, {&s.master, s.n * 4}, {&s.weights, s.n * 2}};
  for (int k = 0; k < s.slots; ++k)
    arrays.push_back({&s.slot[k], s.n * slot_bytes});
  for (const auto& [array, bytes] : arrays) {
    absl::StatusOr<std::unique_ptr<RawArray>> allocated = NewArray(bytes);
    if (!allocated.ok()) return allocated.status();
    *array = *std::move(allocated);
  }
  // Parallel first touch, with the chunk split the runs use.
  ForChunks(s, options.threads, [&](size_t begin, size_t end, int) {
    const size_t n = end - begin;
    uint16_t* g = At<uint16_t>(*s.grads, 2, begin);
    for (size_t i = 0; i < n; ++i)
      g[i] =
          FloatToBFloat16(1e-3f * static_cast<float>((begin + i) % 97) - 0.05f);
    float* master = At<float>(*s.master, 4, begin);
    for (size_t i = 0; i < n; ++i) master[i] = 0.01f;
    std::memset(At<uint16_t>(*s.weights, 2, begin), 0, n * 2);
    for (int k = 0; k < s.slots; ++k)
      std::memset(At<unsigned char>(*s.slot[k], slot_bytes, begin), 0,
                  n * slot_bytes);
  });

  const absl::StatusOr<KernelIsa> isa = options.isa.empty()
                                            ? KernelIsaFromEnvironment()
                                            : ResolveKernelIsa(options.isa);
  if (!isa.ok()) return isa.status();
  std::unique_ptr<OptimizerKernel> kernel = MakeOptimizerKernel(s.config);
  uint64_t step = 0;
  // The server's per-chunk call (ShardState::RunUpdate, one worker, no loss
  // scale or clipping): one fused pass from the bf16 gradient payload to the
  // bf16 weights payload.
  // One worker's gradient payload of the chunk at `begin`; `part` holds the
  // pointer GradientInput::parts refers to.
  const auto gradient = [&](size_t begin, const void*& part) {
    part = At<uint16_t>(*s.grads, 2, begin);
    GradientInput grad;
    grad.dtype = s.grad_dtype;
    grad.parts = &part;
    grad.num_parts = 1;
    return grad;
  };
  const auto update = [&](size_t begin, size_t end, int) {
    const void* part;
    const GradientInput grad = gradient(begin, part);
    ParamRun run;
    run.master = At<float>(*s.master, 4, begin);
    for (int k = 0; k < s.slots; ++k)
      run.slots[k] = At<unsigned char>(*s.slot[k], slot_bytes, begin);
    run.n = end - begin;
    kernel->FusedUpdate(
        grad, run, {.lr = 1e-4, .weight_decay = 0.01, .step = step},
        {s.weight_dtype, At<uint16_t>(*s.weights, 2, begin)}, *isa);
  };
  // The server's per-tensor path over the same arrays (ShardState::RunUpdate
  // with one worker that has every gradient): the chunk's tensor segments,
  // the absent-worker count, one FusedUpdate per segment with its own count.
  JobConfig job;
  job.name = "bench";
  job.optimizer = s.config;
  job.grad_dtype = s.grad_dtype;
  job.weight_dtype = s.weight_dtype;
  job.chunk_elems = s.chunk_elems;
  job.alignment_elems = 1;
  for (size_t begin = 0; options.tensor_elems > 0 && begin < s.n;
       begin += options.tensor_elems) {
    job.tensors.push_back({absl::StrCat("t", job.tensors.size()),
                           std::min(options.tensor_elems, s.n - begin), 0});
  }
  std::optional<Layout> layout;
  std::optional<GroupKernels> group_kernels;
  std::vector<std::vector<uint64_t>> tensor_steps(s.chunks());
  if (options.tensor_elems > 0) {
    absl::StatusOr<Layout> made = Layout::Create(job.tensors, 1);
    if (!made.ok()) return made.status();
    layout = *std::move(made);
    group_kernels.emplace(job);
  }
  const std::vector<std::string> no_grad = {""};
  const auto tensor_update = [&](size_t begin, size_t end, int) {
    const std::vector<Segment> segments = layout->SegmentsIn(begin, end);
    const std::vector<uint32_t> absent = CountAbsentWorkers(no_grad, segments);
    std::vector<uint64_t>& counts = tensor_steps[begin / s.chunk_elems];
    counts.resize(segments.size(), 0);
    const void* part;
    const GradientInput grad = gradient(begin, part);
    ChunkArrays arrays;
    arrays.master = At<float>(*s.master, 4, begin);
    for (int k = 0; k < s.slots; ++k) {
      arrays.slots[k] = At<unsigned char>(*s.slot[k], slot_bytes, begin);
      arrays.slot_elem_bytes[k] = slot_bytes;
    }
    UpdateChunkTensors(job, *group_kernels,
                       ChunkRange{begin / s.chunk_elems, begin, end}, segments,
                       absent, grad, {{0, 1e-4, 0.01}}, arrays, counts,
                       At<uint16_t>(*s.weights, 2, begin));
  };
  const auto probe = [&](size_t begin, size_t end, int) {
    if (slot_bytes == 4) {
      ProbeChunk<float>(s, begin, end);
    } else {
      ProbeChunk<uint16_t>(s, begin, end);
    }
  };

  std::vector<double> update_s, tensor_s, probe_s;
  for (int r = 0; r < options.repeats; ++r) {
    ++step;
    update_s.push_back(ForChunks(s, options.threads, update));
    if (layout.has_value()) {
      tensor_s.push_back(ForChunks(s, options.threads, tensor_update));
    }
    probe_s.push_back(ForChunks(s, options.threads, probe));
  }
  // Bytes moved per parameter: the gradient read, the master and each slot
  // read and written, the weight written.
  const double bytes_per_param = DTypeSize(s.grad_dtype) + 2.0 * 4 +
                                 2.0 * s.slots * slot_bytes +
                                 DTypeSize(s.weight_dtype);
  const double update_pps = s.n / Median(update_s);
  const double probe_pps = s.n / Median(probe_s);
  ResultLine line;
  line.bench = "kernel";
  line.text = {{"isa", std::string(KernelIsaName(*isa))},
               {"optimizer", options.optimizer},
               {"grad_dtype", options.grad_dtype},
               {"weight_dtype", options.weight_dtype},
               {"moment_dtype", options.moment_dtype}};
  line.numbers = {{"params", static_cast<double>(s.n)},
                  {"threads", static_cast<double>(options.threads)},
                  {"repeats", static_cast<double>(options.repeats)},
                  {"chunk_elems", static_cast<double>(s.chunk_elems)},
                  {"bytes_per_param", bytes_per_param},
                  {"update_params_per_s", update_pps},
                  {"update_gb_per_s", update_pps * bytes_per_param / 1e9},
                  {"probe_params_per_s", probe_pps},
                  {"probe_gb_per_s", probe_pps * bytes_per_param / 1e9},
                  {"ratio", update_pps / probe_pps}};
  if (layout.has_value()) {
    const double tensor_pps = s.n / Median(tensor_s);
    line.numbers.push_back(
        {"tensor_elems", static_cast<double>(options.tensor_elems)});
    line.numbers.push_back({"per_tensor_params_per_s", tensor_pps});
    line.numbers.push_back({"ratio_per_tensor", tensor_pps / probe_pps});
  }
  line.Print(options.json);
  return absl::OkStatus();
}

}  // namespace depot::bench
