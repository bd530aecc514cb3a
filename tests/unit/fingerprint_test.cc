#include <cmath>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "depot/job_config.h"
#include "gtest/gtest.h"
#include "tests/unit/job_config_mutations.h"

namespace depot {
namespace {

using ::depot::testing::BaseJob;
using ::depot::testing::SingleFieldMutations;

TEST(FingerprintTest, EqualConfigsHaveEqualFingerprints) {
  EXPECT_EQ(Fingerprint(BaseJob()), Fingerprint(BaseJob()));
}

TEST(FingerprintTest, ChangingAnySingleFieldButTheServerCountChangesIt) {
  const uint64_t base = Fingerprint(BaseJob());
  const uint64_t with_servers = FingerprintWithServerCount(BaseJob());
  for (const auto& [what, mutate] : SingleFieldMutations()) {
    JobConfig config = BaseJob();
    mutate(config);
    EXPECT_NE(FingerprintWithServerCount(config), with_servers) << what;
    if (what == "num_servers") {
      // A state moves between server counts.
      EXPECT_EQ(Fingerprint(config), base) << what;
    } else {
      EXPECT_NE(Fingerprint(config), base) << what;
    }
  }
}

TEST(FingerprintTest, DifferentMutationsGiveDifferentFingerprints) {
  std::set<uint64_t> seen = {Fingerprint(BaseJob())};
  for (const auto& [what, mutate] : SingleFieldMutations()) {
    if (what == "num_servers") continue;
    JobConfig config = BaseJob();
    mutate(config);
    EXPECT_TRUE(seen.insert(Fingerprint(config)).second) << what;
  }
}

TEST(FingerprintTest, TheCheckpointIntervalIsNotPartOfIt) {
  // How often a job is checkpointed is not what the job is: changing it
  // must not make a new job, nor make a saved state or checkpoint foreign.
  JobConfig config = BaseJob();
  config.checkpoint_every_steps = 25;
  EXPECT_EQ(Fingerprint(config), Fingerprint(BaseJob()));
  EXPECT_EQ(FingerprintWithServerCount(config),
            FingerprintWithServerCount(BaseJob()));
}

TEST(FingerprintTest, TensorOrderMatters) {
  JobConfig swapped = BaseJob();
  std::swap(swapped.tensors[0], swapped.tensors[1]);
  EXPECT_NE(Fingerprint(swapped), Fingerprint(BaseJob()));
}

TEST(FingerprintTest, StringBoundariesMatter) {
  // Same characters in sequence, split differently between two strings.
  JobConfig a = BaseJob();
  JobConfig b = BaseJob();
  // (Move-assigned std::strings: assigning literals trips GCC 12's false
  // -Wrestrict warning at -O3, GCC bug 105329.)
  a.name = std::string("ab");
  a.tensors[0].name = std::string("c");
  b.name = std::string("a");
  b.tensors[0].name = std::string("bc");
  EXPECT_NE(Fingerprint(a), Fingerprint(b));
}

TEST(FingerprintTest, IsStableAcrossBuildsAndMachines) {
  // A golden value: the fingerprint travels between processes and hosts, so
  // its encoding must not change silently. If this fails after an intended
  // encoding change, bump kFingerprintTag in job_config.cc and update the
  // value.
  EXPECT_EQ(Fingerprint(BaseJob()), uint64_t{971369261580711286u});
  // The earlier encoding, which state blobs of format 1 and 2 carry, must
  // not change at all.
  EXPECT_EQ(FingerprintWithServerCount(BaseJob()),
            uint64_t{2269984428856724807u});
}

}  // namespace
}  // namespace depot
