// AlignedBuffer: a zeroed block of memory for job state, aligned to at least 64
// bytes (a cache line, and the widest SIMD load the kernels use).
//
// It maps anonymous pages instead of calling malloc: the kernel hands them out
// zeroed and commits them on first touch, so creating a large job costs no
// memset pass over its state, and freeing it returns the memory to the system
// at once.
#ifndef DEPOT_SERVER_ALIGNED_BUFFER_H_
#define DEPOT_SERVER_ALIGNED_BUFFER_H_

#include <sys/mman.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace depot {

class AlignedBuffer {
 public:
  // Page alignment is a multiple of this.
  static constexpr size_t kAlignment = 64;

  AlignedBuffer() = default;
  AlignedBuffer(AlignedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept {
    if (this != &other) {
      Release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
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
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot allocate ", bytes, " bytes of job state: ", strerror(errno)));
    }
    buffer.data_ = p;
    buffer.size_ = bytes;
    return buffer;
  }

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void Release() {
    if (data_ != nullptr) munmap(data_, size_);
    data_ = nullptr;
    size_ = 0;
  }

  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace depot

#endif  // DEPOT_SERVER_ALIGNED_BUFFER_H_
