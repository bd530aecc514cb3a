// AlignedBuffer: a zeroed block of memory for job state, aligned to 2 MiB and
// advised for transparent huge pages.
//
// It maps anonymous pages instead of calling malloc: the kernel hands them out
// zeroed and commits them on first touch (so the thread that touches a page
// first decides its NUMA node: ShardState::Create touches the state from the
// update pool's threads), and freeing it returns the memory to the system at
// once. Huge pages spare the update's streams most TLB misses: a 100M
// parameter job's state is a few hundred 2 MiB pages instead of a few hundred
// thousand 4 KiB ones.
#ifndef DEPOT_SERVER_ALIGNED_BUFFER_H_
#define DEPOT_SERVER_ALIGNED_BUFFER_H_

#include <sys/mman.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace depot {

class AlignedBuffer {
 public:
  // The alignment job state arrays keep inside the buffer: a cache line, and
  // the widest SIMD load the kernels use. The buffer itself is aligned to
  // kHugePageBytes, a multiple of it.
  static constexpr size_t kAlignment = 64;
  static constexpr size_t kHugePageBytes = size_t{2} << 20;

  AlignedBuffer() = default;
  AlignedBuffer(AlignedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        mapped_(std::exchange(other.mapped_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept {
    if (this != &other) {
      Release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      mapped_ = std::exchange(other.mapped_, 0);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { Release(); }

  // A zeroed buffer of `bytes` bytes (an empty one for 0). RESOURCE_EXHAUSTED
  // when the system refuses the memory.
  static absl::StatusOr<AlignedBuffer> Allocate(size_t bytes) {
    AlignedBuffer buffer;
    if (bytes == 0) return buffer;
    // Whole huge pages, from an over-sized mapping trimmed to alignment.
    const size_t mapped =
        (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    if (mapped < bytes || mapped + kHugePageBytes < mapped) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes of job state"));
    }
    void* p = mmap(nullptr, mapped + kHugePageBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot allocate ", bytes, " bytes of job state: ", strerror(errno)));
    }
    const uintptr_t start = reinterpret_cast<uintptr_t>(p);
    const uintptr_t aligned =
        (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    if (aligned > start) munmap(p, aligned - start);
    const uintptr_t end = start + mapped + kHugePageBytes;
    if (end > aligned + mapped) {
      munmap(reinterpret_cast<void*>(aligned + mapped),
             end - (aligned + mapped));
    }
    buffer.data_ = reinterpret_cast<void*>(aligned);
    buffer.size_ = bytes;
    buffer.mapped_ = mapped;
    // Errors are ignored: EINVAL means a kernel without transparent huge
    // pages, where small pages work as well, only slower. (With THP set to
    // "never" the call succeeds and changes nothing.)
    madvise(buffer.data_, mapped, MADV_HUGEPAGE);
    return buffer;
  }

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void Release() {
    if (data_ != nullptr) munmap(data_, mapped_);
    data_ = nullptr;
    size_ = 0;
    mapped_ = 0;
  }

  void* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;  // size_ rounded up to whole huge pages
};

}  // namespace depot

#endif  // DEPOT_SERVER_ALIGNED_BUFFER_H_
