// Job::SaveState / LoadState through real servers: a run saved at step 10 and
// resumed in a fresh job (another name, same config) reaches bit for bit the
// state of an uninterrupted run, and a damaged or foreign blob changes nothing.
#include <memory>
#include <string>
#include <vector>

#include "bitwise_compare.h"
#include "client_training.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "training_data.h"
#include "two_servers.h"

namespace depot::testing {
namespace {

constexpr uint64_t kSeed = 11;
constexpr uint64_t kSaveAt = 10;
constexpr uint64_t kSteps = 20;

class StateSaveTest : public TwoServers {
 protected:
  // Opens `name` (SmallJobConfig, two workers, two servers) and initialises it.
  std::unique_ptr<ClientTraining> OpenJob(const std::string& name) {
    absl::StatusOr<std::unique_ptr<ClientTraining>> training =
        ClientTraining::Open(Addresses(), SmallJobConfig(name, 2, 2));
    EXPECT_TRUE(training.ok()) << training.status();
    if (!training.ok()) return nullptr;
    absl::Status init = (*training)->InitWeights(kSeed, DType::kFloat32);
    EXPECT_TRUE(init.ok()) << init;
    return *std::move(training);
  }

  // Runs steps first..last on every worker; the last weights of worker 0.
  static std::string Train(ClientTraining& training, uint64_t first,
                           uint64_t last) {
    absl::StatusOr<std::string> weights = training.Train(kSeed, first, last);
    EXPECT_TRUE(weights.ok()) << weights.status();
    return weights.ok() ? *std::move(weights) : std::string();
  }

  static std::string SavedAtStep10(ClientTraining& training) {
    Train(training, 1, kSaveAt);
    absl::StatusOr<std::string> blob = training.job(0).SaveState();
    EXPECT_TRUE(blob.ok()) << blob.status();
    return blob.ok() ? *blob : std::string();
  }

  // Expects `training`'s state to be untouched by a failed load.
  static void ExpectChecksums(ClientTraining& training,
                              const std::vector<uint64_t>& expected) {
    absl::StatusOr<std::vector<uint64_t>> now = training.StateChecksums();
    ASSERT_TRUE(now.ok()) << now.status();
    EXPECT_EQ(*now, expected);
  }
};

TEST_F(StateSaveTest, ResumedRunMatchesUninterruptedRunBitForBit) {
  std::unique_ptr<ClientTraining> whole = OpenJob("whole");
  ASSERT_NE(whole, nullptr);
  const std::string whole_weights = Train(*whole, 1, kSteps);
  absl::StatusOr<std::vector<float>> whole_master = whole->PullMaster();
  ASSERT_TRUE(whole_master.ok()) << whole_master.status();

  std::unique_ptr<ClientTraining> first = OpenJob("first-half");
  ASSERT_NE(first, nullptr);
  const std::string blob = SavedAtStep10(*first);
  ASSERT_FALSE(blob.empty());

  std::unique_ptr<ClientTraining> resumed = OpenJob("resumed");
  ASSERT_NE(resumed, nullptr);
  absl::Status load = resumed->job(0).LoadState(blob);
  ASSERT_TRUE(load.ok()) << load;
  const std::string resumed_weights = Train(*resumed, kSaveAt + 1, kSteps);
  absl::StatusOr<std::vector<float>> resumed_master = resumed->PullMaster();
  ASSERT_TRUE(resumed_master.ok()) << resumed_master.status();

  EXPECT_TRUE(BitwiseEqual(*whole_master, *resumed_master));
  EXPECT_TRUE(BitwiseEqual(whole_weights, resumed_weights, sizeof(float)));
  absl::StatusOr<std::vector<uint64_t>> whole_sums = whole->StateChecksums();
  absl::StatusOr<std::vector<uint64_t>> resumed_sums =
      resumed->StateChecksums();
  ASSERT_TRUE(whole_sums.ok() && resumed_sums.ok());
  EXPECT_EQ(*whole_sums, *resumed_sums);
}

TEST_F(StateSaveTest, CorruptBlobIsDataLossAndChangesNothing) {
  std::unique_ptr<ClientTraining> source = OpenJob("source");
  ASSERT_NE(source, nullptr);
  std::string blob = SavedAtStep10(*source);
  ASSERT_GT(blob.size(), 100u);
  std::unique_ptr<ClientTraining> target = OpenJob("target");
  ASSERT_NE(target, nullptr);
  absl::StatusOr<std::vector<uint64_t>> before = target->StateChecksums();
  ASSERT_TRUE(before.ok()) << before.status();

  blob[blob.size() / 2] ^= 0x10;
  absl::Status load = target->job(0).LoadState(blob);
  EXPECT_EQ(load.code(), absl::StatusCode::kDataLoss) << load;
  ExpectChecksums(*target, *before);
}

TEST_F(StateSaveTest, TruncatedBlobIsDataLossAndChangesNothing) {
  std::unique_ptr<ClientTraining> source = OpenJob("source");
  ASSERT_NE(source, nullptr);
  const std::string blob = SavedAtStep10(*source);
  std::unique_ptr<ClientTraining> target = OpenJob("target");
  ASSERT_NE(target, nullptr);
  absl::StatusOr<std::vector<uint64_t>> before = target->StateChecksums();
  ASSERT_TRUE(before.ok()) << before.status();

  absl::Status load = target->job(0).LoadState(blob.substr(0, blob.size() - 7));
  EXPECT_EQ(load.code(), absl::StatusCode::kDataLoss) << load;
  ExpectChecksums(*target, *before);
}

TEST_F(StateSaveTest, BlobOfAnotherConfigIsFailedPrecondition) {
  std::unique_ptr<ClientTraining> source = OpenJob("source");
  ASSERT_NE(source, nullptr);
  const std::string blob = SavedAtStep10(*source);
  JobConfig other = SmallJobConfig("other", 2, 2);
  other.optimizer.lr *= 2;
  absl::StatusOr<std::unique_ptr<ClientTraining>> target =
      ClientTraining::Open(Addresses(), other);
  ASSERT_TRUE(target.ok()) << target.status();
  absl::StatusOr<std::vector<uint64_t>> before = (*target)->StateChecksums();
  ASSERT_TRUE(before.ok()) << before.status();

  absl::Status load = (*target)->job(0).LoadState(blob);
  EXPECT_EQ(load.code(), absl::StatusCode::kFailedPrecondition) << load;
  // The field that differs, with both values, each side named.
  EXPECT_THAT(load.message(),
              ::testing::HasSubstr(absl::StrCat(
                  "optimizer.lr: ", source->job(0).config().optimizer.lr,
                  " (checkpoint) vs ", other.optimizer.lr, " (this job)")));
  ExpectChecksums(**target, *before);
}

// Job::ReadStatePart / PatchStatePart (an ImportState patch, the GPU worker's
// kept state): two tensors whose chunks lie on both servers are read, changed
// and patched back; only their elements and counts change, padding and every
// other value stay, and a part of another step, an empty range or arrays of
// the wrong size are refused with nothing changed.
TEST_F(StateSaveTest, APatchedPartChangesOnlyItsTensorsOnEveryServer) {
  std::unique_ptr<ClientTraining> training = OpenJob("patched");
  ASSERT_NE(training, nullptr);
  Train(*training, 1, kSaveAt);
  Job& job = training->job(0);
  const Layout& layout = job.layout();
  const auto whole_state = [&]() {
    absl::StatusOr<std::string> blob = job.SaveState();
    EXPECT_TRUE(blob.ok()) << blob.status();
    absl::StatusOr<FlatState> state = job.DecodeState(blob.value_or(""));
    EXPECT_TRUE(state.ok()) << state.status();
    return state.value_or(FlatState());
  };
  const FlatState before = whole_state();
  // The tensor the second server's shard begins in, and the next one.
  const uint64_t boundary =
      job.plan().chunk(job.plan().shard(1).first_chunk).begin;
  size_t t0 = 0;
  while (t0 + 1 < layout.tensors().size() && layout.offset(t0 + 1) < boundary) {
    ++t0;
  }
  ASSERT_LT(t0 + 1, layout.tensors().size());
  const uint64_t begin = layout.offset(t0);
  const uint64_t end = layout.offset(t0 + 1) + layout.tensors()[t0 + 1].numel;
  ASSERT_LT(begin, boundary);
  ASSERT_GT(end, boundary);

  absl::StatusOr<FlatState> part = job.ReadStatePart(begin, end);
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(part->applied_step, kSaveAt);
  ASSERT_EQ(part->master.size(), end - begin);
  EXPECT_TRUE(BitwiseEqual(part->master,
                           std::vector<float>(before.master.begin() + begin,
                                              before.master.begin() + end)));
  EXPECT_EQ(part->tensor_steps[t0], before.tensor_steps[t0]);

  FlatState changed = *part;
  for (float& v : changed.master) v += 1.0f;
  for (std::vector<float>& slot : changed.slots) {
    for (float& v : slot) v = 0.5f;
  }
  changed.tensor_steps[t0] = 3;
  changed.tensor_steps[t0 + 1] = 4;

  absl::StatusOr<std::vector<uint64_t>> checksums = training->StateChecksums();
  ASSERT_TRUE(checksums.ok()) << checksums.status();
  FlatState other_step = changed;
  other_step.applied_step = kSaveAt + 1;
  EXPECT_EQ(job.PatchStatePart(begin, end, other_step).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(job.PatchStatePart(end, begin, changed).code(),
            absl::StatusCode::kOutOfRange);
  FlatState short_part = changed;
  short_part.master.pop_back();
  EXPECT_EQ(job.PatchStatePart(begin, end, short_part).code(),
            absl::StatusCode::kInvalidArgument);
  ExpectChecksums(*training, *checksums);

  ASSERT_TRUE(job.PatchStatePart(begin, end, changed).ok());
  const FlatState after = whole_state();
  EXPECT_EQ(after.applied_step, kSaveAt);
  for (size_t t = 0; t < layout.tensors().size(); ++t) {
    const bool in_part = t == t0 || t == t0 + 1;
    EXPECT_EQ(after.tensor_steps[t],
              in_part ? changed.tensor_steps[t] : before.tensor_steps[t])
        << "tensor " << t;
  }
  std::vector<bool> in_tensor(layout.total_elems(), false);
  for (size_t t : {t0, t0 + 1}) {
    for (uint64_t i = 0; i < layout.tensors()[t].numel; ++i) {
      in_tensor[layout.offset(t) + i] = true;
    }
  }
  FlatState want = before;
  for (uint64_t i = 0; i < layout.total_elems(); ++i) {
    if (!in_tensor[i]) continue;
    want.master[i] = changed.master[i - begin];
    for (std::vector<float>& slot : want.slots) slot[i] = 0.5f;
  }
  EXPECT_TRUE(BitwiseEqual(want.master, after.master)) << "master weights";
  ASSERT_EQ(after.slots.size(), want.slots.size());
  for (size_t k = 0; k < want.slots.size(); ++k) {
    EXPECT_TRUE(BitwiseEqual(want.slots[k], after.slots[k])) << "slot " << k;
  }
}

}  // namespace
}  // namespace depot::testing
