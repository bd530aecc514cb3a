// MemoryBudget: the server's --memory_limit_bytes, shared by everything a
// client can make the server hold: jobs' state and bookkeeping (JobStore, at
// CreateJob) and the gradient payloads waiting for peers (ShardState, per
// contribution). What does not fit is refused (RESOURCE_EXHAUSTED), so the
// sum never exceeds the limit, except for what Charge adds unconditionally
// (a two-phase step's sums, which replace the larger payloads they are summed
// from).
//
// Thread safety: all methods may be called concurrently.
#ifndef DEPOT_SERVER_MEMORY_BUDGET_H_
#define DEPOT_SERVER_MEMORY_BUDGET_H_

#include <atomic>
#include <cstdint>

namespace depot {

class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t limit_bytes) : limit_(limit_bytes) {}

  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  uint64_t limit() const { return limit_; }
  uint64_t used() const { return used_.load(std::memory_order_relaxed); }

  // Adds `bytes` if the total stays within the limit; false (nothing added)
  // otherwise.
  bool TryReserve(uint64_t bytes) {
    uint64_t used = used_.load(std::memory_order_relaxed);
    do {
      if (bytes > limit_ || used > limit_ - bytes) return false;
    } while (!used_.compare_exchange_weak(used, used + bytes,
                                          std::memory_order_relaxed));
    return true;
  }

  // Adds `bytes` whatever the total.
  void Charge(uint64_t bytes) {
    used_.fetch_add(bytes, std::memory_order_relaxed);
  }

  // Gives back `bytes` reserved or charged earlier.
  void Release(uint64_t bytes) {
    used_.fetch_sub(bytes, std::memory_order_relaxed);
  }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};
};

// Bytes reserved in a budget for as long as it lives (a staged import).
class ScopedReservation {
 public:
  explicit ScopedReservation(MemoryBudget* budget) : budget_(budget) {}
  ~ScopedReservation() { budget_->Release(bytes_); }
  ScopedReservation(const ScopedReservation&) = delete;
  ScopedReservation& operator=(const ScopedReservation&) = delete;

  // As MemoryBudget::TryReserve; what it adds is released with this.
  bool TryAdd(uint64_t bytes) {
    if (!budget_->TryReserve(bytes)) return false;
    bytes_ += bytes;
    return true;
  }
  uint64_t bytes() const { return bytes_; }

 private:
  MemoryBudget* const budget_;
  uint64_t bytes_ = 0;
};

}  // namespace depot

#endif  // DEPOT_SERVER_MEMORY_BUDGET_H_
