// MemoryTrimmer: gives the memory malloc keeps after a burst back to the
// kernel.
//
// The server sets malloc to keep freed transfer buffers for reuse
// (wire/transport_memory.h): up to 64 MiB free per malloc arena. gRPC reads
// each message into buffers allocated by whichever of its threads polls the
// socket, so after a few large messages (a client's 64 MiB request, refused
// or not) every arena may keep its own 64 MiB: a server whose clients can send
// such messages grew by hundreds of MiB that no budget counts and that stayed
// (docs/protocol.md, "Bounds and memory"). The trimmer watches how much freed
// memory malloc holds and, when it has grown by more than a threshold since
// the last look at its low point, calls malloc_trim, which returns the free
// pages of every arena. At steady state (chunk buffers freed and reused at
// once) the free memory stays under the threshold and nothing is trimmed, so
// the chunk path keeps reusing warm buffers.
//
// Thread safety: Stop may be called from any thread.
#ifndef DEPOT_SERVER_MEMORY_TRIMMER_H_
#define DEPOT_SERVER_MEMORY_TRIMMER_H_

#include <cstdint>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace depot {

// The trimmer's decision, apart from malloc: fed the free bytes malloc holds
// at each look, says when to trim.
class FreedMemoryWatch {
 public:
  // Trims once the free bytes exceed their lowest value since the last trim
  // by more than `threshold_bytes`.
  explicit FreedMemoryWatch(uint64_t threshold_bytes)
      : threshold_bytes_(threshold_bytes) {}

  // One look: true when the caller is to trim now. `free_bytes` is what
  // malloc holds free (mallinfo2's fordblks). After a trim, malloc still
  // counts the released pages as free, so the low point restarts from there.
  bool ShouldTrim(uint64_t free_bytes);

 private:
  const uint64_t threshold_bytes_;
  bool started_ = false;
  uint64_t low_ = 0;
};

class MemoryTrimmer {
 public:
  // Looks every `interval`; trims when the free memory has grown by more
  // than `threshold_bytes` (FreedMemoryWatch). Starts its thread at once;
  // without glibc it does nothing.
  MemoryTrimmer(absl::Duration interval, uint64_t threshold_bytes);
  // Stops the thread.
  ~MemoryTrimmer();

  MemoryTrimmer(const MemoryTrimmer&) = delete;
  MemoryTrimmer& operator=(const MemoryTrimmer&) = delete;

  // Ends the thread; idempotent.
  void Stop();

  // How many times it has trimmed.
  uint64_t trims() const;

 private:
  void Run();

  const absl::Duration interval_;
  FreedMemoryWatch watch_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t trims_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace depot

#endif  // DEPOT_SERVER_MEMORY_TRIMMER_H_
