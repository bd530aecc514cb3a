// PayloadPool: recycles the chunk-sized byte buffers of the step's hot path
// (gradient payloads as received, weight payloads as encoded), so that a
// steady stream of steps allocates nothing per chunk. A buffer is a
// std::string, the type the rest of the server already passes payloads in.
//
// The pool keeps at most `max_free_bytes` of capacity on its free list; a
// buffer given back beyond that is freed. Buffers in use are bounded by the
// Step streams' credit windows (docs/protocol.md), not by the pool.
//
// Thread safety: all methods may be called concurrently.
#ifndef DEPOT_SERVER_PAYLOAD_POOL_H_
#define DEPOT_SERVER_PAYLOAD_POOL_H_

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace depot {

class PayloadPool : public std::enable_shared_from_this<PayloadPool> {
 public:
  static std::shared_ptr<PayloadPool> Create(size_t max_free_bytes) {
    return std::shared_ptr<PayloadPool>(new PayloadPool(max_free_bytes));
  }

  PayloadPool(const PayloadPool&) = delete;
  PayloadPool& operator=(const PayloadPool&) = delete;

  // A buffer of exactly `bytes` bytes whose contents are unspecified: a free
  // buffer with enough capacity when there is one (the smallest such),
  // otherwise a new one.
  std::string Take(size_t bytes) {
    std::string buffer;
    {
      absl::MutexLock lock(&mu_);
      size_t best = free_.size();
      for (size_t i = 0; i < free_.size(); ++i) {
        if (free_[i].capacity() >= bytes &&
            (best == free_.size() ||
             free_[i].capacity() < free_[best].capacity())) {
          best = i;
        }
      }
      if (best != free_.size()) {
        buffer = std::move(free_[best]);
        free_[best] = std::move(free_.back());
        free_.pop_back();
        free_bytes_ -= buffer.capacity();
      }
    }
    buffer.resize(bytes);
    return buffer;
  }

  // Keeps `buffer` for a later Take, unless the free list is full.
  void Give(std::string buffer) {
    if (buffer.capacity() == 0) return;
    absl::MutexLock lock(&mu_);
    if (free_bytes_ + buffer.capacity() > max_free_bytes_) return;
    free_bytes_ += buffer.capacity();
    free_.push_back(std::move(buffer));
  }

  // `buffer`, shared read-only; given back to the pool when the last owner
  // lets go (freed instead if the pool is gone by then).
  std::shared_ptr<const std::string> Share(std::string buffer) {
    std::weak_ptr<PayloadPool> pool = weak_from_this();
    return std::shared_ptr<const std::string>(
        new std::string(std::move(buffer)), [pool](const std::string* s) {
          std::unique_ptr<std::string> owned(const_cast<std::string*>(s));
          if (std::shared_ptr<PayloadPool> alive = pool.lock()) {
            alive->Give(std::move(*owned));
          }
        });
  }

  size_t free_bytes() const {
    absl::MutexLock lock(&mu_);
    return free_bytes_;
  }

 private:
  explicit PayloadPool(size_t max_free_bytes)
      : max_free_bytes_(max_free_bytes) {}

  const size_t max_free_bytes_;
  mutable absl::Mutex mu_;
  std::vector<std::string> free_ ABSL_GUARDED_BY(mu_);
  size_t free_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace depot

#endif  // DEPOT_SERVER_PAYLOAD_POOL_H_
