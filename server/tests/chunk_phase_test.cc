// The chunk state machine of server/chunk_phase.h: exactly the arrows of its
// diagram are allowed, and any other move stops the server.
#include "server/chunk_phase.h"

#include <iterator>
#include <set>
#include <string>
#include <utility>

#include "gtest/gtest.h"

namespace depot {
namespace {

constexpr ChunkPhase kAll[] = {ChunkPhase::kIdle, ChunkPhase::kCollecting,
                               ChunkPhase::kSumming, ChunkPhase::kSummed,
                               ChunkPhase::kUpdating};

// The diagram of chunk_phase.h, written out again as (from, to) pairs.
const std::set<std::pair<ChunkPhase, ChunkPhase>>& Arrows() {
  static const auto* arrows = new std::set<std::pair<ChunkPhase, ChunkPhase>>{
      {ChunkPhase::kIdle, ChunkPhase::kCollecting},
      {ChunkPhase::kCollecting, ChunkPhase::kUpdating},
      {ChunkPhase::kCollecting, ChunkPhase::kSumming},
      {ChunkPhase::kSumming, ChunkPhase::kSummed},
      {ChunkPhase::kSummed, ChunkPhase::kUpdating},
      {ChunkPhase::kUpdating, ChunkPhase::kIdle},
      {ChunkPhase::kCollecting, ChunkPhase::kIdle},
      {ChunkPhase::kSummed, ChunkPhase::kIdle},
  };
  return *arrows;
}

TEST(ChunkPhaseTest, OnlyTheDiagramsArrowsAreAllowed) {
  for (const ChunkPhase from : kAll) {
    for (const ChunkPhase to : kAll) {
      EXPECT_EQ(ChunkPhaseMayMove(from, to), Arrows().count({from, to}) == 1)
          << ChunkPhaseName(from) << " -> " << ChunkPhaseName(to);
    }
  }
}

TEST(ChunkPhaseTest, AOneAndATwoPhaseStepEachComeBackToIdle) {
  ChunkPhase phase = ChunkPhase::kIdle;
  for (const ChunkPhase to :
       {ChunkPhase::kCollecting, ChunkPhase::kUpdating, ChunkPhase::kIdle,
        ChunkPhase::kCollecting, ChunkPhase::kSumming, ChunkPhase::kSummed,
        ChunkPhase::kUpdating, ChunkPhase::kIdle}) {
    MoveChunkPhase(phase, to);
    EXPECT_EQ(phase, to);
  }
}

TEST(ChunkPhaseTest, EveryPhaseHasItsOwnName) {
  std::set<std::string> names;
  for (const ChunkPhase phase : kAll) names.insert(ChunkPhaseName(phase));
  EXPECT_EQ(names.size(), std::size(kAll));
}

using ChunkPhaseDeathTest = ::testing::Test;

TEST_F(ChunkPhaseDeathTest, AMoveOffTheDiagramAbortsNamingBothPhases) {
  // A second update of a chunk whose update runs would own its arrays twice.
  ChunkPhase phase = ChunkPhase::kUpdating;
  EXPECT_DEATH(MoveChunkPhase(phase, ChunkPhase::kUpdating),
               "from updating to updating");
  // A rollback must not drop a step whose sum task owns the payloads.
  phase = ChunkPhase::kSumming;
  EXPECT_DEATH(MoveChunkPhase(phase, ChunkPhase::kIdle),
               "from summing to idle");
}

}  // namespace
}  // namespace depot
