// MemoryTrimmer and UseOneMallocArena: the server's bound on the memory
// malloc keeps after a burst.
//
// The server sets malloc to keep freed transfer buffers for reuse
// (wire/transport_memory.h): up to 64 MiB free at the top of a malloc arena.
// A client's 64 MiB message (refused or not) leaves that much free behind it.
// UseOneMallocArena keeps it to one arena; the trimmer watches how much freed
// memory malloc holds and, when it has grown by more than a threshold since
// its last low point, calls malloc_trim, which returns the free pages to the
// kernel. At steady state (chunk buffers freed and reused at once) the free
// memory stays under the threshold and nothing is trimmed, so the chunk path
// keeps reusing warm buffers.
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

// Makes glibc malloc serve every thread from one arena, for the whole
// process. gRPC reads each message into buffers allocated by whichever of its
// threads polls the socket; with an arena per thread (glibc's default, up to
// 8 per core) each arena keeps up to the trim threshold (64 MiB,
// wire/transport_memory.h) free at its top after a large message, and
// malloc_trim returns only the main arena's top: a server sent a 64 MiB
// message now and then grew by hundreds of MiB (docs/protocol.md, "Bounds and
// memory"). With one arena the freed buffers are reused by every thread and
// MemoryTrimmer returns what is left. Measured with depot-bench transport: no
// more CPU per step. Does nothing when the environment sets the arena count
// (MALLOC_ARENA_MAX, or GLIBC_TUNABLES with glibc.malloc.arena_max: the
// operator's choice wins), nor without glibc. Call before any thread starts;
// true when set.
bool UseOneMallocArena();

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
