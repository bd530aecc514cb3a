// The process's allocator, set for bulk transfers through gRPC.
//
// gRPC reads each socket into freshly allocated buffers and frees them once
// the message is consumed. With glibc's defaults, that memory goes straight
// back to the kernel (blocks above the 128 KiB mmap threshold are unmapped on
// free; a heap's free top above the 128 KiB trim threshold is returned), so
// every buffer is faulted in and zeroed again: at wire speed the page faults
// cost more CPU than the copies themselves (docs/protocol.md, "Transport").
#ifndef DEPOT_COMMON_WIRE_TRANSPORT_MEMORY_H_
#define DEPOT_COMMON_WIRE_TRANSPORT_MEMORY_H_

#include <cstddef>

namespace depot {

// malloc serves blocks below this from its heaps instead of mapping them...
inline constexpr size_t kTransportMmapThresholdBytes = size_t{32} << 20;
// ...and keeps up to this much free at a heap's top instead of returning it.
inline constexpr size_t kTransportTrimThresholdBytes = size_t{64} << 20;

// Sets glibc malloc's mmap and trim thresholds to the values above, for the
// whole process, so that transfer buffers are reused instead of faulted in
// again: a process keeps up to kTransportTrimThresholdBytes of freed memory
// per malloc arena. Does nothing when the environment already sets malloc's
// thresholds (GLIBC_TUNABLES with glibc.malloc.*, MALLOC_MMAP_THRESHOLD_ or
// MALLOC_TRIM_THRESHOLD_: the operator's choice wins), nor without glibc.
// Idempotent and thread-safe; true when the thresholds are (now) set.
bool RetainTransportBuffers();

}  // namespace depot

#endif  // DEPOT_COMMON_WIRE_TRANSPORT_MEMORY_H_
