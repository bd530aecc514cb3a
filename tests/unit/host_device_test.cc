// HostDevice (client/src/gpu/host_device.h): CUDA's stream and event
// semantics on the host, and the checks that make engine bugs fail tests.
#include "gpu/host_device.h"

#include <cstring>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace depot::gpu {
namespace {

template <typename T>
T Value(absl::StatusOr<T> v) {
  EXPECT_TRUE(v.ok()) << v.status();
  return *std::move(v);
}

class HostDeviceTest : public ::testing::Test {
 protected:
  std::unique_ptr<Stream> NewStream() { return Value(device_.CreateStream()); }
  std::unique_ptr<Event> NewEvent() { return Value(device_.CreateEvent()); }
  // Queues on `stream` a host function that blocks it until the returned
  // notification is notified.
  std::shared_ptr<absl::Notification> Block(Stream& stream) {
    auto gate = std::make_shared<absl::Notification>();
    EXPECT_TRUE(
        device_.LaunchHostFunc(stream, [gate] { gate->WaitForNotification(); })
            .ok());
    return gate;
  }

  HostDevice device_;
};

TEST_F(HostDeviceTest, CopiesOnOneStreamRunInOrder) {
  auto stream = NewStream();
  auto device = Value(device_.Allocate(4 * sizeof(float)));
  auto pinned = Value(device_.AllocatePinned(4 * sizeof(float)));
  const std::vector<float> host = {1, 2, 3, 4};
  ASSERT_TRUE(device_.CopyAsync(*stream, device->data(), host.data(),
                                sizeof(float) * 4, CopyKind::kHostToDevice)
                  .ok());
  ASSERT_TRUE(device_.CopyAsync(*stream, pinned->data(), device->data(),
                                sizeof(float) * 4, CopyKind::kDeviceToHost)
                  .ok());
  ASSERT_TRUE(device_.SynchronizeStream(*stream).ok());
  std::vector<float> out(4);
  std::memcpy(out.data(), pinned->data(), sizeof(float) * 4);
  EXPECT_EQ(out, host);
}

TEST_F(HostDeviceTest, WaitOrdersAStreamAfterAnotherStreamsEvent) {
  auto producer = NewStream();
  auto consumer = NewStream();
  auto event = NewEvent();
  auto device = Value(device_.Allocate(sizeof(float)));
  auto pinned = Value(device_.AllocatePinned(sizeof(float)));
  const float value = 42;
  auto gate = Block(*producer);
  ASSERT_TRUE(device_.CopyAsync(*producer, device->data(), &value,
                                sizeof(float), CopyKind::kHostToDevice)
                  .ok());
  ASSERT_TRUE(device_.Record(*event, *producer).ok());
  ASSERT_TRUE(device_.Wait(*consumer, *event).ok());
  ASSERT_TRUE(device_.CopyAsync(*consumer, pinned->data(), device->data(),
                                sizeof(float), CopyKind::kDeviceToHost)
                  .ok());
  // The consumer cannot have copied: the producer is still blocked.
  EXPECT_FALSE(Value(device_.Query(*event)));
  gate->Notify();
  ASSERT_TRUE(device_.SynchronizeStream(*consumer).ok());
  float out;
  std::memcpy(&out, pinned->data(), sizeof(float));
  EXPECT_EQ(out, 42.0f);
  EXPECT_EQ(device_.waits_queued(*consumer), 1u);
  EXPECT_EQ(device_.waits_queued(*producer), 0u);
}

TEST_F(HostDeviceTest, QueryAndSynchronizeFollowTheLatestRecord) {
  auto stream = NewStream();
  auto event = NewEvent();
  EXPECT_TRUE(Value(device_.Query(*event)));  // never recorded
  ASSERT_TRUE(device_.Record(*event, *stream).ok());
  ASSERT_TRUE(device_.Synchronize(*event).ok());
  EXPECT_TRUE(Value(device_.Query(*event)));
  auto gate = Block(*stream);
  ASSERT_TRUE(device_.Record(*event, *stream).ok());
  EXPECT_FALSE(Value(device_.Query(*event)));
  gate->Notify();
  ASSERT_TRUE(device_.Synchronize(*event).ok());
  EXPECT_TRUE(Value(device_.Query(*event)));
}

TEST_F(HostDeviceTest, HostAccessToMemoryACopyHasNotFinishedWithFails) {
  auto stream = NewStream();
  auto device = Value(device_.Allocate(64));
  auto slot = Value(device_.AllocatePinned(64));
  auto gate = Block(*stream);
  ASSERT_TRUE(device_.CopyAsync(*stream, slot->data(), device->data(), 64,
                                CopyKind::kDeviceToHost)
                  .ok());
  // A sender reading the slot, or the engine refilling it, before the copy
  // into it finished: the bugs the engine's tests must catch.
  EXPECT_EQ(device_.CheckHostAccess(slot->data(), 8, /*write=*/false).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(device_.CheckHostAccess(slot->data(), 64, /*write=*/true).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(device_.violations().size(), 2u);
  gate->Notify();
  ASSERT_TRUE(device_.SynchronizeStream(*stream).ok());
  EXPECT_TRUE(device_.CheckHostAccess(slot->data(), 64, true).ok());
}

TEST_F(HostDeviceTest, WritingTheSourceOfAPendingCopyFailsReadingItDoesNot) {
  auto stream = NewStream();
  auto device = Value(device_.Allocate(64));
  auto slot = Value(device_.AllocatePinned(64));
  auto gate = Block(*stream);
  ASSERT_TRUE(device_.CopyAsync(*stream, device->data(), slot->data(), 64,
                                CopyKind::kHostToDevice)
                  .ok());
  EXPECT_TRUE(device_.CheckHostAccess(slot->data(), 64, false).ok());
  EXPECT_FALSE(device_.CheckHostAccess(slot->data(), 64, true).ok());
  gate->Notify();
  ASSERT_TRUE(device_.SynchronizeStream(*stream).ok());
}

TEST_F(HostDeviceTest, CopiesWhosePointersAreNotWhereTheKindSaysAreRejected) {
  auto stream = NewStream();
  auto device = Value(device_.Allocate(64));
  auto pinned = Value(device_.AllocatePinned(64));
  // Into pinned memory "host to device", out of device memory past its end,
  // a null pointer.
  EXPECT_EQ(device_.CopyAsync(*stream, pinned->data(), device->data(), 64,
                              CopyKind::kHostToDevice)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device_.CopyAsync(*stream, pinned->data(),
                              static_cast<char*>(device->data()) + 32, 64,
                              CopyKind::kDeviceToHost)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device_.CopyAsync(*stream, nullptr, device->data(), 8,
                              CopyKind::kDeviceToHost)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(HostDeviceTest, ObjectsOfAnotherDeviceAreRejected) {
  HostDevice other;
  auto stream = Value(other.CreateStream());
  auto event = Value(other.CreateEvent());
  auto mine = NewStream();
  EXPECT_EQ(device_.Record(*event, *mine).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device_.Wait(*stream, *NewEvent()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device_.SynchronizeStream(*stream).code(),
            absl::StatusCode::kInvalidArgument);
}

// A throttled HostDevice is a DMA link (host_device.h, "Timing"): copies on
// a stream take bytes / rate each, back to back, and never less.
class ThrottledHostDeviceTest : public ::testing::Test {
 protected:
  static constexpr double kRate = 200e6;  // bytes per second
  static constexpr size_t kBytes = size_t{1} << 20;
  static absl::Duration LinkTime(size_t bytes) {
    return absl::Seconds(static_cast<double>(bytes) / kRate);
  }

  HostDevice device_{HostDevice::Options{kRate, 0}};
};

TEST_F(ThrottledHostDeviceTest, CopiesOnAStreamTakeTheLinksTimeAndNoLess) {
  auto stream = Value(device_.CreateStream());
  auto device = Value(device_.Allocate(kBytes));
  auto pinned = Value(device_.AllocatePinned(kBytes));
  constexpr int kCopies = 8;
  const absl::Time start = absl::Now();
  for (int i = 0; i < kCopies; ++i) {
    ASSERT_TRUE(device_
                    .CopyAsync(*stream, pinned->data(), device->data(), kBytes,
                               CopyKind::kDeviceToHost)
                    .ok());
  }
  ASSERT_TRUE(device_.SynchronizeStream(*stream).ok());
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, kCopies * LinkTime(kBytes));
  // Generous: a loaded machine may wake the stream late, but its copies do
  // not each add their memmove and wake-up to the link's time.
  EXPECT_LT(took, 3 * kCopies * LinkTime(kBytes));
}

TEST_F(ThrottledHostDeviceTest, ACopysBytesLandAtItsEnd) {
  auto stream = Value(device_.CreateStream());
  const size_t bytes = 4 * kBytes;  // 21 ms
  auto device = Value(device_.Allocate(bytes));
  const std::vector<unsigned char> host(bytes, 0x5A);
  const auto* out = static_cast<const unsigned char*>(device->data());
  const absl::Time start = absl::Now();
  ASSERT_TRUE(device_
                  .CopyAsync(*stream, device->data(), host.data(), bytes,
                             CopyKind::kHostToDevice)
                  .ok());
  const unsigned char first = out[0], last = out[bytes - 1];
  // The bytes move in the copy's second half at the earliest.
  if (absl::Now() - start < LinkTime(bytes) / 2) {
    EXPECT_EQ(first, 0xA5);
    EXPECT_EQ(last, 0xA5);
  }
  ASSERT_TRUE(device_.SynchronizeStream(*stream).ok());
  EXPECT_GE(absl::Now() - start, LinkTime(bytes));
  EXPECT_EQ(out[0], 0x5A);
  EXPECT_EQ(out[bytes - 1], 0x5A);
}

TEST_F(ThrottledHostDeviceTest, ACopyAfterAWaitStartsWhenTheEventIsReached) {
  auto producer = Value(device_.CreateStream());
  auto consumer = Value(device_.CreateStream());
  auto event = Value(device_.CreateEvent());
  auto device = Value(device_.Allocate(2 * kBytes));
  auto pinned = Value(device_.AllocatePinned(2 * kBytes));
  char* d = static_cast<char*>(device->data());
  char* p = static_cast<char*>(pinned->data());
  const absl::Time start = absl::Now();
  // Both copies are queued now; the consumer's may start only once the
  // producer's copy has ended.
  ASSERT_TRUE(
      device_.CopyAsync(*producer, d, p, kBytes, CopyKind::kHostToDevice).ok());
  ASSERT_TRUE(device_.Record(*event, *producer).ok());
  ASSERT_TRUE(device_.Wait(*consumer, *event).ok());
  ASSERT_TRUE(
      device_
          .CopyAsync(*consumer, p + kBytes, d, kBytes, CopyKind::kDeviceToHost)
          .ok());
  ASSERT_TRUE(device_.SynchronizeStream(*consumer).ok());
  EXPECT_GE(absl::Now() - start, 2 * LinkTime(kBytes));
}

TEST_F(ThrottledHostDeviceTest, ACopyAfterAHostFunctionStartsWhenItReturns) {
  auto stream = Value(device_.CreateStream());
  auto device = Value(device_.Allocate(kBytes));
  auto pinned = Value(device_.AllocatePinned(kBytes));
  const absl::Duration busy = absl::Milliseconds(20);
  const absl::Time start = absl::Now();
  ASSERT_TRUE(
      device_.LaunchHostFunc(*stream, [busy] { absl::SleepFor(busy); }).ok());
  ASSERT_TRUE(device_
                  .CopyAsync(*stream, pinned->data(), device->data(), kBytes,
                             CopyKind::kDeviceToHost)
                  .ok());
  ASSERT_TRUE(device_.SynchronizeStream(*stream).ok());
  EXPECT_GE(absl::Now() - start, busy + LinkTime(kBytes));
}

}  // namespace
}  // namespace depot::gpu
