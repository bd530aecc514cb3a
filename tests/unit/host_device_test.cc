// HostDevice (client/src/gpu/host_device.h): CUDA's stream and event
// semantics on the host, and the checks that make engine bugs fail tests.
#include "gpu/host_device.h"

#include <cstring>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
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

}  // namespace
}  // namespace depot::gpu
