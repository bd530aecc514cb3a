#include "gpu/cuda_device.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "cuda_runtime_api.h"

namespace depot::gpu {
namespace {

absl::Status CudaError(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  const absl::StatusCode code = error == cudaErrorMemoryAllocation
                                    ? absl::StatusCode::kResourceExhausted
                                    : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(what, ": ", cudaGetErrorName(error),
                                         " (", cudaGetErrorString(error),
                                         ")"));
}

class CudaStream : public Stream {
 public:
  CudaStream(const void* owner, cudaStream_t stream, bool owned = true)
      : owner(owner), stream(stream), owned(owned) {}
  ~CudaStream() override {
    if (!owned) return;  // the caller's stream (WrapCudaStream)
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
  const void* const owner;
  const cudaStream_t stream;
  const bool owned;
};

class CudaEvent : public Event {
 public:
  CudaEvent(const void* owner, cudaEvent_t event)
      : owner(owner), event(event) {}
  ~CudaEvent() override { cudaEventDestroy(event); }
  const void* const owner;
  const cudaEvent_t event;
};

class CudaBuffer : public Buffer {
 public:
  CudaBuffer(void* data, size_t bytes, bool pinned)
      : Buffer(data, bytes), pinned_(pinned) {}
  ~CudaBuffer() override {
    if (pinned_) {
      cudaFreeHost(data());
    } else {
      cudaFree(data());
    }
  }

 private:
  const bool pinned_;
};

cudaMemcpyKind ToCuda(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost:
      return cudaMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice:
      return cudaMemcpyDeviceToDevice;
  }
  return cudaMemcpyDefault;
}

void CUDART_CB RunHostFunc(void* data) {
  std::unique_ptr<std::function<void()>> fn(
      static_cast<std::function<void()>*>(data));
  (*fn)();
}

class CudaDevice : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {}

  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes) override {
    if (bytes == 0) return absl::InvalidArgumentError("Allocate: 0 bytes");
    if (absl::Status s = Select(); !s.ok()) return s;
    void* data = nullptr;
    if (absl::Status s = CudaError(cudaMalloc(&data, bytes), "cudaMalloc");
        !s.ok()) {
      return s;
    }
    return std::unique_ptr<Buffer>(new CudaBuffer(data, bytes, false));
  }

  absl::StatusOr<std::unique_ptr<Buffer>> AllocatePinned(
      size_t bytes) override {
    if (bytes == 0) return absl::InvalidArgumentError("AllocatePinned: 0 bytes");
    if (absl::Status s = Select(); !s.ok()) return s;
    void* data = nullptr;
    if (absl::Status s =
            CudaError(cudaMallocHost(&data, bytes), "cudaMallocHost");
        !s.ok()) {
      return s;
    }
    return std::unique_ptr<Buffer>(new CudaBuffer(data, bytes, true));
  }

  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override {
    if (absl::Status s = Select(); !s.ok()) return s;
    cudaStream_t stream;
    if (absl::Status s = CudaError(
            cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            "cudaStreamCreateWithFlags");
        !s.ok()) {
      return s;
    }
    return std::unique_ptr<Stream>(new CudaStream(this, stream));
  }

  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override {
    if (absl::Status s = Select(); !s.ok()) return s;
    cudaEvent_t event;
    if (absl::Status s = CudaError(
            cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
            "cudaEventCreateWithFlags");
        !s.ok()) {
      return s;
    }
    return std::unique_ptr<Event>(new CudaEvent(this, event));
  }

  absl::Status CopyAsync(Stream& stream, void* dst, const void* src,
                         size_t bytes, CopyKind kind) override {
    absl::StatusOr<cudaStream_t> s = Own(stream);
    if (!s.ok()) return s.status();
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr || src == nullptr) {
      return absl::InvalidArgumentError("CopyAsync: a null pointer");
    }
    return CudaError(cudaMemcpyAsync(dst, src, bytes, ToCuda(kind), *s),
                     "cudaMemcpyAsync");
  }

  absl::Status Record(Event& event, Stream& stream) override {
    absl::StatusOr<cudaEvent_t> e = Own(event);
    if (!e.ok()) return e.status();
    absl::StatusOr<cudaStream_t> s = Own(stream);
    if (!s.ok()) return s.status();
    return CudaError(cudaEventRecord(*e, *s), "cudaEventRecord");
  }

  absl::Status Wait(Stream& stream, Event& event) override {
    absl::StatusOr<cudaEvent_t> e = Own(event);
    if (!e.ok()) return e.status();
    absl::StatusOr<cudaStream_t> s = Own(stream);
    if (!s.ok()) return s.status();
    return CudaError(cudaStreamWaitEvent(*s, *e, 0), "cudaStreamWaitEvent");
  }

  absl::Status Synchronize(Event& event) override {
    absl::StatusOr<cudaEvent_t> e = Own(event);
    if (!e.ok()) return e.status();
    return CudaError(cudaEventSynchronize(*e), "cudaEventSynchronize");
  }

  absl::StatusOr<bool> Query(Event& event) override {
    absl::StatusOr<cudaEvent_t> e = Own(event);
    if (!e.ok()) return e.status();
    const cudaError_t result = cudaEventQuery(*e);
    if (result == cudaErrorNotReady) return false;
    if (absl::Status s = CudaError(result, "cudaEventQuery"); !s.ok()) {
      return s;
    }
    return true;
  }

  absl::Status SynchronizeStream(Stream& stream) override {
    absl::StatusOr<cudaStream_t> s = Own(stream);
    if (!s.ok()) return s.status();
    return CudaError(cudaStreamSynchronize(*s), "cudaStreamSynchronize");
  }

  absl::Status LaunchHostFunc(Stream& stream,
                              std::function<void()> fn) override {
    absl::StatusOr<cudaStream_t> s = Own(stream);
    if (!s.ok()) return s.status();
    if (!fn) return absl::InvalidArgumentError("LaunchHostFunc: no function");
    auto* owned = new std::function<void()>(std::move(fn));
    const cudaError_t error = cudaLaunchHostFunc(*s, &RunHostFunc, owned);
    if (error != cudaSuccess) delete owned;
    return CudaError(error, "cudaLaunchHostFunc");
  }

 private:
  // The calling thread's current device becomes this one.
  absl::Status Select() const {
    return CudaError(cudaSetDevice(ordinal_), "cudaSetDevice");
  }
  absl::StatusOr<cudaStream_t> Own(Stream& stream) const {
    auto* cuda = dynamic_cast<CudaStream*>(&stream);
    if (cuda == nullptr || cuda->owner != this) {
      return absl::InvalidArgumentError("a stream of another device");
    }
    if (absl::Status s = Select(); !s.ok()) return s;
    return cuda->stream;
  }
  absl::StatusOr<cudaEvent_t> Own(Event& event) const {
    auto* cuda = dynamic_cast<CudaEvent*>(&event);
    if (cuda == nullptr || cuda->owner != this) {
      return absl::InvalidArgumentError("an event of another device");
    }
    if (absl::Status s = Select(); !s.ok()) return s;
    return cuda->event;
  }

  const int ordinal_;
};

}  // namespace

absl::StatusOr<void*> CudaStreamHandle(Stream& stream) {
  auto* cuda = dynamic_cast<CudaStream*>(&stream);
  if (cuda == nullptr) {
    return absl::InvalidArgumentError("not a stream of a CUDA device");
  }
  return static_cast<void*>(cuda->stream);
}

absl::StatusOr<std::unique_ptr<Stream>> WrapCudaStream(Device& device,
                                                       void* cuda_stream) {
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  if (cuda == nullptr) {
    return absl::InvalidArgumentError("WrapCudaStream: not a CUDA device");
  }
  return std::unique_ptr<Stream>(new CudaStream(
      cuda, static_cast<cudaStream_t>(cuda_stream), /*owned=*/false));
}

absl::StatusOr<std::unique_ptr<Device>> MakeCudaDevice(int ordinal) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("no CUDA device: cudaGetDeviceCount says ",
                     cudaGetErrorName(error), " (", cudaGetErrorString(error),
                     ")"));
  }
  if (ordinal < 0 || ordinal >= count) {
    return absl::UnavailableError(absl::StrCat(
        "no CUDA device ", ordinal, ": this machine has ", count));
  }
  return std::unique_ptr<Device>(new CudaDevice(ordinal));
}

}  // namespace depot::gpu
