#include "depot/param_scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace depot {
namespace {

// The public API speaks std::string_view; Abseil here has its own string_view.
absl::string_view ToAbsl(std::string_view s) { return {s.data(), s.size()}; }
std::string_view ToStd(absl::string_view s) { return {s.data(), s.size()}; }

// ---- Style names ----------------------------------------------------------

template <typename Style>
struct StyleName {
  Style style;
  absl::string_view name;
};

// The first entry of a style is its canonical name; later ones are aliases.
constexpr StyleName<LrDecayStyle> kLrDecayStyleNames[] = {
    {LrDecayStyle::kConstant, "constant"},
    {LrDecayStyle::kLinear, "linear"},
    {LrDecayStyle::kCosine, "cosine"},
    {LrDecayStyle::kInverseSquareRoot, "inverse-square-root"},
    {LrDecayStyle::kWsd, "WSD"},
};
constexpr StyleName<WsdDecayStyle> kWsdDecayStyleNames[] = {
    {WsdDecayStyle::kLinear, "linear"},
    {WsdDecayStyle::kCosine, "cosine"},
    {WsdDecayStyle::kExponential, "exponential"},
    {WsdDecayStyle::kMinusSqrt, "minus_sqrt"},
    // Older Megatron-Core releases spell it so.
    {WsdDecayStyle::kMinusSqrt, "1-sqrt"},
};
constexpr StyleName<WdIncrStyle> kWdIncrStyleNames[] = {
    {WdIncrStyle::kConstant, "constant"},
    {WdIncrStyle::kLinear, "linear"},
    {WdIncrStyle::kCosine, "cosine"},
};

// Empty for a value outside the enum.
template <typename Style, size_t N>
absl::string_view NameOf(const StyleName<Style> (&names)[N], Style style) {
  for (const StyleName<Style>& entry : names) {
    if (entry.style == style) return entry.name;
  }
  return {};
}

template <typename Style, size_t N>
absl::StatusOr<Style> ParseStyle(const StyleName<Style> (&names)[N],
                                 absl::string_view field,
                                 absl::string_view name) {
  std::vector<std::string> accepted;
  for (const StyleName<Style>& entry : names) {
    if (entry.name == name) return entry.style;
    accepted.push_back(absl::StrCat("\"", entry.name, "\""));
  }
  return absl::InvalidArgumentError(absl::StrCat(field, ": must be one of ",
                                                 absl::StrJoin(accepted, ", "),
                                                 ", got \"", name, "\""));
}

// ---- Validation -----------------------------------------------------------

template <typename Value>
absl::Status FieldError(absl::string_view prefix, absl::string_view field,
                        absl::string_view problem, Value value) {
  return absl::InvalidArgumentError(
      absl::StrCat(prefix, field, ": ", problem, ", got ", value));
}

absl::Status CheckFinite(absl::string_view prefix, absl::string_view field,
                         double value) {
  if (!std::isfinite(value)) {
    return FieldError(prefix, field, "must be finite", value);
  }
  return absl::OkStatus();
}

// Megatron's asserts on a pair of lr bounds, plus finiteness. `prefix` says
// whose bounds they are: "" for the scheduler's, "groups[i]." for a group's.
absl::Status CheckLrBounds(absl::string_view prefix, double max_lr,
                           double min_lr) {
  if (absl::Status s = CheckFinite(prefix, "max_lr", max_lr); !s.ok()) return s;
  if (absl::Status s = CheckFinite(prefix, "min_lr", min_lr); !s.ok()) return s;
  if (min_lr < 0) return FieldError(prefix, "min_lr", "must be >= 0", min_lr);
  if (max_lr < min_lr) {
    return FieldError(prefix, "max_lr",
                      absl::StrCat("must be >= min_lr (", min_lr, ")"), max_lr);
  }
  return absl::OkStatus();
}

// Megatron's asserts on a pair of wd bounds (the constant style's equality is
// asserted lazily in Megatron's get_wd; here up front).
absl::Status CheckWdBounds(absl::string_view prefix, double start_wd,
                           double end_wd, WdIncrStyle style) {
  if (absl::Status s = CheckFinite(prefix, "start_wd", start_wd); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckFinite(prefix, "end_wd", end_wd); !s.ok()) return s;
  if (start_wd < 0) {
    return FieldError(prefix, "start_wd", "must be >= 0", start_wd);
  }
  if (end_wd < start_wd) {
    return FieldError(prefix, "end_wd",
                      absl::StrCat("must be >= start_wd (", start_wd, ")"),
                      end_wd);
  }
  if (style == WdIncrStyle::kConstant && end_wd != start_wd) {
    return FieldError(prefix, "end_wd",
                      absl::StrCat("must equal start_wd (", start_wd,
                                   ") with wd_incr_style \"constant\""),
                      end_wd);
  }
  return absl::OkStatus();
}

absl::Status ValidateGroups(const ParamSchedulerOptions& options,
                            const std::vector<SchedulerParamGroup>& groups) {
  if (groups.empty()) {
    return absl::InvalidArgumentError(
        "groups: give at least one param group (e.g. {.param_group = 0})");
  }
  std::set<uint32_t> seen;
  for (size_t i = 0; i < groups.size(); ++i) {
    const SchedulerParamGroup& group = groups[i];
    const std::string prefix = absl::StrCat("groups[", i, "].");
    if (!seen.insert(group.param_group).second) {
      return FieldError(prefix, "param_group", "repeats an earlier group's id",
                        group.param_group);
    }
    for (const auto& [field, mult] :
         {std::pair<absl::string_view, double>{"lr_mult", group.lr_mult},
          {"wd_mult", group.wd_mult}}) {
      if (!(std::isfinite(mult) && mult >= 0)) {
        return FieldError(prefix, field, "must be finite and >= 0", mult);
      }
    }
    if (absl::Status s =
            CheckLrBounds(prefix, group.max_lr.value_or(options.max_lr),
                          group.min_lr.value_or(options.min_lr));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckWdBounds(
            prefix, group.start_wd.value_or(options.start_wd),
            group.end_wd.value_or(options.end_wd), options.wd_incr_style);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// ---- Loading a checkpoint -------------------------------------------------

// %.17g: enough digits to tell apart values that differ in the last bit.
std::string Show(double value) { return absl::StrFormat("%.17g", value); }
std::string Show(int64_t value) { return absl::StrCat(value); }
std::string Show(LrDecayStyle style) {
  return absl::StrCat("\"", ToAbsl(LrDecayStyleName(style)), "\"");
}
std::string Show(WdIncrStyle style) {
  return absl::StrCat("\"", ToAbsl(WdIncrStyleName(style)), "\"");
}

// Megatron's _check_and_set: decides between the scheduler's `value` and the
// checkpoint's for one setting, writing the result to `value`.
template <typename Value>
absl::Status CheckAndSet(const ParamSchedulerOptions& options,
                         absl::string_view field, const Value& checkpoint,
                         Value& value) {
  if (options.override_opt_param_scheduler) return absl::OkStatus();
  if (!options.use_checkpoint_opt_param_scheduler && value != checkpoint) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": the checkpoint has ", Show(checkpoint),
        " but the scheduler was created with ", Show(value),
        "; set use_checkpoint_opt_param_scheduler to take the checkpoint's "
        "value or override_opt_param_scheduler to keep the scheduler's"));
  }
  value = checkpoint;
  return absl::OkStatus();
}

}  // namespace

std::string_view LrDecayStyleName(LrDecayStyle style) {
  return ToStd(NameOf(kLrDecayStyleNames, style));
}
std::string_view WsdDecayStyleName(WsdDecayStyle style) {
  return ToStd(NameOf(kWsdDecayStyleNames, style));
}
std::string_view WdIncrStyleName(WdIncrStyle style) {
  return ToStd(NameOf(kWdIncrStyleNames, style));
}
absl::StatusOr<LrDecayStyle> ParseLrDecayStyle(std::string_view name) {
  return ParseStyle(kLrDecayStyleNames, "lr_decay_style", ToAbsl(name));
}
absl::StatusOr<WsdDecayStyle> ParseWsdDecayStyle(std::string_view name) {
  return ParseStyle(kWsdDecayStyleNames, "lr_wsd_decay_style", ToAbsl(name));
}
absl::StatusOr<WdIncrStyle> ParseWdIncrStyle(std::string_view name) {
  return ParseStyle(kWdIncrStyleNames, "wd_incr_style", ToAbsl(name));
}

absl::Status ValidateParamSchedulerOptions(
    const ParamSchedulerOptions& options) {
  if (absl::Status s = CheckFinite("", "init_lr", options.init_lr); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckLrBounds("", options.max_lr, options.min_lr);
      !s.ok()) {
    return s;
  }
  // Megatron does not assert init_lr >= 0; a negative warmup lr is never meant.
  if (options.init_lr < 0) {
    return FieldError("", "init_lr", "must be >= 0", options.init_lr);
  }
  if (options.init_lr > options.max_lr) {
    return FieldError("", "init_lr",
                      absl::StrCat("must be <= max_lr (", options.max_lr, ")"),
                      options.init_lr);
  }
  if (options.lr_decay_steps <= 0) {
    return FieldError("", "lr_decay_steps", "must be > 0",
                      options.lr_decay_steps);
  }
  if (options.lr_warmup_steps < 0 ||
      options.lr_warmup_steps >= options.lr_decay_steps) {
    return FieldError("", "lr_warmup_steps",
                      absl::StrCat("must be in [0, lr_decay_steps = ",
                                   options.lr_decay_steps, ")"),
                      options.lr_warmup_steps);
  }
  if (LrDecayStyleName(options.lr_decay_style).empty()) {
    return FieldError("", "lr_decay_style", "is not a known style",
                      static_cast<int>(options.lr_decay_style));
  }
  if (options.lr_decay_style == LrDecayStyle::kWsd) {
    if (!options.wsd_decay_steps.has_value() || *options.wsd_decay_steps < 0) {
      return absl::InvalidArgumentError(
          "wsd_decay_steps: lr_decay_style \"WSD\" needs wsd_decay_steps >= 0, "
          "the length of its decay tail");
    }
    if (!options.lr_wsd_decay_style.has_value() ||
        WsdDecayStyleName(*options.lr_wsd_decay_style).empty()) {
      return absl::InvalidArgumentError(
          "lr_wsd_decay_style: lr_decay_style \"WSD\" needs a tail style: "
          "linear, cosine, exponential or minus_sqrt");
    }
  }
  if (WdIncrStyleName(options.wd_incr_style).empty()) {
    return FieldError("", "wd_incr_style", "is not a known style",
                      static_cast<int>(options.wd_incr_style));
  }
  if (absl::Status s = CheckWdBounds("", options.start_wd, options.end_wd,
                                     options.wd_incr_style);
      !s.ok()) {
    return s;
  }
  if (options.wd_incr_steps < 0) {
    return FieldError("", "wd_incr_steps", "must be >= 0",
                      options.wd_incr_steps);
  }
  if (options.wd_incr_style != WdIncrStyle::kConstant &&
      options.wd_incr_steps == 0) {
    return FieldError("", "wd_incr_steps",
                      "must be > 0 with a linear or cosine increment",
                      options.wd_incr_steps);
  }
  if (options.override_opt_param_scheduler &&
      options.use_checkpoint_opt_param_scheduler) {
    return absl::InvalidArgumentError(
        "override_opt_param_scheduler: cannot be set together with "
        "use_checkpoint_opt_param_scheduler; set at most one");
  }
  return absl::OkStatus();
}

absl::StatusOr<OptimizerParamScheduler> OptimizerParamScheduler::Create(
    ParamSchedulerOptions options, std::vector<SchedulerParamGroup> groups) {
  if (absl::Status s = ValidateParamSchedulerOptions(options); !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidateGroups(options, groups); !s.ok()) return s;
  return OptimizerParamScheduler(std::move(options), std::move(groups));
}

double OptimizerParamScheduler::GetLr(const SchedulerParamGroup& group) const {
  const double max_lr = group.max_lr.value_or(options_.max_lr);
  const double min_lr = group.min_lr.value_or(options_.min_lr);
  const int64_t warmup_steps = options_.lr_warmup_steps;
  const int64_t decay_steps = options_.lr_decay_steps;

  // Linear warmup from init_lr, the end point included.
  if (warmup_steps > 0 && num_steps_ <= warmup_steps) {
    return options_.init_lr + (max_lr - options_.init_lr) *
                                  static_cast<double>(num_steps_) /
                                  static_cast<double>(warmup_steps);
  }
  if (options_.lr_decay_style == LrDecayStyle::kConstant) return max_lr;
  if (num_steps_ > decay_steps) return min_lr;

  if (options_.lr_decay_style == LrDecayStyle::kInverseSquareRoot) {
    const double warmup =
        static_cast<double>(std::max<int64_t>(warmup_steps, 1));
    const double steps = static_cast<double>(std::max<int64_t>(num_steps_, 1));
    const double lr = max_lr * std::pow(warmup, 0.5) / std::pow(steps, 0.5);
    return std::max(min_lr, lr);
  }

  const double decay_ratio = static_cast<double>(num_steps_ - warmup_steps) /
                             static_cast<double>(decay_steps - warmup_steps);
  const double delta_lr = max_lr - min_lr;
  double coeff = 1.0;
  switch (options_.lr_decay_style) {
    case LrDecayStyle::kLinear:
      coeff = 1.0 - decay_ratio;
      break;
    case LrDecayStyle::kCosine:
      coeff = 0.5 * (std::cos(std::numbers::pi * decay_ratio) + 1.0);
      break;
    case LrDecayStyle::kWsd: {
      // Stable at max_lr until the tail's start; a zero-length tail never
      // reaches the division because steps past lr_decay_steps returned above.
      const int64_t anneal_start = decay_steps - *options_.wsd_decay_steps;
      if (num_steps_ <= anneal_start) break;
      const double ratio = static_cast<double>(num_steps_ - anneal_start) /
                           static_cast<double>(*options_.wsd_decay_steps);
      switch (*options_.lr_wsd_decay_style) {
        case WsdDecayStyle::kLinear:
          coeff = 1.0 - ratio;
          break;
        case WsdDecayStyle::kCosine:
          coeff = 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
          break;
        case WsdDecayStyle::kExponential:
          coeff = (2.0 * std::pow(0.5, ratio)) - 1.0;
          break;
        case WsdDecayStyle::kMinusSqrt:
          coeff = 1.0 - std::sqrt(ratio);
          break;
      }
      break;
    }
    case LrDecayStyle::kConstant:
    case LrDecayStyle::kInverseSquareRoot:
      break;  // returned above
  }
  return min_lr + coeff * delta_lr;
}

double OptimizerParamScheduler::GetWd(const SchedulerParamGroup& group) const {
  const double start_wd = group.start_wd.value_or(options_.start_wd);
  const double end_wd = group.end_wd.value_or(options_.end_wd);
  if (num_steps_ > options_.wd_incr_steps) return end_wd;
  if (options_.wd_incr_style == WdIncrStyle::kConstant) return end_wd;

  const double incr_ratio = static_cast<double>(num_steps_) /
                            static_cast<double>(options_.wd_incr_steps);
  const double delta_wd = end_wd - start_wd;
  const double coeff =
      options_.wd_incr_style == WdIncrStyle::kLinear
          ? incr_ratio
          : 0.5 * (std::cos(std::numbers::pi * (1 - incr_ratio)) + 1.0);
  return start_wd + coeff * delta_wd;
}

std::vector<GroupHyperParams> OptimizerParamScheduler::hyper_params() const {
  std::vector<GroupHyperParams> result;
  result.reserve(groups_.size());
  for (const SchedulerParamGroup& group : groups_) {
    result.push_back({.param_group = group.param_group,
                      .lr = GetLr(group) * group.lr_mult,
                      .weight_decay = GetWd(group) * group.wd_mult});
  }
  return result;
}

absl::Status OptimizerParamScheduler::Step(int64_t increment) {
  if (increment < 0) {
    return FieldError("", "increment", "must be >= 0", increment);
  }
  if (num_steps_ > std::numeric_limits<int64_t>::max() - increment) {
    return FieldError(
        "", "increment",
        absl::StrCat("would overflow the step count ", num_steps_), increment);
  }
  num_steps_ += increment;
  return absl::OkStatus();
}

ParamSchedulerState OptimizerParamScheduler::StateDict() const {
  return {.max_lr = options_.max_lr,
          .lr_warmup_steps = options_.lr_warmup_steps,
          .num_steps = num_steps_,
          .lr_decay_style = options_.lr_decay_style,
          .lr_decay_steps = options_.lr_decay_steps,
          .min_lr = options_.min_lr,
          .start_wd = options_.start_wd,
          .end_wd = options_.end_wd,
          .wd_incr_style = options_.wd_incr_style,
          .wd_incr_steps = options_.wd_incr_steps};
}

absl::Status OptimizerParamScheduler::LoadStateDict(
    const ParamSchedulerState& state) {
  // Build the settings that would result, check them, then commit.
  ParamSchedulerOptions next = options_;
  for (absl::Status s : {
           CheckAndSet(options_, "max_lr", state.max_lr, next.max_lr),
           CheckAndSet(options_, "min_lr", state.min_lr, next.min_lr),
           CheckAndSet(options_, "lr_warmup_steps", state.lr_warmup_steps,
                       next.lr_warmup_steps),
           CheckAndSet(options_, "lr_decay_steps", state.lr_decay_steps,
                       next.lr_decay_steps),
           CheckAndSet(options_, "lr_decay_style", state.lr_decay_style,
                       next.lr_decay_style),
           CheckAndSet(options_, "start_wd", state.start_wd, next.start_wd),
           CheckAndSet(options_, "end_wd", state.end_wd, next.end_wd),
           CheckAndSet(options_, "wd_incr_steps", state.wd_incr_steps,
                       next.wd_incr_steps),
           CheckAndSet(options_, "wd_incr_style", state.wd_incr_style,
                       next.wd_incr_style),
       }) {
    if (!s.ok()) return s;
  }
  if (state.num_steps < 0) {
    return FieldError("", "num_steps", "must be >= 0", state.num_steps);
  }
  absl::Status valid = ValidateParamSchedulerOptions(next);
  if (valid.ok()) valid = ValidateGroups(next, groups_);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(valid.message(), " (with the checkpoint's settings)"));
  }
  options_ = std::move(next);
  num_steps_ = state.num_steps;
  return absl::OkStatus();
}

}  // namespace depot
