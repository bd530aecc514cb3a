#include "gpu/host_device.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace depot::gpu {
namespace {

// Freshly allocated memory holds this byte, so that reading memory no copy
// has written shows up as garbage rather than as plausible zeros.
constexpr unsigned char kUnwritten = 0xA5;

const char* KindName(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice:
      return "host-to-device";
    case CopyKind::kDeviceToHost:
      return "device-to-host";
    case CopyKind::kDeviceToDevice:
      return "device-to-device";
  }
  return "unknown";
}

bool Overlaps(uintptr_t a, size_t a_bytes, uintptr_t b, size_t b_bytes) {
  return a < b + b_bytes && b < a + a_bytes;
}

// A host-to-device copy's bytes (the ranges cannot overlap: one is device
// memory, the other not). A DMA engine writes device memory without going
// through the host's caches, so where it can this writes with streaming
// stores: the copy neither reads its destination into the caches nor evicts
// the host threads' data, and takes about 40% less CPU time than memcpy for
// a 2 MiB chunk on the development machine.
void CopyToDevice(void* dst, const void* src, size_t bytes) {
#if defined(__SSE2__)
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  const size_t head =
      std::min(bytes, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, head);
  size_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  _mm_sfence();  // the streaming stores are visible before the copy ends
  std::memcpy(d + i, s + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}

}  // namespace

// An in-order worker thread, which keeps the stream's device time: the time
// at which the modelled device finished the stream's work so far
// (host_device.h, "Timing"). Each piece of work is given the device time at
// which the stream reaches it (never before it was queued) and returns the
// device time at which it ended.
class HostDevice::HostStream : public Stream {
 public:
  using Work = std::function<absl::Time(absl::Time reached)>;

  explicit HostStream(const HostDevice* owner) : owner_(owner) {
    thread_ = std::thread([this] { Run(); });
  }
  ~HostStream() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }

  const HostDevice* owner() const { return owner_; }

  void Enqueue(Work work) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(Queued{absl::Now(), std::move(work)});
  }

  void CountWait() {
    absl::MutexLock lock(&mu_);
    ++waits_;
  }
  uint64_t waits() const {
    absl::MutexLock lock(&mu_);
    return waits_;
  }

  // The stream thread's estimate of how long a memmove of `bytes` takes
  // (for a throttled copy to start moving its bytes that long before its
  // end), and the measurement of one. Only the stream's thread calls these.
  absl::Duration MemmoveEstimate(size_t bytes) const {
    return absl::Seconds(memmove_seconds_per_byte_ *
                         static_cast<double>(bytes));
  }
  void MeasuredMemmove(size_t bytes, absl::Duration took) {
    if (bytes < 4096) return;
    const double per_byte =
        absl::ToDoubleSeconds(took) / static_cast<double>(bytes);
    // Up fast (a late copy is worse than an early memmove), down slowly.
    const double keep = per_byte > memmove_seconds_per_byte_ ? 0.5 : 0.9;
    memmove_seconds_per_byte_ =
        keep * memmove_seconds_per_byte_ + (1 - keep) * per_byte;
  }

 private:
  struct Queued {
    absl::Time enqueued;
    Work work;
  };

  // Runs the queue in order; on destruction, what is queued still runs.
  void Run() {
    absl::Time device_time = absl::InfinitePast();
    while (true) {
      Queued queued;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &HostStream::HasWorkOrStops));
        if (queue_.empty()) return;
        queued = std::move(queue_.front());
        queue_.pop_front();
      }
      device_time = queued.work(std::max(queued.enqueued, device_time));
    }
  }

  bool HasWorkOrStops() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !queue_.empty();
  }

  const HostDevice* const owner_;
  mutable absl::Mutex mu_;
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t waits_ ABSL_GUARDED_BY(mu_) = 0;
  // The stream thread's: seconds per byte of its memmoves, at first a
  // pessimistic 1 GB/s.
  double memmove_seconds_per_byte_ = 1e-9;
  std::thread thread_;
};

// recorded: how many times the event has been recorded; reached: the latest
// of those records its stream has passed, and the device time at which it
// did. The counts live in a shared Marks that the work queued on streams
// holds too: as with cudaEventDestroy, an event may be destroyed while a
// record or a wait of it is still queued (an engine destroyed while the
// trainer's stream still has a record of one of its events to run).
class HostDevice::HostEvent : public Event {
 public:
  class Marks {
   public:
    uint64_t NextRecord() {
      absl::MutexLock lock(&mu_);
      return ++recorded_;
    }
    uint64_t recorded() const {
      absl::MutexLock lock(&mu_);
      return recorded_;
    }
    void Reach(uint64_t generation, absl::Time device_time) {
      absl::MutexLock lock(&mu_);
      if (generation <= reached_) return;
      reached_ = generation;
      reached_at_ = device_time;
    }
    // Blocks until `generation` is reached; returns the device time of the
    // latest record reached (that of `generation` or, when a later record
    // was reached already, that later one's: never earlier than the truth).
    absl::Time AwaitReached(uint64_t generation) const {
      absl::MutexLock lock(&mu_);
      const auto done = [this, generation]()
                            ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                              return reached_ >= generation;
                            };
      mu_.Await(absl::Condition(&done));
      return reached_at_;
    }
    bool IsReached(uint64_t generation) const {
      absl::MutexLock lock(&mu_);
      return reached_ >= generation;
    }

   private:
    mutable absl::Mutex mu_;
    uint64_t recorded_ ABSL_GUARDED_BY(mu_) = 0;
    uint64_t reached_ ABSL_GUARDED_BY(mu_) = 0;
    absl::Time reached_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  };

  explicit HostEvent(const HostDevice* owner) : owner_(owner) {}
  const HostDevice* owner() const { return owner_; }
  const std::shared_ptr<Marks>& marks() const { return marks_; }

 private:
  const HostDevice* const owner_;
  const std::shared_ptr<Marks> marks_ = std::make_shared<Marks>();
};

class HostDevice::HostBuffer : public Buffer {
 public:
  HostBuffer(HostDevice* owner, void* data, size_t bytes, bool device)
      : Buffer(data, bytes), owner_(owner), device_(device) {}
  ~HostBuffer() override {
    if (device_) owner_->ForgetAllocation(reinterpret_cast<uintptr_t>(data()));
    std::free(data());
  }

 private:
  HostDevice* const owner_;
  const bool device_;
};

HostDevice::HostDevice() = default;
HostDevice::HostDevice(Options options) : options_(options) {}
HostDevice::~HostDevice() = default;

absl::StatusOr<std::unique_ptr<Buffer>> HostDevice::Allocate(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("Allocate: 0 bytes");
  void* data = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("Allocate: cannot allocate ", bytes, " bytes"));
  }
  std::memset(data, kUnwritten, bytes);
  {
    absl::MutexLock lock(&mu_);
    const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
    device_ranges_[begin] = begin + bytes;
  }
  return std::unique_ptr<Buffer>(new HostBuffer(this, data, bytes, true));
}

absl::StatusOr<std::unique_ptr<Buffer>> HostDevice::AllocatePinned(
    size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("AllocatePinned: 0 bytes");
  void* data = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("AllocatePinned: cannot allocate ", bytes, " bytes"));
  }
  std::memset(data, kUnwritten, bytes);
  return std::unique_ptr<Buffer>(new HostBuffer(this, data, bytes, false));
}

void HostDevice::ForgetAllocation(uintptr_t begin) {
  absl::MutexLock lock(&mu_);
  device_ranges_.erase(begin);
}

absl::StatusOr<std::unique_ptr<Stream>> HostDevice::CreateStream() {
  return std::unique_ptr<Stream>(new HostStream(this));
}

absl::StatusOr<std::unique_ptr<Event>> HostDevice::CreateEvent() {
  return std::unique_ptr<Event>(new HostEvent(this));
}

absl::StatusOr<HostDevice::HostStream*> HostDevice::Own(Stream& stream) const {
  auto* host = dynamic_cast<HostStream*>(&stream);
  if (host == nullptr || host->owner() != this) {
    return absl::InvalidArgumentError("a stream of another device");
  }
  return host;
}

absl::StatusOr<HostDevice::HostEvent*> HostDevice::Own(Event& event) const {
  auto* host = dynamic_cast<HostEvent*>(&event);
  if (host == nullptr || host->owner() != this) {
    return absl::InvalidArgumentError("an event of another device");
  }
  return host;
}

bool HostDevice::InDeviceMemory(uintptr_t p, size_t bytes) const {
  absl::MutexLock lock(&mu_);
  auto it = device_ranges_.upper_bound(p);
  if (it == device_ranges_.begin()) return false;
  --it;
  return p >= it->first && p + bytes <= it->second;
}

bool HostDevice::OverlapsDeviceMemory(uintptr_t p, size_t bytes) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [begin, end] : device_ranges_) {
    if (Overlaps(p, bytes, begin, end - begin)) return true;
  }
  return false;
}

absl::Status HostDevice::CopyAsync(Stream& stream, void* dst, const void* src,
                                   size_t bytes, CopyKind kind) {
  absl::StatusOr<HostStream*> host = Own(stream);
  if (!host.ok()) return host.status();
  if (bytes == 0) return absl::OkStatus();
  if (dst == nullptr || src == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyAsync (", KindName(kind), "): a null pointer"));
  }
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst);
  const uintptr_t s = reinterpret_cast<uintptr_t>(src);
  const bool dst_device = kind != CopyKind::kDeviceToHost;
  const bool src_device = kind != CopyKind::kHostToDevice;
  const auto placed = [&](uintptr_t p, bool device) {
    return device ? InDeviceMemory(p, bytes) : !OverlapsDeviceMemory(p, bytes);
  };
  if (!placed(d, dst_device) || !placed(s, src_device)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CopyAsync (", KindName(kind), ", ", bytes,
        " bytes): the destination must lie in ",
        dst_device ? "one device allocation" : "host memory",
        " and the source in ",
        src_device ? "one device allocation" : "host memory"));
  }
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = next_copy_++;
    pending_[id] = PendingCopy{d, s, bytes, kind};
  }
  const double rate = kind == CopyKind::kHostToDevice &&
                             options_.host_to_device_bytes_per_second > 0
                         ? options_.host_to_device_bytes_per_second
                         : options_.copy_bytes_per_second;
  const absl::Duration link_time =
      rate > 0 && kind != CopyKind::kDeviceToDevice
          ? absl::Seconds(static_cast<double>(bytes) / rate)
          : absl::ZeroDuration();
  HostStream* on = *host;
  const bool to_device = kind == CopyKind::kHostToDevice;
  on->Enqueue([this, on, dst, src, bytes, id, link_time,
               to_device](absl::Time reached) {
    // A throttled copy ends at reached + link_time, as a DMA engine's would,
    // and its bytes land at that end: the memmove starts as late as it can
    // and still end in time, but never in the first half of the copy's time,
    // so that a reader that does not wait for the copy sees the old contents
    // for at least that long.
    const absl::Time end = reached + link_time;
    if (link_time > absl::ZeroDuration()) {
      const absl::Time move_at =
          std::max(reached + link_time / 2, end - on->MemmoveEstimate(bytes));
      absl::SleepFor(move_at - absl::Now());
    }
    const absl::Time begin = absl::Now();
    if (to_device) {
      CopyToDevice(dst, src, bytes);
    } else {
      std::memmove(dst, src, bytes);
    }
    const absl::Duration took = absl::Now() - begin;
    on->MeasuredMemmove(bytes, took);
    if (link_time > absl::ZeroDuration()) absl::SleepFor(end - absl::Now());
    absl::MutexLock lock(&mu_);
    pending_.erase(id);
    // An unthrottled copy takes its memmove's time.
    return link_time > absl::ZeroDuration() ? end : reached + took;
  });
  return absl::OkStatus();
}

absl::Status HostDevice::Record(Event& event, Stream& stream) {
  absl::StatusOr<HostEvent*> host_event = Own(event);
  if (!host_event.ok()) return host_event.status();
  absl::StatusOr<HostStream*> host_stream = Own(stream);
  if (!host_stream.ok()) return host_stream.status();
  std::shared_ptr<HostEvent::Marks> marks = (*host_event)->marks();
  const uint64_t generation = marks->NextRecord();
  (*host_stream)->Enqueue([marks, generation](absl::Time reached) {
    marks->Reach(generation, reached);
    return reached;
  });
  return absl::OkStatus();
}

absl::Status HostDevice::Wait(Stream& stream, Event& event) {
  absl::StatusOr<HostEvent*> host_event = Own(event);
  if (!host_event.ok()) return host_event.status();
  absl::StatusOr<HostStream*> host_stream = Own(stream);
  if (!host_stream.ok()) return host_stream.status();
  std::shared_ptr<HostEvent::Marks> marks = (*host_event)->marks();
  const uint64_t generation = marks->recorded();
  (*host_stream)->CountWait();
  (*host_stream)->Enqueue([marks, generation](absl::Time reached) {
    return std::max(reached, marks->AwaitReached(generation));
  });
  return absl::OkStatus();
}

absl::Status HostDevice::Synchronize(Event& event) {
  absl::StatusOr<HostEvent*> host = Own(event);
  if (!host.ok()) return host.status();
  const HostEvent::Marks& marks = *(*host)->marks();
  marks.AwaitReached(marks.recorded());
  return absl::OkStatus();
}

absl::StatusOr<bool> HostDevice::Query(Event& event) {
  absl::StatusOr<HostEvent*> host = Own(event);
  if (!host.ok()) return host.status();
  const HostEvent::Marks& marks = *(*host)->marks();
  return marks.IsReached(marks.recorded());
}

absl::Status HostDevice::SynchronizeStream(Stream& stream) {
  absl::StatusOr<std::unique_ptr<Event>> event = CreateEvent();
  if (!event.ok()) return event.status();
  if (absl::Status s = Record(**event, stream); !s.ok()) return s;
  return Synchronize(**event);
}

absl::Status HostDevice::LaunchHostFunc(Stream& stream,
                                        std::function<void()> fn) {
  absl::StatusOr<HostStream*> host = Own(stream);
  if (!host.ok()) return host.status();
  if (!fn) return absl::InvalidArgumentError("LaunchHostFunc: no function");
  // The function takes its own time (it may wait, as a collective does).
  (*host)->Enqueue([fn = std::move(fn)](absl::Time reached) {
    const absl::Time begin = absl::Now();
    fn();
    return reached + (absl::Now() - begin);
  });
  return absl::OkStatus();
}

absl::Status HostDevice::CheckHostAccess(const void* data, size_t bytes,
                                         bool write) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(data);
  absl::MutexLock lock(&mu_);
  for (const auto& [id, copy] : pending_) {
    const bool hits_dst = Overlaps(p, bytes, copy.dst, copy.bytes);
    const bool hits_src = write && Overlaps(p, bytes, copy.src, copy.bytes);
    if (!hits_dst && !hits_src) continue;
    std::string violation = absl::StrCat(
        "the host ", write ? "writes" : "reads", " ", bytes, " bytes at ",
        absl::Hex(p), " while copy ", id, " (", KindName(copy.kind), ", ",
        copy.bytes, " bytes) that ", hits_dst ? "writes" : "reads",
        " them has not finished");
    violations_.push_back(violation);
    return absl::FailedPreconditionError(std::move(violation));
  }
  return absl::OkStatus();
}

std::vector<std::string> HostDevice::violations() const {
  absl::MutexLock lock(&mu_);
  return violations_;
}

uint64_t HostDevice::waits_queued(const Stream& stream) const {
  auto* host = dynamic_cast<const HostStream*>(&stream);
  return host == nullptr ? 0 : host->waits();
}

}  // namespace depot::gpu
