#include "server/memory_trimmer.h"

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "wire/transport_memory.h"

namespace depot {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(FreedMemoryWatchTest, TrimsOnceTheFreeMemoryGrewBeyondTheThreshold) {
  FreedMemoryWatch watch(64 * kMiB);
  EXPECT_FALSE(watch.ShouldTrim(10 * kMiB));  // the first look sets the low
  EXPECT_FALSE(watch.ShouldTrim(74 * kMiB));  // 64 MiB more: not beyond
  EXPECT_TRUE(watch.ShouldTrim(75 * kMiB));
  // Trimmed pages still count as free: no second trim for them.
  EXPECT_FALSE(watch.ShouldTrim(75 * kMiB));
  EXPECT_FALSE(watch.ShouldTrim(130 * kMiB));
}

TEST(FreedMemoryWatchTest, SteadyReuseBelowTheThresholdNeverTrims) {
  FreedMemoryWatch watch(64 * kMiB);
  for (int i = 0; i < 100; ++i) {
    EXPECT_FALSE(watch.ShouldTrim((i % 2 == 0 ? 20 : 80) * kMiB)) << i;
  }
}

TEST(FreedMemoryWatchTest, FreeMemoryReusedAndFreedAgainTrimsAgain) {
  FreedMemoryWatch watch(64 * kMiB);
  EXPECT_FALSE(watch.ShouldTrim(0));
  EXPECT_TRUE(watch.ShouldTrim(100 * kMiB));
  // The released pages are reused (faulted in again), then freed again.
  EXPECT_FALSE(watch.ShouldTrim(5 * kMiB));
  EXPECT_TRUE(watch.ShouldTrim(100 * kMiB));
}

TEST(MemoryTrimmerTest, TrimsAfterALargeFree) {
  // As depot-server sets malloc: freed blocks stay in the heap.
  RetainTransportBuffers();
  MemoryTrimmer trimmer(absl::Milliseconds(5), 8 * kMiB);
  absl::SleepFor(absl::Milliseconds(50));  // its first look
  // Below the mmap threshold, so the blocks come from a heap, and stay there
  // when freed (below the trim threshold).
  std::vector<void*> blocks;
  for (int i = 0; i < 32; ++i) {
    blocks.push_back(std::malloc(kMiB));
    static_cast<char*>(blocks.back())[0] = 1;
  }
  for (void* block : blocks) std::free(block);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (trimmer.trims() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_GE(trimmer.trims(), 1u);
}

}  // namespace
}  // namespace depot
