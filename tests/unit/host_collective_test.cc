// HostCollective (client/src/gpu/host_collective.h): the node's collectives
// between threads, with one HostDevice per rank, as the GPU workers' tests
// will use them.
#include "gpu/host_collective.h"

#include <cstring>
#include <memory>
#include <vector>

#include "absl/time/clock.h"
#include "depot/dtype.h"
#include "gpu/host_device.h"
#include "gtest/gtest.h"

namespace depot::gpu {
namespace {

constexpr int kRanks = 4;
constexpr size_t kCount = 5;  // elements each rank receives

// One rank: its device, a stream, and its collective.
struct Rank {
  HostDevice device;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<Collective> collective;
};

class HostCollectiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    group_ = HostCollectiveGroup::Create(kRanks);
    for (int r = 0; r < kRanks; ++r) {
      ranks_[r].stream = ranks_[r].device.CreateStream().value();
      ranks_[r].collective = group_->Join(r, ranks_[r].device);
    }
  }

  // `values` copied into new device memory of rank r.
  std::unique_ptr<Buffer> OnDevice(int r, const std::vector<float>& values) {
    auto buffer = ranks_[r].device.Allocate(values.size() * 4).value();
    EXPECT_TRUE(ranks_[r]
                    .device
                    .CopyAsync(*ranks_[r].stream, buffer->data(),
                               values.data(), values.size() * 4,
                               CopyKind::kHostToDevice)
                    .ok());
    EXPECT_TRUE(ranks_[r].device.SynchronizeStream(*ranks_[r].stream).ok());
    return buffer;
  }

  static std::vector<float> Floats(const Buffer& buffer, size_t n) {
    std::vector<float> out(n);
    std::memcpy(out.data(), buffer.data(), n * 4);
    return out;
  }

  void SyncAll() {
    for (Rank& rank : ranks_) {
      ASSERT_TRUE(rank.device.SynchronizeStream(*rank.stream).ok());
    }
  }

  // Rank r's send values: distinct, with fractions that make the order of a
  // sum matter.
  static std::vector<float> SendValues(int r, size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = 1.0f / (3.0f + r) + 1e7f * (i % 2);
    return v;
  }

  std::shared_ptr<HostCollectiveGroup> group_;
  Rank ranks_[kRanks];
};

TEST_F(HostCollectiveTest, ReduceScatterSumsEachSliceInRankOrder) {
  std::vector<std::unique_ptr<Buffer>> send, recv;
  for (int r = 0; r < kRanks; ++r) {
    send.push_back(OnDevice(r, SendValues(r, kRanks * kCount)));
    recv.push_back(ranks_[r].device.Allocate(kCount * 4).value());
  }
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(ranks_[r]
                    .collective
                    ->ReduceScatterSum(send[r]->data(), recv[r]->data(),
                                       kCount, DType::kFloat32,
                                       *ranks_[r].stream)
                    .ok());
  }
  SyncAll();
  for (int r = 0; r < kRanks; ++r) {
    for (size_t j = 0; j < kCount; ++j) {
      float expected = SendValues(0, kRanks * kCount)[r * kCount + j];
      for (int q = 1; q < kRanks; ++q) {
        expected += SendValues(q, kRanks * kCount)[r * kCount + j];
      }
      EXPECT_EQ(Floats(*recv[r], kCount)[j], expected) << r << " " << j;
    }
  }
  EXPECT_TRUE(group_->errors().empty());
}

TEST_F(HostCollectiveTest, Bf16IsSummedInFp32AndRoundedOnce) {
  std::vector<std::unique_ptr<Buffer>> send, recv;
  const uint16_t one = FloatToBFloat16(1.0f);
  const uint16_t tiny = FloatToBFloat16(1.0f / 256);  // below 1's bf16 ulp/2
  for (int r = 0; r < kRanks; ++r) {
    auto buffer = ranks_[r].device.Allocate(kRanks * 2).value();
    std::vector<uint16_t> values(kRanks, r == 0 ? one : tiny);
    ASSERT_TRUE(ranks_[r]
                    .device
                    .CopyAsync(*ranks_[r].stream, buffer->data(),
                               values.data(), kRanks * 2,
                               CopyKind::kHostToDevice)
                    .ok());
    // `values` must outlive the asynchronous copy.
    ASSERT_TRUE(ranks_[r].device.SynchronizeStream(*ranks_[r].stream).ok());
    send.push_back(std::move(buffer));
    recv.push_back(ranks_[r].device.Allocate(2).value());
  }
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(ranks_[r]
                    .collective
                    ->ReduceScatterSum(send[r]->data(), recv[r]->data(), 1,
                                       DType::kBFloat16, *ranks_[r].stream)
                    .ok());
  }
  SyncAll();
  // 1 + 3/256 in fp32, rounded once to bf16 (1 + 2/256); summing in bf16
  // would have stayed at 1 after every add.
  uint16_t got;
  std::memcpy(&got, recv[0]->data(), 2);
  EXPECT_EQ(got, FloatToBFloat16(1.0f + 3.0f / 256));
  EXPECT_NE(got, one);
}

TEST_F(HostCollectiveTest, AllGatherConcatenatesInRankOrder) {
  std::vector<std::unique_ptr<Buffer>> send, recv;
  for (int r = 0; r < kRanks; ++r) {
    send.push_back(OnDevice(r, SendValues(r, kCount)));
    recv.push_back(ranks_[r].device.Allocate(kRanks * kCount * 4).value());
  }
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(ranks_[r]
                    .collective
                    ->AllGather(send[r]->data(), recv[r]->data(), kCount,
                                DType::kFloat32, *ranks_[r].stream)
                    .ok());
  }
  SyncAll();
  std::vector<float> expected;
  for (int q = 0; q < kRanks; ++q) {
    for (float v : SendValues(q, kCount)) expected.push_back(v);
  }
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(Floats(*recv[r], kRanks * kCount), expected) << r;
  }
}

TEST_F(HostCollectiveTest, AllReduceInPlaceReadsEveryRankBeforeAnyWrites) {
  std::vector<std::unique_ptr<Buffer>> data;
  for (int r = 0; r < kRanks; ++r) data.push_back(OnDevice(r, {float(r + 1)}));
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(ranks_[r]
                    .collective
                    ->AllReduceSum(static_cast<float*>(data[r]->data()), 1,
                                   *ranks_[r].stream)
                    .ok());
  }
  SyncAll();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(Floats(*data[r], 1)[0], 10.0f) << r;  // 1 + 2 + 3 + 4
  }
}

TEST_F(HostCollectiveTest, MismatchedCallsAreRecordedAndComputeNothing) {
  std::vector<std::unique_ptr<Buffer>> data;
  for (int r = 0; r < kRanks; ++r) data.push_back(OnDevice(r, {7.0f}));
  for (int r = 0; r < kRanks; ++r) {
    // Rank 2 gathers where the others reduce.
    absl::Status s =
        r == 2 ? ranks_[r].collective->AllGather(
                     data[r]->data(), data[r]->data(), 1, DType::kFloat32,
                     *ranks_[r].stream)
               : ranks_[r].collective->AllReduceSum(
                     static_cast<float*>(data[r]->data()), 1,
                     *ranks_[r].stream);
    ASSERT_TRUE(s.ok());
  }
  SyncAll();
  ASSERT_EQ(group_->errors().size(), 1u);
  EXPECT_NE(group_->errors()[0].find("rank 2"), std::string::npos);
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(Floats(*data[r], 1)[0], 7.0f);
}

// A rank that never comes (rank 3) holds every other rank's call until one
// of them aborts: then every waiting call ends without computing, later
// calls queue nothing, and the other ranks' AsyncError names who aborted.
TEST_F(HostCollectiveTest, AbortEndsEveryRanksWaitingCallsAndLaterOnesFail) {
  std::vector<std::unique_ptr<Buffer>> data;
  for (int r = 0; r < kRanks; ++r) data.push_back(OnDevice(r, {7.0f}));
  for (int r = 0; r < kRanks - 1; ++r) {
    ASSERT_TRUE(ranks_[r]
                    .collective
                    ->AllReduceSum(static_cast<float*>(data[r]->data()), 1,
                                   *ranks_[r].stream)
                    .ok());
  }
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(group_->aborted());
  ranks_[1].collective->Abort();
  SyncAll();  // would wait for ever without the abort
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(Floats(*data[r], 1)[0], 7.0f);
  EXPECT_TRUE(group_->aborted());
  EXPECT_TRUE(ranks_[1].collective->AsyncError().ok());  // its own abort
  for (int r : {0, 2, 3}) {
    const absl::Status error = ranks_[r].collective->AsyncError();
    EXPECT_EQ(error.code(), absl::StatusCode::kUnavailable) << error;
    EXPECT_NE(error.message().find("local rank 1 aborted"), std::string::npos)
        << error;
  }
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(ranks_[r]
                  .collective
                  ->AllReduceSum(static_cast<float*>(data[r]->data()), 1,
                                 *ranks_[r].stream)
                  .code(),
              absl::StatusCode::kFailedPrecondition);
  }
  SyncAll();
  EXPECT_TRUE(group_->errors().empty());
}

TEST_F(HostCollectiveTest, NullBuffersAreRejectedWithoutQueuingAnything) {
  EXPECT_EQ(ranks_[0]
                .collective
                ->ReduceScatterSum(nullptr, nullptr, 3, DType::kFloat32,
                                   *ranks_[0].stream)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace depot::gpu
