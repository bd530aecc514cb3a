// CudaDevice on a real GPU: copies, events and host functions in the order
// the Device interface promises. Skips, saying why, without a CUDA device.
#include "gpu/cuda_device.h"

#include <cstring>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace depot::gpu {
namespace {

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Device>> device = MakeCudaDevice(0);
    if (!device.ok()) GTEST_SKIP() << device.status().message();
    device_ = *std::move(device);
  }
  std::unique_ptr<Device> device_;
};

TEST_F(CudaDeviceTest, RoundTripThroughTheDeviceOnTwoOrderedStreams) {
  auto h2d = device_->CreateStream().value();
  auto d2h = device_->CreateStream().value();
  auto copied = device_->CreateEvent().value();
  const size_t bytes = 1 << 20;
  auto in = device_->AllocatePinned(bytes).value();
  auto out = device_->AllocatePinned(bytes).value();
  auto device = device_->Allocate(bytes).value();
  std::vector<unsigned char> pattern(bytes);
  for (size_t i = 0; i < bytes; ++i) pattern[i] = static_cast<unsigned char>(i * 7);
  std::memcpy(in->data(), pattern.data(), bytes);
  std::memset(out->data(), 0, bytes);
  ASSERT_TRUE(device_->CopyAsync(*h2d, device->data(), in->data(), bytes,
                                 CopyKind::kHostToDevice).ok());
  ASSERT_TRUE(device_->Record(*copied, *h2d).ok());
  ASSERT_TRUE(device_->Wait(*d2h, *copied).ok());
  ASSERT_TRUE(device_->CopyAsync(*d2h, out->data(), device->data(), bytes,
                                 CopyKind::kDeviceToHost).ok());
  absl::Notification ran;
  ASSERT_TRUE(device_->LaunchHostFunc(*d2h, [&ran] { ran.Notify(); }).ok());
  ASSERT_TRUE(device_->SynchronizeStream(*d2h).ok());
  EXPECT_TRUE(ran.HasBeenNotified());
  EXPECT_TRUE(device_->Query(*copied).value());
  EXPECT_EQ(std::memcmp(out->data(), pattern.data(), bytes), 0);
}

}  // namespace
}  // namespace depot::gpu
