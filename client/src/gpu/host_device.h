// HostDevice: Device (device.h) on the host, for tests and benchmarks on
// machines without a GPU. Device memory is host memory, each stream is an
// in-order worker thread, an event is a pair of generation counters (recorded,
// reached). The engine runs on it unchanged.
//
// It also checks what a GPU would not: every copy's direction against where
// its pointers lie (device memory, pinned memory, other host memory), and,
// through CheckHostAccess, that the host never touches memory a queued copy
// has not finished with: the bugs the engine must not have (a pinned slot
// reused before its copy finished, weights read before their copy's event)
// become errors in tests instead of silent corruption.
//
// Timing. A throttled HostDevice models a DMA link: each stream keeps a
// device time, the time at which the modelled device finished the stream's
// work so far. A piece of work starts at the later of the time it was queued
// and the stream's device time; a copy then ends exactly `bytes / rate`
// later, as a copy engine's would, with its memmove inside that time (started
// as late as it can be and still end in time, never in the copy's first half,
// so the bytes land at the copy's end); a wait ends at the device time of the
// record it waits for; a host function takes its own time. The stream's thread
// sleeps until a copy's end before it finishes it, so a copy is never seen done
// earlier than the link allows, but it does not add its memmove, nor a late
// wake-up from that sleep, to the stream's later copies: those start at the
// device time, as back-to-back DMA transfers do. (Sleeping bytes / rate and
// then moving the bytes would make every copy slower than the link by its
// memmove and its wake-up delay, which on a busy host is 5-10%: a property of
// the host, not of a PCIe link.)
#ifndef DEPOT_CLIENT_SRC_GPU_HOST_DEVICE_H_
#define DEPOT_CLIENT_SRC_GPU_HOST_DEVICE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "gpu/device.h"

namespace depot::gpu {

class HostDevice : public Device {
 public:
  struct Options {
    // > 0: host<->device copies take bytes / this many seconds of device
    // time ("Timing" above), as over a PCIe link of that bandwidth (each
    // stream is one copy engine); device-to-device copies are not slowed.
    // 0: memcpy speed.
    double copy_bytes_per_second = 0;
    // > 0: host-to-device copies at this rate instead (a link slower one way,
    // or a test that needs weights to arrive faster than they are copied).
    double host_to_device_bytes_per_second = 0;
  };

  HostDevice();
  explicit HostDevice(Options options);
  ~HostDevice() override;

  absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes) override;
  absl::StatusOr<std::unique_ptr<Buffer>> AllocatePinned(
      size_t bytes) override;
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream() override;
  absl::StatusOr<std::unique_ptr<Event>> CreateEvent() override;
  // Besides the interface's checks: INVALID_ARGUMENT when a range of the copy
  // is not where `kind` says (a device range inside one device allocation, a
  // host range outside every device allocation).
  absl::Status CopyAsync(Stream& stream, void* dst, const void* src,
                         size_t bytes, CopyKind kind) override;
  absl::Status Record(Event& event, Stream& stream) override;
  absl::Status Wait(Stream& stream, Event& event) override;
  absl::Status Synchronize(Event& event) override;
  absl::StatusOr<bool> Query(Event& event) override;
  absl::Status SynchronizeStream(Stream& stream) override;
  absl::Status LaunchHostFunc(Stream& stream,
                              std::function<void()> fn) override;

  // The host is about to read (write = false) or write [data, data + bytes).
  // FAILED_PRECONDITION, naming the copy, when a queued copy that has not
  // finished writes that memory, or (for a write) reads it; the violation is
  // also kept (violations()).
  absl::Status CheckHostAccess(const void* data, size_t bytes,
                               bool write) override;

  // Every CheckHostAccess failure so far, in order.
  std::vector<std::string> violations() const;

  // How many Wait calls have been queued on `stream` (a compute stream the
  // engine must never make wait, except where the trainer asks it to).
  uint64_t waits_queued(const Stream& stream) const;

 private:
  const Options options_;
  class HostStream;
  class HostEvent;
  class HostBuffer;
  // A copy queued and not finished.
  struct PendingCopy {
    uintptr_t dst;
    uintptr_t src;
    size_t bytes;
    CopyKind kind;
  };

  absl::StatusOr<HostStream*> Own(Stream& stream) const;
  absl::StatusOr<HostEvent*> Own(Event& event) const;
  // Whether [p, p + bytes) lies inside one device allocation; false for a
  // range that only overlaps one.
  bool InDeviceMemory(uintptr_t p, size_t bytes) const;
  bool OverlapsDeviceMemory(uintptr_t p, size_t bytes) const;
  void ForgetAllocation(uintptr_t begin);

  mutable absl::Mutex mu_;
  // Device allocations by start address: end address.
  std::map<uintptr_t, uintptr_t> device_ranges_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, PendingCopy> pending_ ABSL_GUARDED_BY(mu_);
  uint64_t next_copy_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> violations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace depot::gpu

#endif  // DEPOT_CLIENT_SRC_GPU_HOST_DEVICE_H_
