// The scheduler's saved state: Megatron's load_state_dict rules and the
// key-value and text forms.
#include <map>
#include <string>
#include <vector>

#include "depot/param_scheduler.h"
#include "gtest/gtest.h"

namespace depot {
namespace {

ParamSchedulerOptions CosineOptions() {
  ParamSchedulerOptions options;
  options.init_lr = 1e-6;
  options.max_lr = 1e-3;
  options.min_lr = 1e-4;
  options.lr_warmup_steps = 10;
  options.lr_decay_steps = 100;
  options.lr_decay_style = LrDecayStyle::kCosine;
  options.start_wd = 0.0;
  options.end_wd = 0.1;
  options.wd_incr_steps = 50;
  options.wd_incr_style = WdIncrStyle::kLinear;
  return options;
}

OptimizerParamScheduler Create(const ParamSchedulerOptions& options) {
  absl::StatusOr<OptimizerParamScheduler> scheduler =
      OptimizerParamScheduler::Create(
          options, {{.param_group = 0}, {.param_group = 1, .wd_mult = 0.0}});
  EXPECT_TRUE(scheduler.ok()) << scheduler.status();
  return *std::move(scheduler);
}

// The state of a CosineOptions scheduler after 37 steps.
ParamSchedulerState SavedAt37() {
  OptimizerParamScheduler scheduler = Create(CosineOptions());
  EXPECT_TRUE(scheduler.Step(37).ok());
  return scheduler.StateDict();
}

void ExpectSameHyperParams(const OptimizerParamScheduler& a,
                           const OptimizerParamScheduler& b) {
  const std::vector<GroupHyperParams> x = a.hyper_params();
  const std::vector<GroupHyperParams> y = b.hyper_params();
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i].param_group, y[i].param_group);
    EXPECT_EQ(x[i].lr, y[i].lr) << "group " << i;
    EXPECT_EQ(x[i].weight_decay, y[i].weight_decay) << "group " << i;
  }
}

// ---- LoadStateDict --------------------------------------------------------

TEST(ParamSchedulerLoadTest, UseCheckpointTakesTheCheckpointsSettings) {
  ParamSchedulerOptions other = CosineOptions();
  other.max_lr = 2e-3;
  other.lr_decay_steps = 300;
  other.end_wd = 0.2;
  OptimizerParamScheduler resumed = Create(other);
  ASSERT_TRUE(resumed.LoadStateDict(SavedAt37()).ok());

  OptimizerParamScheduler original = Create(CosineOptions());
  ASSERT_TRUE(original.Step(37).ok());
  EXPECT_EQ(resumed.num_steps(), 37);
  EXPECT_EQ(resumed.options().max_lr, 1e-3);
  EXPECT_EQ(resumed.options().lr_decay_steps, 100);
  EXPECT_EQ(resumed.options().end_wd, 0.1);
  ExpectSameHyperParams(resumed, original);
}

TEST(ParamSchedulerLoadTest, OverrideKeepsTheSchedulersSettings) {
  ParamSchedulerOptions other = CosineOptions();
  other.max_lr = 2e-3;
  other.use_checkpoint_opt_param_scheduler = false;
  other.override_opt_param_scheduler = true;
  OptimizerParamScheduler resumed = Create(other);
  ASSERT_TRUE(resumed.LoadStateDict(SavedAt37()).ok());

  OptimizerParamScheduler expected = Create(other);
  ASSERT_TRUE(expected.Step(37).ok());
  EXPECT_EQ(resumed.options().max_lr, 2e-3);
  EXPECT_EQ(resumed.num_steps(), 37);
  ExpectSameHyperParams(resumed, expected);
}

TEST(ParamSchedulerLoadTest, WithNeitherFlagRejectsADifferentSettingUnchanged) {
  ParamSchedulerOptions strict = CosineOptions();
  strict.use_checkpoint_opt_param_scheduler = false;
  strict.lr_decay_style = LrDecayStyle::kLinear;
  OptimizerParamScheduler resumed = Create(strict);
  ASSERT_TRUE(resumed.Step(3).ok());

  const absl::Status status = resumed.LoadStateDict(SavedAt37());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message().substr(0, 15), "lr_decay_style:") << status;
  EXPECT_EQ(resumed.num_steps(), 3);
  EXPECT_EQ(resumed.options().lr_decay_style, LrDecayStyle::kLinear);
}

TEST(ParamSchedulerLoadTest, WithNeitherFlagAcceptsEqualSettings) {
  ParamSchedulerOptions strict = CosineOptions();
  strict.use_checkpoint_opt_param_scheduler = false;
  OptimizerParamScheduler resumed = Create(strict);
  EXPECT_TRUE(resumed.LoadStateDict(SavedAt37()).ok());
  EXPECT_EQ(resumed.num_steps(), 37);
}

TEST(ParamSchedulerLoadTest, RejectsCheckpointSettingsThatBreakTheRules) {
  OptimizerParamScheduler resumed = Create(CosineOptions());
  ParamSchedulerState state = SavedAt37();
  state.lr_warmup_steps = state.lr_decay_steps;

  const absl::Status status = resumed.LoadStateDict(state);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message().substr(0, 16), "lr_warmup_steps:") << status;
  EXPECT_EQ(resumed.num_steps(), 0);
  EXPECT_EQ(resumed.options().lr_warmup_steps, 10);
}

TEST(ParamSchedulerLoadTest, RejectsANegativeStepCount) {
  OptimizerParamScheduler resumed = Create(CosineOptions());
  ParamSchedulerState state = SavedAt37();
  state.num_steps = -1;
  EXPECT_EQ(resumed.LoadStateDict(state).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(resumed.num_steps(), 0);
}

// Megatron's load_state_dict adds the saved count to the current one (it is
// only ever called on a new scheduler, at 0); Depot sets it.
TEST(ParamSchedulerLoadTest, SetsTheStepCountRatherThanAddingToIt) {
  OptimizerParamScheduler resumed = Create(CosineOptions());
  ASSERT_TRUE(resumed.Step(5).ok());
  ASSERT_TRUE(resumed.LoadStateDict(SavedAt37()).ok());
  EXPECT_EQ(resumed.num_steps(), 37);
}

// ---- Key-value and text forms ----------------------------------------------

TEST(ParamSchedulerStateFormTest, UsesMegatronsStateDictKeys) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : ParamSchedulerStateToKeyValues(SavedAt37())) {
    keys.push_back(key);
  }
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "end_wd", "lr_decay_steps", "lr_decay_style",
                      "lr_warmup_steps", "max_lr", "min_lr", "num_steps",
                      "start_wd", "wd_incr_steps", "wd_incr_style"}));
  EXPECT_EQ(ParamSchedulerStateToKeyValues(SavedAt37())["lr_decay_style"],
            "cosine");
}

TEST(ParamSchedulerStateFormTest, TextRoundTripIsExact) {
  ParamSchedulerState state = SavedAt37();
  state.max_lr = 0.1 + 0.2;  // needs all 17 digits
  state.min_lr = 1e-7 / 3;
  state.start_wd = 5e-324;  // the smallest subnormal
  state.lr_decay_style = LrDecayStyle::kInverseSquareRoot;
  state.wd_incr_style = WdIncrStyle::kCosine;
  state.num_steps = int64_t{1} << 60;

  absl::StatusOr<ParamSchedulerState> parsed =
      ParseParamSchedulerState(FormatParamSchedulerState(state));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->max_lr, state.max_lr);
  EXPECT_EQ(parsed->min_lr, state.min_lr);
  EXPECT_EQ(parsed->start_wd, state.start_wd);
  EXPECT_EQ(parsed->end_wd, state.end_wd);
  EXPECT_EQ(parsed->lr_warmup_steps, state.lr_warmup_steps);
  EXPECT_EQ(parsed->lr_decay_steps, state.lr_decay_steps);
  EXPECT_EQ(parsed->lr_decay_style, state.lr_decay_style);
  EXPECT_EQ(parsed->wd_incr_steps, state.wd_incr_steps);
  EXPECT_EQ(parsed->wd_incr_style, state.wd_incr_style);
  EXPECT_EQ(parsed->num_steps, state.num_steps);
}

// Expects INVALID_ARGUMENT from parsing `key_values` with a message that starts
// with `prefix`.
void ExpectKeyValuesRejected(
    const std::map<std::string, std::string>& key_values,
    const std::string& prefix) {
  const absl::Status status =
      ParamSchedulerStateFromKeyValues(key_values).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << prefix;
  EXPECT_EQ(status.message().substr(0, prefix.size()), prefix) << status;
}

TEST(ParamSchedulerStateFormTest, RejectsAMissingKey) {
  std::map<std::string, std::string> key_values =
      ParamSchedulerStateToKeyValues(SavedAt37());
  key_values.erase("min_lr");
  ExpectKeyValuesRejected(key_values, "min_lr:");
}

TEST(ParamSchedulerStateFormTest, RejectsAnUnknownKey) {
  std::map<std::string, std::string> key_values =
      ParamSchedulerStateToKeyValues(SavedAt37());
  key_values["warmup_stepz"] = "3";
  ExpectKeyValuesRejected(key_values, "warmup_stepz:");
}

TEST(ParamSchedulerStateFormTest, RejectsMalformedValues) {
  std::map<std::string, std::string> key_values =
      ParamSchedulerStateToKeyValues(SavedAt37());
  key_values["num_steps"] = "37.5";
  ExpectKeyValuesRejected(key_values, "num_steps:");
  key_values = ParamSchedulerStateToKeyValues(SavedAt37());
  key_values["max_lr"] = "1e-3x";
  ExpectKeyValuesRejected(key_values, "max_lr:");
  key_values = ParamSchedulerStateToKeyValues(SavedAt37());
  key_values["lr_decay_style"] = "Cosine";
  ExpectKeyValuesRejected(key_values, "lr_decay_style:");
}

TEST(ParamSchedulerStateFormTest,
     TextRejectsLinesWithoutEqualsAndRepeatedKeys) {
  const std::string text = FormatParamSchedulerState(SavedAt37());
  EXPECT_EQ(ParseParamSchedulerState(text + "num_steps\n").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseParamSchedulerState(text + "num_steps=1\n").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ParamSchedulerStateFormTest, TextIgnoresBlankLinesAndSurroundingSpace) {
  const std::string text =
      "\n  " + FormatParamSchedulerState(SavedAt37()) + "\r\n\n";
  absl::StatusOr<ParamSchedulerState> parsed = ParseParamSchedulerState(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->num_steps, 37);
}

}  // namespace
}  // namespace depot
