#include "depot/param_scheduler.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/param_scheduler_golden.h"

namespace depot {
namespace {

// The golden values are Megatron's formulas evaluated in float64 with the same
// operations in the same order, so they agree to the last bit except where
// libm's cos/pow/sqrt may differ by an ulp between platforms; EXPECT_DOUBLE_EQ
// (4 ulps) allows exactly that.

ParamSchedulerOptions OptionsFrom(const golden::Schedule& schedule) {
  ParamSchedulerOptions options;
  options.init_lr = schedule.init_lr;
  options.max_lr = schedule.max_lr;
  options.min_lr = schedule.min_lr;
  options.lr_warmup_steps = schedule.lr_warmup_steps;
  options.lr_decay_steps = schedule.lr_decay_steps;
  options.lr_decay_style = *ParseLrDecayStyle(schedule.lr_decay_style);
  options.start_wd = schedule.start_wd;
  options.end_wd = schedule.end_wd;
  options.wd_incr_steps = schedule.wd_incr_steps;
  options.wd_incr_style = *ParseWdIncrStyle(schedule.wd_incr_style);
  options.wsd_decay_steps = schedule.wsd_decay_steps;
  if (schedule.lr_wsd_decay_style != nullptr) {
    options.lr_wsd_decay_style =
        *ParseWsdDecayStyle(schedule.lr_wsd_decay_style);
  }
  return options;
}

std::vector<SchedulerParamGroup> GroupsFrom(const golden::Schedule& schedule) {
  std::vector<SchedulerParamGroup> groups;
  for (const golden::ScheduleGroup& g : schedule.groups) {
    groups.push_back({.param_group = g.param_group,
                      .lr_mult = g.lr_mult,
                      .wd_mult = g.wd_mult,
                      .max_lr = g.max_lr,
                      .min_lr = g.min_lr,
                      .start_wd = g.start_wd,
                      .end_wd = g.end_wd});
  }
  return groups;
}

OptimizerParamScheduler CreateOrDie(const golden::Schedule& schedule) {
  absl::StatusOr<OptimizerParamScheduler> scheduler =
      OptimizerParamScheduler::Create(OptionsFrom(schedule),
                                      GroupsFrom(schedule));
  EXPECT_TRUE(scheduler.ok()) << scheduler.status();
  return *std::move(scheduler);
}

// Expects `scheduler`'s hyperparameters to be golden row `row` of `schedule`.
void ExpectRow(const OptimizerParamScheduler& scheduler,
               const golden::Schedule& schedule, size_t row) {
  const golden::ScheduleRow& expected = schedule.rows[row];
  ASSERT_EQ(scheduler.num_steps(), expected.num_steps);
  const std::vector<GroupHyperParams> actual = scheduler.hyper_params();
  ASSERT_EQ(actual.size(), expected.groups.size());
  for (size_t g = 0; g < actual.size(); ++g) {
    SCOPED_TRACE(testing::Message()
                 << "num_steps " << expected.num_steps << ", group " << g);
    EXPECT_EQ(actual[g].param_group, schedule.groups[g].param_group);
    EXPECT_DOUBLE_EQ(actual[g].lr, expected.groups[g].lr);
    EXPECT_DOUBLE_EQ(actual[g].weight_decay, expected.groups[g].weight_decay);
  }
}

class GoldenScheduleTest : public testing::TestWithParam<golden::Schedule> {};

TEST_P(GoldenScheduleTest, MatchesMegatronAtEveryStep) {
  const golden::Schedule& schedule = GetParam();
  OptimizerParamScheduler scheduler = CreateOrDie(schedule);
  for (size_t row = 0; row < schedule.rows.size(); ++row) {
    ExpectRow(scheduler, schedule, row);
    ASSERT_TRUE(scheduler.Step(schedule.increment).ok());
  }
}

TEST_P(GoldenScheduleTest, ResumesFromItsStateHalfWay) {
  const golden::Schedule& schedule = GetParam();
  const size_t half = schedule.rows.size() / 2;
  OptimizerParamScheduler first = CreateOrDie(schedule);
  for (size_t row = 0; row < half; ++row) {
    ASSERT_TRUE(first.Step(schedule.increment).ok());
  }
  absl::StatusOr<ParamSchedulerState> saved =
      ParseParamSchedulerState(FormatParamSchedulerState(first.StateDict()));
  ASSERT_TRUE(saved.ok()) << saved.status();

  OptimizerParamScheduler resumed = CreateOrDie(schedule);
  ASSERT_TRUE(resumed.LoadStateDict(*saved).ok());
  for (size_t row = half; row < schedule.rows.size(); ++row) {
    ExpectRow(resumed, schedule, row);
    ASSERT_TRUE(resumed.Step(schedule.increment).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Megatron, GoldenScheduleTest, testing::ValuesIn(golden::Schedules()),
    [](const testing::TestParamInfo<golden::Schedule>& info) {
      return std::string(info.param.name);
    });

TEST(GoldenScheduleCoverageTest, CoversEveryDecayStyleAndWsdTail) {
  std::vector<std::string> lr_styles, wsd_tails, wd_styles;
  for (const golden::Schedule& schedule : golden::Schedules()) {
    lr_styles.push_back(schedule.lr_decay_style);
    wd_styles.push_back(schedule.wd_incr_style);
    if (schedule.lr_wsd_decay_style != nullptr) {
      wsd_tails.push_back(schedule.lr_wsd_decay_style);
    }
  }
  auto has = [](const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  };
  for (const char* style :
       {"constant", "linear", "cosine", "inverse-square-root", "WSD"}) {
    EXPECT_TRUE(has(lr_styles, style)) << style;
  }
  for (const char* tail : {"linear", "cosine", "exponential", "minus_sqrt"}) {
    EXPECT_TRUE(has(wsd_tails, tail)) << tail;
  }
  for (const char* style : {"constant", "linear", "cosine"}) {
    EXPECT_TRUE(has(wd_styles, style)) << style;
  }
}

// ---- Styles -------------------------------------------------------------

TEST(ParamSchedulerStyleTest, NamesAreMegatronsAndParseBack) {
  for (LrDecayStyle style :
       {LrDecayStyle::kConstant, LrDecayStyle::kLinear, LrDecayStyle::kCosine,
        LrDecayStyle::kInverseSquareRoot, LrDecayStyle::kWsd}) {
    EXPECT_EQ(*ParseLrDecayStyle(LrDecayStyleName(style)), style);
  }
  EXPECT_EQ(LrDecayStyleName(LrDecayStyle::kInverseSquareRoot),
            "inverse-square-root");
  EXPECT_EQ(LrDecayStyleName(LrDecayStyle::kWsd), "WSD");
  EXPECT_EQ(WsdDecayStyleName(WsdDecayStyle::kMinusSqrt), "minus_sqrt");
  EXPECT_EQ(WdIncrStyleName(WdIncrStyle::kCosine), "cosine");
}

TEST(ParamSchedulerStyleTest, AcceptsOlderMegatronsOneMinusSqrtSpelling) {
  EXPECT_EQ(*ParseWsdDecayStyle("1-sqrt"), WsdDecayStyle::kMinusSqrt);
}

TEST(ParamSchedulerStyleTest, RejectsUnknownNamesNamingTheField) {
  const absl::StatusOr<LrDecayStyle> lr = ParseLrDecayStyle("wsd");
  EXPECT_EQ(lr.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(lr.status().message().substr(0, 15), "lr_decay_style:");
  EXPECT_EQ(ParseWsdDecayStyle("sqrt").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseWdIncrStyle("exponential").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- Validation -----------------------------------------------------------

ParamSchedulerOptions ValidOptions() {
  ParamSchedulerOptions options;
  options.max_lr = 1e-3;
  options.min_lr = 1e-4;
  options.lr_warmup_steps = 10;
  options.lr_decay_steps = 100;
  options.start_wd = options.end_wd = 0.1;
  return options;
}

std::vector<SchedulerParamGroup> TwoGroups() {
  return {{.param_group = 0}, {.param_group = 1, .wd_mult = 0.0}};
}

// Applies the mutations to valid arguments and expects Create to fail with
// INVALID_ARGUMENT whose message starts with `field`.
void ExpectRejected(
    const std::function<void(ParamSchedulerOptions&,
                             std::vector<SchedulerParamGroup>&)>& mutate,
    const std::string& field) {
  ParamSchedulerOptions options = ValidOptions();
  std::vector<SchedulerParamGroup> groups = TwoGroups();
  mutate(options, groups);
  const absl::Status status =
      OptimizerParamScheduler::Create(options, groups).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << field;
  EXPECT_EQ(status.message().substr(0, field.size() + 1), field + ":")
      << status.message();
}

using Options = ParamSchedulerOptions;
using Groups = std::vector<SchedulerParamGroup>;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

TEST(ParamSchedulerValidationTest, AcceptsValidArguments) {
  EXPECT_TRUE(
      OptimizerParamScheduler::Create(ValidOptions(), TwoGroups()).ok());
}

TEST(ParamSchedulerValidationTest, RejectsLrBoundsOutOfOrder) {
  ExpectRejected([](Options& o, Groups&) { o.min_lr = -1e-5; }, "min_lr");
  ExpectRejected([](Options& o, Groups&) { o.max_lr = 1e-5; }, "max_lr");
  ExpectRejected([](Options& o, Groups&) { o.init_lr = 2e-3; }, "init_lr");
  ExpectRejected([](Options& o, Groups&) { o.init_lr = -1e-5; }, "init_lr");
}

TEST(ParamSchedulerValidationTest, RejectsNonFiniteValues) {
  ExpectRejected([](Options& o, Groups&) { o.max_lr = kInf; }, "max_lr");
  ExpectRejected([](Options& o, Groups&) { o.init_lr = kNaN; }, "init_lr");
  ExpectRejected([](Options& o, Groups&) { o.end_wd = kInf; }, "end_wd");
}

TEST(ParamSchedulerValidationTest, RejectsDecayThatIsNotLongerThanWarmup) {
  ExpectRejected([](Options& o, Groups&) { o.lr_decay_steps = 0; },
                 "lr_decay_steps");
  ExpectRejected([](Options& o, Groups&) { o.lr_warmup_steps = 100; },
                 "lr_warmup_steps");
  ExpectRejected([](Options& o, Groups&) { o.lr_warmup_steps = -1; },
                 "lr_warmup_steps");
}

TEST(ParamSchedulerValidationTest, RejectsWsdWithoutItsTail) {
  ExpectRejected(
      [](Options& o, Groups&) {
        o.lr_decay_style = LrDecayStyle::kWsd;
        o.lr_wsd_decay_style = WsdDecayStyle::kCosine;
      },
      "wsd_decay_steps");
  ExpectRejected(
      [](Options& o, Groups&) {
        o.lr_decay_style = LrDecayStyle::kWsd;
        o.wsd_decay_steps = 20;
      },
      "lr_wsd_decay_style");
}

TEST(ParamSchedulerValidationTest, RejectsWeightDecayBoundsTheStyleCannotMeet) {
  ExpectRejected([](Options& o, Groups&) { o.start_wd = 0.0; }, "end_wd");
  ExpectRejected([](Options& o, Groups&) { o.start_wd = 0.2; }, "end_wd");
  ExpectRejected(
      [](Options& o, Groups&) {
        o.start_wd = 0.0;
        o.wd_incr_style = WdIncrStyle::kLinear;
      },
      "wd_incr_steps");
  ExpectRejected([](Options& o, Groups&) { o.wd_incr_steps = -1; },
                 "wd_incr_steps");
}

TEST(ParamSchedulerValidationTest, RejectsBothCheckpointFlags) {
  ExpectRejected(
      [](Options& o, Groups&) { o.override_opt_param_scheduler = true; },
      "override_opt_param_scheduler");
}

TEST(ParamSchedulerValidationTest, RejectsStylesOutsideTheirEnums) {
  ExpectRejected(
      [](Options& o, Groups&) {
        o.lr_decay_style = static_cast<LrDecayStyle>(9);
      },
      "lr_decay_style");
  ExpectRejected([](Options& o,
                    Groups&) { o.wd_incr_style = static_cast<WdIncrStyle>(0); },
                 "wd_incr_style");
}

TEST(ParamSchedulerValidationTest, RejectsMissingOrRepeatedGroups) {
  ExpectRejected([](Options&, Groups& g) { g.clear(); }, "groups");
  ExpectRejected([](Options&, Groups& g) { g[1].param_group = 0; },
                 "groups[1].param_group");
}

TEST(ParamSchedulerValidationTest, RejectsBadGroupMultipliersAndOverrides) {
  ExpectRejected([](Options&, Groups& g) { g[1].lr_mult = -0.5; },
                 "groups[1].lr_mult");
  ExpectRejected([](Options&, Groups& g) { g[0].wd_mult = kNaN; },
                 "groups[0].wd_mult");
  ExpectRejected([](Options&, Groups& g) { g[1].min_lr = 5e-3; },
                 "groups[1].max_lr");
  ExpectRejected([](Options&, Groups& g) { g[1].start_wd = 0.05; },
                 "groups[1].end_wd");
}

// ---- Step -----------------------------------------------------------------

TEST(ParamSchedulerStepTest, StartsAtStepZeroWithWarmupsInitialLr) {
  ParamSchedulerOptions options = ValidOptions();
  options.init_lr = 1e-6;
  absl::StatusOr<OptimizerParamScheduler> scheduler =
      OptimizerParamScheduler::Create(options, TwoGroups());
  ASSERT_TRUE(scheduler.ok());
  EXPECT_EQ(scheduler->num_steps(), 0);
  EXPECT_EQ(scheduler->GetLr(), 1e-6);
  EXPECT_EQ(scheduler->hyper_params()[1].weight_decay, 0.0);
}

TEST(ParamSchedulerStepTest, RejectsANegativeIncrementWithoutMoving) {
  absl::StatusOr<OptimizerParamScheduler> scheduler =
      OptimizerParamScheduler::Create(ValidOptions(), TwoGroups());
  ASSERT_TRUE(scheduler.ok());
  ASSERT_TRUE(scheduler->Step(3).ok());
  const absl::Status status = scheduler->Step(-1);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message().substr(0, 10), "increment:");
  EXPECT_EQ(scheduler->num_steps(), 3);
}

TEST(ParamSchedulerStepTest, RejectsAnIncrementThatWouldOverflow) {
  absl::StatusOr<OptimizerParamScheduler> scheduler =
      OptimizerParamScheduler::Create(ValidOptions(), TwoGroups());
  ASSERT_TRUE(scheduler.ok());
  ASSERT_TRUE(scheduler->Step(5).ok());
  EXPECT_EQ(scheduler->Step(std::numeric_limits<int64_t>::max()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler->num_steps(), 5);
}

}  // namespace
}  // namespace depot
