#include "server/two_phase_step.h"

#include <memory>

#include "gtest/gtest.h"
#include "server/tests/test_util.h"

namespace depot {
namespace {

using ::depot::testing::RecordingSink;

GradStats Stats(double sum_squares) { return {sum_squares, 1.0, false, 0}; }

TEST(TwoPhaseStepTest, StatsGoToSubscribersOnceEveryChunkIsSummed) {
  TwoPhaseStep step(/*step=*/1, /*num_chunks=*/2);
  auto sink = std::make_shared<RecordingSink>();
  step.Subscribe(sink);
  step.AddChunk(1, Stats(2.0));
  EXPECT_TRUE(sink->grad_stats().empty());
  step.AddChunk(0, Stats(3.0));
  ASSERT_EQ(sink->grad_stats().size(), 1u);
  EXPECT_EQ(sink->grad_stats()[0].sum_squares, 5.0);
}

TEST(TwoPhaseStepTest, LateSubscriberGetsTheStatsAtOnce) {
  TwoPhaseStep step(1, 1);
  step.AddChunk(0, Stats(2.0));
  auto sink = std::make_shared<RecordingSink>();
  step.Subscribe(sink);
  ASSERT_EQ(sink->grad_stats().size(), 1u);
  EXPECT_EQ(sink->grad_stats()[0].sum_squares, 2.0);
}

TEST(TwoPhaseStepTest, ChunksAreCombinedInIndexOrderNotSummingOrder) {
  // (1e-16 + 1e-16) + 1 != (1 + 1e-16) + 1e-16 in double: only index order
  // 0, 1, 2 gives the larger value.
  const double tiny = 1e-16;
  TwoPhaseStep step(1, 3);
  auto sink = std::make_shared<RecordingSink>();
  step.Subscribe(sink);
  step.AddChunk(2, Stats(1.0));
  step.AddChunk(0, Stats(tiny));
  step.AddChunk(1, Stats(tiny));
  ASSERT_EQ(sink->grad_stats().size(), 1u);
  EXPECT_EQ(sink->grad_stats()[0].sum_squares, (tiny + tiny) + 1.0);
  EXPECT_NE(sink->grad_stats()[0].sum_squares, (1.0 + tiny) + tiny);
}

TEST(TwoPhaseStepTest, EmptyShardHasStatsAtOnce) {
  TwoPhaseStep step(1, 0);
  auto sink = std::make_shared<RecordingSink>();
  step.Subscribe(sink);
  EXPECT_EQ(sink->grad_stats().size(), 1u);
}

TEST(TwoPhaseStepTest, CommitBeforeEveryChunkIsSummedIsFailedPrecondition) {
  TwoPhaseStep step(4, 2);
  step.AddChunk(0, Stats(1.0));
  absl::StatusOr<bool> first = step.Commit({1.0, false});
  EXPECT_EQ(first.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(first.status().message().find("1 of 2"), std::string::npos)
      << first.status();
}

TEST(TwoPhaseStepTest, FirstCommitDecidesAndRepeatsAreAccepted) {
  TwoPhaseStep step(1, 1);
  step.AddChunk(0, Stats(1.0));
  absl::StatusOr<bool> first = step.Commit({0.5, false});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(*first);
  absl::StatusOr<bool> repeat = step.Commit({0.5, false});
  ASSERT_TRUE(repeat.ok()) << repeat.status();
  EXPECT_FALSE(*repeat);
  EXPECT_EQ(step.commit().clip_coef, 0.5);
}

TEST(TwoPhaseStepTest, DifferentCommitIsFailedPreconditionAndChangesNothing) {
  TwoPhaseStep step(1, 1);
  step.AddChunk(0, Stats(1.0));
  ASSERT_TRUE(step.Commit({0.5, false}).ok());
  absl::StatusOr<bool> other = step.Commit({0.25, false});
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(step.commit().clip_coef, 0.5);
}

TEST(TwoPhaseStepTest, CommitMustSkipWhenTheShardIsNotFinite) {
  TwoPhaseStep step(1, 1);
  step.AddChunk(0, {1.0, 1.0, /*non_finite=*/true, 0});
  EXPECT_EQ(step.Commit({1.0, false}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<bool> skip = step.Commit({1.0, true});
  ASSERT_TRUE(skip.ok()) << skip.status();
  EXPECT_TRUE(*skip);
  EXPECT_TRUE(step.commit().skip);
}

TEST(TwoPhaseStepTest, InvalidCoefficientIsInvalidArgument) {
  TwoPhaseStep step(1, 1);
  step.AddChunk(0, Stats(1.0));
  EXPECT_EQ(step.Commit({2.0, false}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing was decided: a valid commit is still the first.
  absl::StatusOr<bool> first = step.Commit({1.0, false});
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(*first);
}

}  // namespace
}  // namespace depot
