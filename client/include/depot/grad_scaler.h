// Loss scalers with Megatron-Core's semantics (megatron/core/optimizer/
// grad_scaler.py): ConstantGradScaler and DynamicGradScaler.
//
// The trainer multiplies its loss by scale() before backward, so the gradients
// it sends are loss-scaled; the servers unscale them inside the update. After
// each step the trainer reports whether the gradients held a NaN or Inf:
//
//   auto scaler = depot::MakeGradScaler(job->config());  // StatusOr
//   for (...) {
//     ... backward on loss * (*scaler)->scale() ...
//     depot::StepOptions step_options;
//     step_options.loss_scale = (*scaler)->scale();
//     ... job->Step(step, grads, weights, &result, step_options) ...
//     (*scaler)->Update(result.found_inf);
//   }
//
// Pure classes: no connection, no clock. Like Megatron, which keeps the scale
// in an fp32 tensor, the scale is an fp32 value and is grown and backed off
// with fp32 multiplications; growth is not capped (neither is Megatron's).
#ifndef DEPOT_GRAD_SCALER_H_
#define DEPOT_GRAD_SCALER_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "depot/export.h"
#include "depot/job_config.h"

namespace depot {

// What Megatron's DynamicGradScaler.state_dict() saves, same names.
struct GradScalerState {
  float scale = 1.0f;
  int64_t growth_tracker = 0;
  int64_t hysteresis_tracker = 0;
};

class DEPOT_API GradScaler {
 public:
  virtual ~GradScaler() = default;

  // The loss scale, > 0.
  float scale() const { return scale_; }
  // 1 / scale, computed in double and rounded to fp32 (Megatron's
  // _scale.double().reciprocal().float()).
  float inv_scale() const;

  // Feeds back the outcome of a step: whether any gradient was non-finite.
  virtual void Update(bool found_inf) = 0;

  virtual GradScalerState StateDict() const = 0;
  // On error nothing changes.
  virtual absl::Status LoadStateDict(const GradScalerState& state) = 0;

 protected:
  explicit GradScaler(float scale) : scale_(scale) {}

  float scale_;
};

// A scale that never changes. Its scale is configuration, not state: like
// Megatron's (whose state_dict is empty), StateDict() reports the scale with
// zero trackers and LoadStateDict() ignores its argument.
class DEPOT_API ConstantGradScaler : public GradScaler {
 public:
  // INVALID_ARGUMENT naming "scale" unless `scale` is > 0 and finite once
  // rounded to fp32.
  static absl::StatusOr<ConstantGradScaler> Create(double scale);

  void Update(bool found_inf) override;
  GradScalerState StateDict() const override;
  absl::Status LoadStateDict(const GradScalerState& state) override;

 private:
  explicit ConstantGradScaler(float scale) : GradScaler(scale) {}
};

// Megatron's DynamicGradScaler arguments, with the defaults of Megatron's
// OptimizerConfig (initial_loss_scale, min_loss_scale, loss_scale_window,
// hysteresis) and of get_megatron_optimizer (growth 2, backoff 0.5).
struct DynamicGradScalerOptions {
  double initial_scale = 4294967296.0;  // 2^32
  double min_scale = 1.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 1000;
  int64_t hysteresis = 2;
};

// On a step with a non-finite gradient: growth_tracker = 0, hysteresis_tracker
// -= 1, and once hysteresis_tracker <= 0, scale = max(scale * backoff_factor,
// min_scale). On a finite step: growth_tracker += 1, and when it reaches
// growth_interval: growth_tracker = 0, hysteresis_tracker = hysteresis, scale
// *= growth_factor. So `hysteresis` non-finite steps are needed before the
// first backoff, finite steps in between do not restore the budget (only a
// growth does), and every further non-finite step backs off again.
class DEPOT_API DynamicGradScaler : public GradScaler {
 public:
  // INVALID_ARGUMENT naming the field (Megatron's asserts, plus finiteness)
  // when: initial_scale or min_scale is not > 0 and finite in fp32; min_scale >
  // initial_scale; growth_factor <= 1 or backoff_factor outside (0, 1), or not
  // finite; growth_interval or hysteresis < 1.
  static absl::StatusOr<DynamicGradScaler> Create(
      const DynamicGradScalerOptions& options);

  void Update(bool found_inf) override;
  GradScalerState StateDict() const override;
  // INVALID_ARGUMENT naming the field when: scale is not > 0 and finite;
  // growth_tracker is outside [0, growth_interval) (a checkpoint from a run
  // with a longer growth interval; Megatron would then never grow again);
  // hysteresis_tracker > hysteresis.
  absl::Status LoadStateDict(const GradScalerState& state) override;

  const DynamicGradScalerOptions& options() const { return options_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  int64_t hysteresis_tracker() const { return hysteresis_tracker_; }

 private:
  explicit DynamicGradScaler(const DynamicGradScalerOptions& options);

  DynamicGradScalerOptions options_;
  // The factors as the fp32 values Megatron multiplies with.
  float min_scale_;
  float growth_factor_;
  float backoff_factor_;
  int64_t growth_tracker_ = 0;
  int64_t hysteresis_tracker_;
};

// The scaler Megatron's get_megatron_optimizer builds for `config`:
// optimizer.loss_scale > 0: constant at that scale; otherwise, with fp16
// gradients: dynamic with optimizer.initial_loss_scale, min_loss_scale,
// loss_scale_window (the growth interval) and hysteresis, growth 2, backoff
// 0.5; otherwise none, which Depot represents as a constant scale of 1.
// INVALID_ARGUMENT naming the config field ("optimizer.loss_scale_window", ...)
// when the fields used are invalid (loss_scale_window must be a whole number).
DEPOT_API absl::StatusOr<std::unique_ptr<GradScaler>> MakeGradScaler(
    const JobConfig& config);

}  // namespace depot

#endif  // DEPOT_GRAD_SCALER_H_
