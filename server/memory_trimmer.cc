#include "server/memory_trimmer.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace depot {
namespace {

// What malloc holds free, in bytes; 0 without glibc.
uint64_t MallocFreeBytes() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 33)
  return mallinfo2().fordblks;
#else
  return 0;
#endif
}

void TrimMalloc() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace

bool UseOneMallocArena() {
#if defined(__GLIBC__)
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (std::getenv("MALLOC_ARENA_MAX") != nullptr ||
      (tunables != nullptr &&
       std::strstr(tunables, "glibc.malloc.arena_max") != nullptr)) {
    return false;
  }
  return mallopt(M_ARENA_MAX, 1) == 1;
#else
  return false;
#endif
}

bool FreedMemoryWatch::ShouldTrim(uint64_t free_bytes) {
  if (!started_) {
    started_ = true;
    low_ = free_bytes;
    return false;
  }
  low_ = std::min(low_, free_bytes);
  if (free_bytes - low_ <= threshold_bytes_) return false;
  low_ = free_bytes;
  return true;
}

MemoryTrimmer::MemoryTrimmer(absl::Duration interval, uint64_t threshold_bytes)
    : interval_(interval), watch_(threshold_bytes) {
#if defined(__GLIBC__)
  thread_ = std::thread([this] { Run(); });
#endif
}

MemoryTrimmer::~MemoryTrimmer() { Stop(); }

void MemoryTrimmer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

uint64_t MemoryTrimmer::trims() const {
  absl::MutexLock lock(&mu_);
  return trims_;
}

void MemoryTrimmer::Run() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stopped = [this]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopped), interval_)) return;
    }
    if (!watch_.ShouldTrim(MallocFreeBytes())) continue;
    TrimMalloc();
    absl::MutexLock lock(&mu_);
    ++trims_;
  }
}

}  // namespace depot
