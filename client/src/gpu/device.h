// Device: the small interface the GPU transfer engine is written against
// (issue 11; docs/gpu.md): device and pinned host memory, asynchronous copies
// on in-order streams, and events that order streams against each other and
// against the host. CudaDevice implements it with the CUDA runtime;
// HostDevice (host_device.h) implements it on the host, so that the engine's
// ordering, double buffering and error paths run in tests without a GPU.
//
// The semantics are CUDA's:
// - work queued on one stream runs in order, and work on different streams
//   may overlap;
// - Record(event, stream) marks the point in `stream` reached by the work
//   queued so far; Wait(stream, event) makes later work on `stream` wait for
//   that point (of the event's latest Record), without blocking the host;
// - Synchronize(event) blocks the host until that point; Query tells whether
//   it has been reached. An event never recorded counts as reached.
// Every call returns an error instead of crashing on misuse it can detect
// (a null pointer, an object of another device).
#ifndef DEPOT_CLIENT_SRC_GPU_DEVICE_H_
#define DEPOT_CLIENT_SRC_GPU_DEVICE_H_

#include <cstddef>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace depot::gpu {

// An in-order queue of work (cudaStream_t). Owned by the caller; destroying
// it waits for its queued work.
class Stream {
 public:
  virtual ~Stream() = default;
};

// A point in a stream's work (cudaEvent_t, without timing).
class Event {
 public:
  virtual ~Event() = default;
};

// Memory a Device allocated; freed when destroyed. REQUIRES: destroyed only
// once no queued work uses it.
class Buffer {
 public:
  virtual ~Buffer() = default;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 protected:
  Buffer(void* data, size_t bytes) : data_(data), bytes_(bytes) {}

 private:
  void* data_;
  size_t bytes_;
};

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

class Device {
 public:
  virtual ~Device() = default;

  // Device memory of `bytes` bytes (> 0). RESOURCE_EXHAUSTED when it cannot
  // be allocated.
  virtual absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes) = 0;
  // Page-locked host memory (the staging slots of the engine's rings), which
  // the host may read and write directly. RESOURCE_EXHAUSTED as above.
  virtual absl::StatusOr<std::unique_ptr<Buffer>> AllocatePinned(
      size_t bytes) = 0;

  virtual absl::StatusOr<std::unique_ptr<Stream>> CreateStream() = 0;
  virtual absl::StatusOr<std::unique_ptr<Event>> CreateEvent() = 0;

  // Queues a copy of `bytes` bytes from `src` to `dst` on `stream`.
  // INVALID_ARGUMENT: a null pointer with bytes > 0.
  virtual absl::Status CopyAsync(Stream& stream, void* dst, const void* src,
                                 size_t bytes, CopyKind kind) = 0;
  // See the file comment.
  virtual absl::Status Record(Event& event, Stream& stream) = 0;
  virtual absl::Status Wait(Stream& stream, Event& event) = 0;
  virtual absl::Status Synchronize(Event& event) = 0;
  virtual absl::StatusOr<bool> Query(Event& event) = 0;
  // Blocks the host until every queued work of `stream` has run.
  virtual absl::Status SynchronizeStream(Stream& stream) = 0;
  // Queues `fn` on `stream`: it runs on a thread of the device once the work
  // queued before it has run, and later work waits for it
  // (cudaLaunchHostFunc). `fn` must not call into the device.
  virtual absl::Status LaunchHostFunc(Stream& stream,
                                      std::function<void()> fn) = 0;

  // The host is about to read (write = false) or write [data, data + bytes)
  // of pinned memory. A device that can tell (HostDevice) returns
  // FAILED_PRECONDITION when a queued copy that has not finished writes that
  // memory, or (for a write) reads it: the engine calls this at every host
  // touch of a staging slot, so that its tests catch a slot used too early.
  // A GPU cannot tell cheaply: OK.
  virtual absl::Status CheckHostAccess(const void* data, size_t bytes,
                                       bool write) {
    (void)data;
    (void)bytes;
    (void)write;
    return absl::OkStatus();
  }
};

}  // namespace depot::gpu

#endif  // DEPOT_CLIENT_SRC_GPU_DEVICE_H_
