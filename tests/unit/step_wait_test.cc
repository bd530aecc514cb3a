#include "depot/step_wait.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace depot {
namespace {

TEST(DescribeWorkerRanksTest, OneRankIsSingular) {
  EXPECT_EQ(DescribeWorkerRanks({1}, 2), "worker rank 1 (of 2)");
}

TEST(DescribeWorkerRanksTest, SeveralRanksAreListed) {
  EXPECT_EQ(DescribeWorkerRanks({1, 3}, 4), "worker ranks 1, 3 (of 4)");
  EXPECT_EQ(DescribeWorkerRanks({0, 1}, 4), "worker ranks 0, 1 (of 4)");
}

TEST(DescribeWorkerRanksTest, RunsOfThreeOrMoreBecomeRanges) {
  EXPECT_EQ(DescribeWorkerRanks({0, 1, 2, 3, 4, 5, 9}, 16),
            "worker ranks 0-5, 9 (of 16)");
  EXPECT_EQ(DescribeWorkerRanks({2, 3, 4, 6, 7}, 8),
            "worker ranks 2-4, 6, 7 (of 8)");
}

TEST(DescribeWorkerRanksTest, LongListsCountWhatTheyLeaveOut) {
  std::vector<uint32_t> even;
  for (uint32_t rank = 0; rank < 100; rank += 2) even.push_back(rank);
  EXPECT_EQ(DescribeWorkerRanks(even, 100),
            "worker ranks 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, "
            "28, 30, and 34 more (of 100)");
}

TEST(DescribeWorkerRanksTest, NoRanks) {
  EXPECT_EQ(DescribeWorkerRanks({}, 4), "no worker rank");
}

ServerStepWait Waiting(std::string server, std::vector<uint32_t> missing,
                       double seconds, uint64_t pending_step = 12) {
  ServerStepWait wait;
  wait.server = std::move(server);
  wait.completed_step = pending_step - 1;
  wait.pending_step = pending_step;
  wait.missing_workers = std::move(missing);
  wait.waiting_seconds = seconds;
  return wait;
}

constexpr char kFirstError[] = "server a:1: Deadline Exceeded";

std::string Describe(const std::vector<ServerStepWait>& servers) {
  return DescribeStepDeadline(12, absl::Seconds(30), 4, servers, kFirstError);
}

TEST(DescribeStepDeadlineTest, NamesTheStepTheTimeoutAndTheMissingRanks) {
  EXPECT_EQ(Describe({Waiting("a:1", {1, 3}, 29.84)}),
            "step 12 did not complete within 30s "
            "(ClientOptions::step_timeout): server a:1 is waiting for worker "
            "ranks 1, 3 (of 4) to send their gradients (for 29.8 s). Is every "
            "worker running, each with its own rank? [first error: server "
            "a:1: Deadline Exceeded]");
}

TEST(DescribeStepDeadlineTest, ServersThatSayTheSameAreNamedTogether) {
  EXPECT_EQ(Describe({Waiting("a:1", {2}, 29.0), Waiting("b:2", {2}, 29.5)}),
            "step 12 did not complete within 30s "
            "(ClientOptions::step_timeout): servers a:1, b:2 are waiting for "
            "worker rank 2 (of 4) to send their gradients (for up to 29.5 s). "
            "Is every worker running, each with its own rank? [first error: "
            "server a:1: Deadline Exceeded]");
}

TEST(DescribeStepDeadlineTest, ManyServersAreCounted) {
  std::vector<ServerStepWait> servers;
  for (int s = 0; s < 6; ++s) {
    servers.push_back(Waiting(absl::StrCat("h", s, ":1"), {0}, 1.0));
  }
  EXPECT_NE(Describe(servers).find("servers h0:1, h1:1, h2:1, h3:1 and 2 more "
                                   "are waiting for worker rank 0 (of 4)"),
            std::string::npos)
      << Describe(servers);
}

TEST(DescribeStepDeadlineTest, SaysWhatEachOtherKindOfServerReports) {
  ServerStepWait complete = Waiting("a:1", {}, 3.0);
  ServerStepWait done;
  done.server = "b:2";
  done.completed_step = 12;
  ServerStepWait empty;
  empty.server = "c:3";
  empty.completed_step = 11;
  ServerStepWait behind = Waiting("d:4", {3}, 7.0, /*pending_step=*/11);
  ServerStepWait silent;
  silent.server = "e:5";
  silent.status = absl::UnavailableError("connection refused");
  EXPECT_EQ(
      Describe({complete, done, empty, behind, silent}),
      "step 12 did not complete within 30s (ClientOptions::step_timeout): "
      "server a:1 has every worker's gradients for the chunks sent so far and "
      "is still working on them (for 3.0 s); server b:2 has completed step 12; "
      "server c:3 holds no gradients of step 12 (last completed step: 11); "
      "server d:4 is waiting for worker rank 3 (of 4) to send their gradients "
      "of step 11 (for 7.0 s); server e:5 did not say what it waits for "
      "(GetJob: UNAVAILABLE: connection refused). Is every worker running, "
      "each with its own rank? [first error: server a:1: Deadline Exceeded]");
}

TEST(DescribeStepDeadlineTest, AsksAboutWorkersOnlyWhenAServerWaitsForThem) {
  ServerStepWait done;
  done.server = "b:2";
  done.completed_step = 12;
  EXPECT_EQ(Describe({done}),
            "step 12 did not complete within 30s "
            "(ClientOptions::step_timeout): server b:2 has completed step 12 "
            "[first error: server a:1: Deadline Exceeded]");
}

}  // namespace
}  // namespace depot
