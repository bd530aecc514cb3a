// NcclCollective on a real GPU: a one-rank communicator's reduce-scatter,
// all-gather and all-reduce (with one rank, each is a copy), its abort, and
// WatchedCollective over it (CUDA events queried from the watch thread).
// Skips, saying why, without a CUDA device.
#include "gpu/nccl_collective.h"

#include <cstring>
#include <memory>
#include <vector>

#include "gpu/cuda_device.h"
#include "gpu/watched_collective.h"
#include "gtest/gtest.h"

namespace depot::gpu {
namespace {

// Device 0 and a one-rank communicator on it; skips without a device.
class NcclCollectiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Device>> made = MakeCudaDevice(0);
    if (!made.ok()) GTEST_SKIP() << made.status().message();
    device_ = *std::move(made);
    absl::StatusOr<NcclUniqueId> id = NewNcclUniqueId();
    ASSERT_TRUE(id.ok()) << id.status();
    absl::StatusOr<std::unique_ptr<Collective>> collective =
        MakeNcclCollective(*id, 0, 1, 0);
    ASSERT_TRUE(collective.ok()) << collective.status();
    nccl_ = *std::move(collective);
  }

  std::unique_ptr<Device> device_;
  std::unique_ptr<Collective> nccl_;
};

TEST_F(NcclCollectiveTest, OneRankCollectivesCopyOnTheStreamsTheyAreGiven) {
  auto stream = device_->CreateStream().value();
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.0f};
  const size_t bytes = values.size() * sizeof(float);
  auto host = device_->AllocatePinned(bytes).value();
  auto a = device_->Allocate(bytes).value();
  auto b = device_->Allocate(bytes).value();
  std::memcpy(host->data(), values.data(), bytes);
  ASSERT_TRUE(device_
                  ->CopyAsync(*stream, a->data(), host->data(), bytes,
                              CopyKind::kHostToDevice)
                  .ok());
  ASSERT_TRUE(nccl_
                  ->ReduceScatterSum(a->data(), b->data(), values.size(),
                                     DType::kFloat32, *stream)
                  .ok());
  ASSERT_TRUE(
      nccl_
          ->AllReduceSum(static_cast<float*>(b->data()), values.size(), *stream)
          .ok());
  ASSERT_TRUE(nccl_
                  ->AllGather(b->data(), a->data(), values.size(),
                              DType::kFloat32, *stream)
                  .ok());
  std::memset(host->data(), 0, bytes);
  ASSERT_TRUE(device_
                  ->CopyAsync(*stream, host->data(), a->data(), bytes,
                              CopyKind::kDeviceToHost)
                  .ok());
  ASSERT_TRUE(device_->SynchronizeStream(*stream).ok());
  EXPECT_EQ(std::memcmp(host->data(), values.data(), bytes), 0);
}

// Calls through a watch complete as without it and expire nothing; an
// abort refuses later calls, and the aborted communicator is not destroyed
// a second time.
TEST_F(NcclCollectiveTest, AWatchedCommunicatorRunsThenAbortsCleanly) {
  int expiries = 0;
  absl::StatusOr<std::unique_ptr<WatchedCollective>> watched =
      WatchedCollective::Create(
          *device_, *nccl_, absl::Seconds(10),
          [&expiries](const absl::Status&) { ++expiries; });
  ASSERT_TRUE(watched.ok()) << watched.status();
  auto stream = device_->CreateStream().value();
  auto data = device_->Allocate(1024 * sizeof(float)).value();
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(
        (*watched)
            ->AllReduceSum(static_cast<float*>(data->data()), 1024, *stream)
            .ok());
  }
  ASSERT_TRUE(device_->SynchronizeStream(*stream).ok());
  EXPECT_TRUE(nccl_->AsyncError().ok());
  EXPECT_TRUE((*watched)->AsyncError().ok());
  (*watched)->Abort();
  EXPECT_EQ(expiries, 1);
  EXPECT_TRUE(nccl_->AsyncError().ok());  // its own abort
  EXPECT_EQ(
      nccl_->AllReduceSum(static_cast<float*>(data->data()), 1024, *stream)
          .code(),
      absl::StatusCode::kFailedPrecondition);
  watched->reset();
  nccl_.reset();  // must not destroy the aborted communicator again
}

}  // namespace
}  // namespace depot::gpu
