// OptimizerParamScheduler: Megatron-Core's learning-rate and weight-decay
// schedule (megatron/core/optimizer_param_scheduler.py), for trainers that
// drive Depot.
//
// A pure calculator: it holds no connection and no optimizer. The trainer
// passes its hyperparameters to each Job::Step and advances the schedule after
// a step that was applied, as Megatron's train_step does (a step skipped for
// non-finite gradients does not advance it):
//
//   depot::ParamSchedulerOptions options;
//   options.max_lr = 3e-4;
//   options.min_lr = 3e-5;
//   options.lr_warmup_steps = 2000;
//   options.lr_decay_steps = 100000;
//   options.lr_decay_style = depot::LrDecayStyle::kCosine;
//   options.start_wd = options.end_wd = 0.1;
//   auto scheduler = depot::OptimizerParamScheduler::Create(
//       options, {{.param_group = 0}, {.param_group = 1, .wd_mult = 0.0}});
//   for (uint64_t step = 1; ...; ++step) {
//     depot::StepOptions step_options;
//     step_options.group_hparams = scheduler->hyper_params();
//     ... job->Step(step, grads, weights, &result, step_options) ...
//     if (!result.skipped) status = scheduler->Step(1);
//   }
//
// Steps count in whatever unit the increments are: Megatron's training loop
// counts samples (it calls step(global batch size) and converts iteration
// counts to samples); a trainer may as well count iterations with Step(1).
// lr_warmup_steps, lr_decay_steps, wd_incr_steps and wsd_decay_steps are in
// that same unit.
//
// All arithmetic is in double, operation for operation as Megatron's Python, so
// the values equal Megatron's up to the last bit of libm's cos/pow/sqrt.
#ifndef DEPOT_PARAM_SCHEDULER_H_
#define DEPOT_PARAM_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "depot/export.h"
#include "depot/job_config.h"

namespace depot {

// Megatron's lr_decay_style. Names: "constant", "linear", "cosine",
// "inverse-square-root", "WSD".
enum class LrDecayStyle : uint8_t {
  kConstant = 1,
  kLinear = 2,
  kCosine = 3,
  kInverseSquareRoot = 4,
  kWsd = 5,  // warmup-stable-decay: max_lr until the last wsd_decay_steps
};

// Megatron's lr_wsd_decay_style: the tail of a WSD schedule. Names: "linear",
// "cosine", "exponential", "minus_sqrt" (older Megatron spells it "1-sqrt";
// both parse).
enum class WsdDecayStyle : uint8_t {
  kLinear = 1,
  kCosine = 2,
  kExponential = 3,
  kMinusSqrt = 4,
};

// Megatron's wd_incr_style. Names: "constant", "linear", "cosine".
enum class WdIncrStyle : uint8_t {
  kConstant = 1,
  kLinear = 2,
  kCosine = 3,
};

// Megatron's spelling of each style; the Parse functions accept exactly these
// (and "1-sqrt"), INVALID_ARGUMENT listing the accepted names otherwise.
DEPOT_API std::string_view LrDecayStyleName(LrDecayStyle style);
DEPOT_API std::string_view WsdDecayStyleName(WsdDecayStyle style);
DEPOT_API std::string_view WdIncrStyleName(WdIncrStyle style);
DEPOT_API absl::StatusOr<LrDecayStyle> ParseLrDecayStyle(std::string_view name);
DEPOT_API absl::StatusOr<WsdDecayStyle> ParseWsdDecayStyle(
    std::string_view name);
DEPOT_API absl::StatusOr<WdIncrStyle> ParseWdIncrStyle(std::string_view name);

// The constructor arguments of Megatron's OptimizerParamScheduler, same names.
struct ParamSchedulerOptions {
  double init_lr = 0.0;  // warmup starts here
  double max_lr = 0.0;
  double min_lr = 0.0;
  int64_t lr_warmup_steps = 0;
  int64_t lr_decay_steps = 1;
  LrDecayStyle lr_decay_style = LrDecayStyle::kLinear;

  double start_wd = 0.0;
  double end_wd = 0.0;
  int64_t wd_incr_steps = 0;
  WdIncrStyle wd_incr_style = WdIncrStyle::kConstant;

  // What LoadStateDict does with the settings a checkpoint holds (max_lr,
  // min_lr, lr_warmup_steps, lr_decay_steps, lr_decay_style and the four wd
  // settings): use_checkpoint: take the checkpoint's; override: keep these;
  // neither: they must be equal. At most one of the two may be set.
  bool use_checkpoint_opt_param_scheduler = true;
  bool override_opt_param_scheduler = false;

  // Required with kWsd: the length of the tail that ends at lr_decay_steps, and
  // its shape.
  std::optional<int64_t> wsd_decay_steps = std::nullopt;
  std::optional<WsdDecayStyle> lr_wsd_decay_style = std::nullopt;
};

// One optimizer param group, as the keys Megatron reads from a param_group
// dict. Unset overrides take the scheduler's value.
struct SchedulerParamGroup {
  uint32_t param_group = 0;  // the id in the job's layout (TensorSpec)
  double lr_mult = 1.0;      // lr = schedule's lr * lr_mult
  double wd_mult = 1.0;      // weight_decay = schedule's wd * wd_mult
  std::optional<double> max_lr = std::nullopt;
  std::optional<double> min_lr = std::nullopt;
  std::optional<double> start_wd = std::nullopt;
  std::optional<double> end_wd = std::nullopt;
};

// What Megatron's state_dict() saves, under the same names.
struct ParamSchedulerState {
  double max_lr = 0.0;
  int64_t lr_warmup_steps = 0;
  int64_t num_steps = 0;
  LrDecayStyle lr_decay_style = LrDecayStyle::kLinear;
  int64_t lr_decay_steps = 1;
  double min_lr = 0.0;
  double start_wd = 0.0;
  double end_wd = 0.0;
  WdIncrStyle wd_incr_style = WdIncrStyle::kConstant;
  int64_t wd_incr_steps = 0;
};

// The state as a map keyed by Megatron's state_dict keys; doubles are written
// so that they read back exactly, styles by their Megatron names.
DEPOT_API std::map<std::string, std::string> ParamSchedulerStateToKeyValues(
    const ParamSchedulerState& state);
// INVALID_ARGUMENT naming the key when a key is missing or unknown, or a value
// does not parse. Does not check the values' ranges (LoadStateDict does).
DEPOT_API absl::StatusOr<ParamSchedulerState> ParamSchedulerStateFromKeyValues(
    const std::map<std::string, std::string>& key_values);

// The same as text: one "key=value" line per key, sorted by key.
DEPOT_API std::string FormatParamSchedulerState(
    const ParamSchedulerState& state);
// INVALID_ARGUMENT for a line without '=', a repeated key, or as
// ParamSchedulerStateFromKeyValues. Blank lines are ignored.
DEPOT_API absl::StatusOr<ParamSchedulerState> ParseParamSchedulerState(
    std::string_view text);

// INVALID_ARGUMENT naming the field (Megatron's name) when: a value is not
// finite; min_lr < 0, max_lr < min_lr, init_lr < 0 or init_lr > max_lr;
// lr_decay_steps <= 0; lr_warmup_steps < 0 or >= lr_decay_steps; WSD without
// wsd_decay_steps >= 0 and lr_wsd_decay_style; start_wd < 0 or end_wd <
// start_wd; wd_incr_steps < 0, or 0 with a linear/cosine increment; a constant
// increment with start_wd != end_wd; both use_checkpoint and override set; a
// style outside its enum.
DEPOT_API absl::Status ValidateParamSchedulerOptions(
    const ParamSchedulerOptions& options);

class DEPOT_API OptimizerParamScheduler {
 public:
  // Validates `options` and every group, then sets the schedule to step 0 (as
  // Megatron's constructor calls step(0)). INVALID_ARGUMENT as
  // ValidateParamSchedulerOptions, or naming "groups[i].<field>" when: there is
  // no group; a param_group id repeats; lr_mult or wd_mult is negative or not
  // finite; the group's max_lr/min_lr or start_wd/end_wd (its own or the
  // scheduler's) break the rules above.
  static absl::StatusOr<OptimizerParamScheduler> Create(
      ParamSchedulerOptions options, std::vector<SchedulerParamGroup> groups);

  // Megatron's get_lr(param_group): the schedule's lr for `group`'s
  // max_lr/min_lr, before lr_mult. The default group has no overrides.
  // REQUIRES: `group` passes Create's checks.
  double GetLr(const SchedulerParamGroup& group = {}) const;
  // Megatron's get_wd(param_group): the schedule's weight decay for `group`'s
  // start_wd/end_wd, before wd_mult.
  double GetWd(const SchedulerParamGroup& group = {}) const;

  // This step's hyperparameters, one per group in the order given to Create:
  // lr = GetLr(g) * g.lr_mult, weight_decay = GetWd(g) * g.wd_mult.
  std::vector<GroupHyperParams> hyper_params() const;

  // Megatron's step(increment): advances the schedule by `increment` steps.
  // INVALID_ARGUMENT (nothing changes) if increment < 0 or the count would
  // overflow.
  absl::Status Step(int64_t increment);

  int64_t num_steps() const { return num_steps_; }
  const ParamSchedulerOptions& options() const { return options_; }
  const std::vector<SchedulerParamGroup>& groups() const { return groups_; }

  // Megatron's state_dict().
  ParamSchedulerState StateDict() const;

  // Megatron's load_state_dict(): each saved setting goes through the rule of
  // use_checkpoint_opt_param_scheduler / override_opt_param_scheduler above;
  // num_steps is always the checkpoint's. FAILED_PRECONDITION naming the field
  // when neither flag is set and a setting differs; INVALID_ARGUMENT naming the
  // field when the settings that result would fail Create's checks or
  // num_steps < 0. On error nothing changes.
  absl::Status LoadStateDict(const ParamSchedulerState& state);

 private:
  OptimizerParamScheduler(ParamSchedulerOptions options,
                          std::vector<SchedulerParamGroup> groups)
      : options_(std::move(options)), groups_(std::move(groups)) {}

  ParamSchedulerOptions options_;
  std::vector<SchedulerParamGroup> groups_;
  int64_t num_steps_ = 0;
};

}  // namespace depot

#endif  // DEPOT_PARAM_SCHEDULER_H_
