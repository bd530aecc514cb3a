// The transfer engine's C API (depot/depot.h, "engine") over
// depot::gpu::TransferEngine: a host engine on HostDevice, or a CUDA engine
// on the CUDA backend that LoadCudaBackend opens (gpu/cuda_backend.h).
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "c_api_convert.h"
#include "c_api_internal.h"
#include "depot/depot.h"
#include "gpu/cuda_backend.h"
#include "gpu/device_optimizer.h"
#include "gpu/host_collective.h"
#include "gpu/host_device.h"
#include "gpu/transfer_engine.h"

struct depot_engine {
  int32_t kind = DEPOT_DEVICE_HOST;
  uint64_t total_elems = 0;  // the job's
  std::unique_ptr<depot::gpu::Device> device;
  // A host node's ranks share one group (threads of this process).
  std::shared_ptr<depot::gpu::HostCollectiveGroup> host_group;
  std::unique_ptr<depot::gpu::Collective> collective;
  std::unique_ptr<depot::gpu::DeviceOptimizer> optimizer;
  std::unique_ptr<depot::gpu::TransferEngine> engine;
  // Host engine: the trainer's stream, on which nothing is ever queued (the
  // calling thread has finished its work when it calls).
  std::unique_ptr<depot::gpu::Stream> host_stream;
  // CUDA engine: the trainer's streams the engine has been handed, wrapped
  // once each.
  const depot::gpu::CudaBackend* backend = nullptr;
  std::map<void*, std::unique_ptr<depot::gpu::Stream>> cuda_streams;

  ~depot_engine() {
    // The engine first: it aborts its step and stops using the rest.
    engine.reset();
    optimizer.reset();
    collective.reset();
    cuda_streams.clear();
    host_stream.reset();
    device.reset();
  }
};

namespace depot {
namespace {

using c_api::Guarded;
using c_api::NullArgument;

using UniqueId = std::string;  // 128 bytes

// The host nodes of this process, by unique id: the engines that name the
// same id are the ranks of one node and join one HostCollectiveGroup.
class HostNodes {
 public:
  static HostNodes& Get() {
    static HostNodes* const nodes = new HostNodes;
    return *nodes;
  }

  absl::StatusOr<std::shared_ptr<gpu::HostCollectiveGroup>> Group(
      const UniqueId& id, uint32_t size) {
    absl::MutexLock lock(&mu_);
    Node& node = nodes_[id];
    std::shared_ptr<gpu::HostCollectiveGroup> group = node.group.lock();
    if (group == nullptr) {
      group = gpu::HostCollectiveGroup::Create(static_cast<int>(size));
      node.group = group;
      node.size = size;
    } else if (node.size != size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "depot_engine_create: local_ranks ", size, " but another rank of "
          "the node with this unique_id said ", node.size));
    }
    return group;
  }

 private:
  struct Node {
    std::weak_ptr<gpu::HostCollectiveGroup> group;
    uint32_t size = 0;
  };
  absl::Mutex mu_;
  std::map<UniqueId, Node> nodes_ ABSL_GUARDED_BY(mu_);
};

absl::Status CheckKind(int32_t kind, const char* function) {
  if (kind == DEPOT_DEVICE_HOST || kind == DEPOT_DEVICE_CUDA) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      function, ": device ", kind, " is neither DEPOT_DEVICE_HOST (0) nor "
      "DEPOT_DEVICE_CUDA (1)"));
}

absl::Status CreateEngine(depot_job_t* job, const depot_engine_options_t& c,
                          depot_engine& out) {
  constexpr const char* kFunction = "depot_engine_create";
  if (absl::Status s = CheckKind(c.device, kFunction); !s.ok()) return s;
  if (c.local_ranks == 0 || c.local_rank >= c.local_ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        kFunction, ": local_rank ", c.local_rank, " is not below local_ranks ",
        c.local_ranks));
  }
  if (!(c.offload_fraction >= 0.0 && c.offload_fraction <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kFunction, ": offload_fraction ", c.offload_fraction,
        " is not in [0, 1]"));
  }
  if (!(c.host_copy_bytes_per_second >= 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kFunction, ": host_copy_bytes_per_second ",
        c.host_copy_bytes_per_second, " is negative"));
  }
  if (!(c.collective_timeout_seconds >= 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kFunction, ": collective_timeout_seconds ",
        c.collective_timeout_seconds, " is not >= 0 (0: no limit)"));
  }
  if (c.device == DEPOT_DEVICE_CUDA && c.host_copy_bytes_per_second > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kFunction, ": host_copy_bytes_per_second is for a host engine; a "
        "CUDA engine's copies run at the link's speed"));
  }
  const UniqueId id(reinterpret_cast<const char*>(c.unique_id),
                    sizeof(c.unique_id));
  out.kind = c.device;
  out.total_elems = job->job->layout().total_elems();
  if (c.device == DEPOT_DEVICE_HOST) {
    gpu::HostDevice::Options device_options;
    device_options.copy_bytes_per_second = c.host_copy_bytes_per_second;
    out.device = std::make_unique<gpu::HostDevice>(device_options);
    if (c.local_ranks > 1) {
      absl::StatusOr<std::shared_ptr<gpu::HostCollectiveGroup>> group =
          HostNodes::Get().Group(id, c.local_ranks);
      if (!group.ok()) return group.status();
      out.host_group = *std::move(group);
      out.collective = out.host_group->Join(static_cast<int>(c.local_rank),
                                            *out.device);
    }
    absl::StatusOr<std::unique_ptr<gpu::Stream>> stream =
        out.device->CreateStream();
    if (!stream.ok()) return stream.status();
    out.host_stream = *std::move(stream);
  } else {
    absl::StatusOr<const gpu::CudaBackend*> backend = gpu::LoadCudaBackend();
    if (!backend.ok()) return backend.status();
    out.backend = *backend;
    absl::StatusOr<std::unique_ptr<gpu::Device>> device =
        out.backend->make_device(c.cuda_device);
    if (!device.ok()) return device.status();
    out.device = *std::move(device);
    if (c.local_ranks > 1) {
      char nccl_id[128];
      std::memcpy(nccl_id, c.unique_id, sizeof(nccl_id));
      absl::StatusOr<std::unique_ptr<gpu::Collective>> collective =
          out.backend->make_collective(nccl_id, static_cast<int>(c.local_rank),
                                       static_cast<int>(c.local_ranks),
                                       c.cuda_device);
      if (!collective.ok()) return collective.status();
      out.collective = *std::move(collective);
    }
  }
  gpu::TransferEngineOptions options;
  options.local_rank = c.local_rank;
  options.local_ranks = c.local_ranks;
  options.bucket_chunks = c.bucket_chunks;
  options.d2h_slots = c.d2h_slots;
  options.h2d_slots = c.h2d_slots;
  options.streams_per_server = c.streams_per_server;
  options.delayed_update = c.delayed_update != 0;
  options.offload_fraction = c.offload_fraction;
  options.collective_timeout = absl::Seconds(c.collective_timeout_seconds);
  if (c.offload_fraction < 1.0) {
    absl::StatusOr<std::unique_ptr<gpu::DeviceOptimizer>> optimizer =
        c.device == DEPOT_DEVICE_HOST
            ? gpu::MakeHostDeviceOptimizer(job->job->config(), *out.device)
            : out.backend->make_optimizer(job->job->config());
    if (!optimizer.ok()) return optimizer.status();
    out.optimizer = *std::move(optimizer);
    options.device_optimizer = out.optimizer.get();
  }
  absl::StatusOr<std::unique_ptr<gpu::TransferEngine>> engine =
      gpu::TransferEngine::Create(*job->job, *out.device,
                                  out.collective.get(), options);
  if (!engine.ok()) return engine.status();
  out.engine = *std::move(engine);
  return absl::OkStatus();
}

// The Stream that `handle` names for `engine` (see depot.h).
absl::StatusOr<gpu::Stream*> TrainerStream(depot_engine& engine,
                                           void* handle) {
  if (engine.kind == DEPOT_DEVICE_HOST) return engine.host_stream.get();
  std::unique_ptr<gpu::Stream>& wrapped = engine.cuda_streams[handle];
  if (wrapped == nullptr) {
    absl::StatusOr<std::unique_ptr<gpu::Stream>> made =
        engine.backend->wrap_stream(*engine.device, handle);
    if (!made.ok()) {
      engine.cuda_streams.erase(handle);
      return made.status();
    }
    wrapped = *std::move(made);
  }
  return wrapped.get();
}

// Runs `body(stream)` as the entry point `function` on the Stream that
// `stream` names for `engine`.
template <typename Body>
int OnTrainerStream(const char* function, depot_engine_t* engine,
                    void* stream, Body&& body) {
  return Guarded(function, [&]() -> absl::Status {
    if (engine == nullptr) return NullArgument(function, "engine");
    absl::StatusOr<gpu::Stream*> trainer = TrainerStream(*engine, stream);
    if (!trainer.ok()) return trainer.status();
    return body(**trainer);
  });
}

// depot_engine_read_device_state and _write_: the C arrays as the engine's.
int EngineDeviceState(const char* function, depot_engine_t* engine,
                      const depot_flat_state_t* state, bool write) {
  return Guarded(function, [&]() -> absl::Status {
    if (engine == nullptr) {
      return c_api::NullArgument(function, "engine");
    }
    if (state == nullptr) return c_api::NullArgument(function, "state");
    gpu::StateArrays arrays;
    arrays.master = state->master;
    arrays.num_slots = 3;
    for (int k = 0; k < 3; ++k) arrays.slots[k] = state->slots[k];
    arrays.tensor_steps = state->tensor_steps;
    arrays.applied_step = state->applied_step;
    return write ? engine->engine->WriteGpuState(arrays)
                 : engine->engine->ReadGpuState(arrays);
  });
}

}  // namespace
}  // namespace depot

extern "C" {

void depot_engine_options_init(depot_engine_options_t* options) {
  if (options == nullptr) return;
  std::memset(options, 0, sizeof(*options));
  const depot::gpu::TransferEngineOptions defaults;
  options->device = DEPOT_DEVICE_HOST;
  options->cuda_device = 0;
  options->local_rank = defaults.local_rank;
  options->local_ranks = defaults.local_ranks;
  options->bucket_chunks = defaults.bucket_chunks;
  options->d2h_slots = defaults.d2h_slots;
  options->h2d_slots = defaults.h2d_slots;
  options->streams_per_server = defaults.streams_per_server;
  options->delayed_update = defaults.delayed_update ? 1 : 0;
  options->offload_fraction = defaults.offload_fraction;
  options->host_copy_bytes_per_second = 0;
  options->collective_timeout_seconds =
      absl::ToDoubleSeconds(defaults.collective_timeout);
}

int depot_engine_unique_id(int32_t device, uint8_t* id) {
  constexpr const char* kFunction = "depot_engine_unique_id";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (id == nullptr) return depot::c_api::NullArgument(kFunction, "id");
    if (absl::Status s = depot::CheckKind(device, kFunction); !s.ok()) {
      return s;
    }
    if (device == DEPOT_DEVICE_HOST) {
      std::random_device random;
      for (size_t i = 0; i < 128; i += 4) {
        const uint32_t word = random();
        std::memcpy(id + i, &word, 4);
      }
      return absl::OkStatus();
    }
    absl::StatusOr<const depot::gpu::CudaBackend*> backend =
        depot::gpu::LoadCudaBackend();
    if (!backend.ok()) return backend.status();
    char nccl_id[128];
    if (absl::Status s = (*backend)->nccl_unique_id(nccl_id); !s.ok()) {
      return s;
    }
    std::memcpy(id, nccl_id, sizeof(nccl_id));
    return absl::OkStatus();
  });
}

int depot_engine_create(depot_job_t* job, const depot_engine_options_t* options,
                        depot_engine_t** out) {
  constexpr const char* kFunction = "depot_engine_create";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (job == nullptr) return depot::c_api::NullArgument(kFunction, "job");
    if (out == nullptr) return depot::c_api::NullArgument(kFunction, "out");
    depot_engine_options_t c_options;
    depot_engine_options_init(&c_options);
    if (options != nullptr) c_options = *options;
    auto engine = std::make_unique<depot_engine>();
    if (absl::Status s = depot::CreateEngine(job, c_options, *engine);
        !s.ok()) {
      return s;
    }
    *out = engine.release();
    return absl::OkStatus();
  });
}

void* depot_engine_grads(const depot_engine_t* engine) {
  return engine == nullptr ? nullptr : engine->engine->grads();
}

void* depot_engine_grads_of_step(const depot_engine_t* engine,
                                 uint64_t step) {
  return engine == nullptr ? nullptr : engine->engine->grads_of_step(step);
}

void* depot_engine_weights(const depot_engine_t* engine) {
  return engine == nullptr ? nullptr : engine->engine->weights();
}

uint64_t depot_engine_padded_elems(const depot_engine_t* engine) {
  return engine == nullptr ? 0 : engine->engine->partition().padded_elems();
}

uint64_t depot_engine_num_buckets(const depot_engine_t* engine) {
  return engine == nullptr ? 0 : engine->engine->partition().num_buckets();
}

int depot_engine_bucket_range(const depot_engine_t* engine, uint64_t bucket,
                              uint64_t* begin, uint64_t* end) {
  constexpr const char* kFunction = "depot_engine_bucket_range";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (engine == nullptr) {
      return depot::c_api::NullArgument(kFunction, "engine");
    }
    if (begin == nullptr) return depot::c_api::NullArgument(kFunction, "begin");
    if (end == nullptr) return depot::c_api::NullArgument(kFunction, "end");
    const depot::NodePartition& partition = engine->engine->partition();
    if (bucket >= partition.num_buckets()) {
      return absl::OutOfRangeError(absl::StrCat(
          kFunction, ": bucket ", bucket, " of ", partition.num_buckets()));
    }
    const depot::ChunkSpan chunks = partition.bucket(bucket);
    const uint64_t total = engine->total_elems;
    *begin = std::min(total, chunks.first * partition.chunk_elems());
    *end = std::min(total, chunks.end * partition.chunk_elems());
    return absl::OkStatus();
  });
}

uint64_t depot_engine_pinned_bytes(const depot_engine_t* engine) {
  return engine == nullptr ? 0 : engine->engine->pinned_bytes();
}

size_t depot_engine_device_tensors(const depot_engine_t* engine,
                                   uint32_t* out, size_t capacity) {
  if (engine == nullptr) return 0;
  const std::vector<uint32_t>& tensors = engine->engine->gpu_tensors();
  if (out != nullptr) {
    std::copy_n(tensors.begin(), std::min(capacity, tensors.size()), out);
  }
  return tensors.size();
}

int depot_engine_read_device_state(depot_engine_t* engine,
                                   depot_flat_state_t* state) {
  return depot::EngineDeviceState("depot_engine_read_device_state", engine,
                                  state,
                                  /*write=*/false);
}

int depot_engine_write_device_state(depot_engine_t* engine,
                                    const depot_flat_state_t* state) {
  return depot::EngineDeviceState("depot_engine_write_device_state", engine,
                                  state,
                                  /*write=*/true);
}

int depot_engine_begin_step(depot_engine_t* engine, uint64_t step,
                            const depot_step_options_t* options) {
  constexpr const char* kFunction = "depot_engine_begin_step";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (engine == nullptr) {
      return depot::c_api::NullArgument(kFunction, "engine");
    }
    depot_step_options_t c_options;
    depot_step_options_init(&c_options);
    if (options != nullptr) c_options = *options;
    if (c_options.num_weight_overrides > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          kFunction, ": an engine's step takes no weight_overrides (write "
          "the new weights with depot_job_init_weights between steps "
          "instead)"));
    }
    absl::StatusOr<depot::StepOptions> converted =
        depot::c_api::FromC(c_options);
    if (!converted.ok()) return converted.status();
    return engine->engine->BeginStep(step, *converted);
  });
}

int depot_engine_gradients_ready(depot_engine_t* engine, uint64_t bucket,
                                 void* stream) {
  return depot::OnTrainerStream(
      "depot_engine_gradients_ready", engine, stream,
      [&](depot::gpu::Stream& trainer) {
        return engine->engine->GradientsReady(bucket, trainer);
      });
}

int depot_engine_wait_weights(depot_engine_t* engine, uint64_t bucket,
                              void* stream) {
  return depot::OnTrainerStream(
      "depot_engine_wait_weights", engine, stream,
      [&](depot::gpu::Stream& trainer) -> absl::Status {
        if (absl::Status s = engine->engine->WaitWeights(bucket, trainer);
            !s.ok()) {
          return s;
        }
        if (engine->kind != DEPOT_DEVICE_HOST) return absl::OkStatus();
        // The host trainer reads the weights as soon as this returns.
        return engine->device->SynchronizeStream(trainer);
      });
}

int depot_engine_finish_step(depot_engine_t* engine,
                             depot_step_result_t* result) {
  constexpr const char* kFunction = "depot_engine_finish_step";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (engine == nullptr) {
      return depot::c_api::NullArgument(kFunction, "engine");
    }
    absl::StatusOr<depot::StepResult> finished = engine->engine->FinishStep();
    if (!finished.ok()) return finished.status();
    if (result != nullptr) depot::c_api::ToC(*finished, result);
    return absl::OkStatus();
  });
}

int depot_engine_wait_captures(depot_engine_t* engine,
                               depot_capture_report_t* report) {
  constexpr const char* kFunction = "depot_engine_wait_captures";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (engine == nullptr) {
      return depot::c_api::NullArgument(kFunction, "engine");
    }
    if (report == nullptr) {
      return depot::c_api::NullArgument(kFunction, "report");
    }
    const depot::gpu::CaptureReport taken = engine->engine->WaitCaptures();
    report->step = taken.step;
    report->chunks = taken.chunks;
    depot::c_api::ToCString(taken.error, report->error, sizeof(report->error));
    return absl::OkStatus();
  });
}

int depot_engine_check_node(depot_engine_t* engine) {
  constexpr const char* kFunction = "depot_engine_check_node";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (engine == nullptr) {
      return depot::c_api::NullArgument(kFunction, "engine");
    }
    return engine->engine->CheckNode();
  });
}

int depot_engine_agree_on_step(depot_engine_t* engine, uint64_t step,
                               uint64_t* agreed) {
  constexpr const char* kFunction = "depot_engine_agree_on_step";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (engine == nullptr) {
      return depot::c_api::NullArgument(kFunction, "engine");
    }
    if (agreed == nullptr) {
      return depot::c_api::NullArgument(kFunction, "agreed");
    }
    absl::StatusOr<uint64_t> least = engine->engine->AgreeOnStep(step);
    if (!least.ok()) return least.status();
    *agreed = *least;
    return absl::OkStatus();
  });
}

int depot_engine_synchronize_node(depot_engine_t* engine) {
  constexpr const char* kFunction = "depot_engine_synchronize_node";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (engine == nullptr) {
      return depot::c_api::NullArgument(kFunction, "engine");
    }
    return engine->engine->SynchronizeNode();
  });
}

int depot_engine_store_device_state(depot_engine_t* engine) {
  constexpr const char* kFunction = "depot_engine_store_device_state";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (engine == nullptr) {
      return depot::c_api::NullArgument(kFunction, "engine");
    }
    return engine->engine->StoreGpuState();
  });
}

int depot_engine_restore_device_state(depot_engine_t* engine) {
  constexpr const char* kFunction = "depot_engine_restore_device_state";
  return depot::Guarded(kFunction, [&]() -> absl::Status {
    if (engine == nullptr) {
      return depot::c_api::NullArgument(kFunction, "engine");
    }
    return engine->engine->RestoreGpuState();
  });
}

void depot_engine_destroy(depot_engine_t* engine) { delete engine; }

}  // extern "C"
