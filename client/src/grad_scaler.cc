#include "depot/grad_scaler.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace depot {
namespace {

template <typename Value>
absl::Status FieldError(absl::string_view field, absl::string_view problem,
                        Value value) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", problem, ", got ", value));
}

// A scale must be > 0 and finite once rounded to fp32, where Megatron keeps it.
// The range check comes first: converting a double beyond FLT_MAX to float is
// undefined.
absl::Status CheckScale(absl::string_view field, double value) {
  if (!(value > 0 && value <= FLT_MAX) || static_cast<float>(value) == 0) {
    return FieldError(field, "must be > 0 and finite in fp32", value);
  }
  return absl::OkStatus();
}

// The names under which the dynamic scaler's arguments are reported, so that
// one set of checks serves DynamicGradScalerOptions and OptimizerConfig.
struct DynamicScalerFieldNames {
  absl::string_view initial_scale;
  absl::string_view min_scale;
  absl::string_view growth_factor;
  absl::string_view backoff_factor;
  absl::string_view growth_interval;
  absl::string_view hysteresis;
};

constexpr DynamicScalerFieldNames kOptionNames = {
    "initial_scale",  "min_scale",       "growth_factor",
    "backoff_factor", "growth_interval", "hysteresis"};
// growth_factor and backoff_factor are not in the config: MakeGradScaler
// always passes Megatron's 2 and 0.5.
constexpr DynamicScalerFieldNames kConfigNames = {
    "optimizer.initial_loss_scale",
    "optimizer.min_loss_scale",
    "growth_factor",
    "backoff_factor",
    "optimizer.loss_scale_window",
    "optimizer.hysteresis"};

absl::Status ValidateDynamicScaler(const DynamicGradScalerOptions& options,
                                   const DynamicScalerFieldNames& names) {
  if (absl::Status s = CheckScale(names.initial_scale, options.initial_scale);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckScale(names.min_scale, options.min_scale);
      !s.ok()) {
    return s;
  }
  if (options.min_scale > options.initial_scale) {
    return FieldError(names.min_scale,
                      absl::StrCat("must be <= ", names.initial_scale, " (",
                                   options.initial_scale, ")"),
                      options.min_scale);
  }
  if (!(options.growth_factor > 1 && options.growth_factor <= FLT_MAX)) {
    return FieldError(names.growth_factor, "must be > 1 and finite",
                      options.growth_factor);
  }
  if (!(options.backoff_factor > 0 && options.backoff_factor < 1)) {
    return FieldError(names.backoff_factor, "must be in (0, 1)",
                      options.backoff_factor);
  }
  if (options.growth_interval < 1) {
    return FieldError(names.growth_interval, "must be >= 1",
                      options.growth_interval);
  }
  if (options.hysteresis < 1) {
    return FieldError(names.hysteresis, "must be >= 1", options.hysteresis);
  }
  return absl::OkStatus();
}

}  // namespace

float GradScaler::inv_scale() const {
  return static_cast<float>(1.0 / static_cast<double>(scale_));
}

absl::StatusOr<ConstantGradScaler> ConstantGradScaler::Create(double scale) {
  if (absl::Status s = CheckScale("scale", scale); !s.ok()) return s;
  return ConstantGradScaler(static_cast<float>(scale));
}

void ConstantGradScaler::Update(bool /*found_inf*/) {}

GradScalerState ConstantGradScaler::StateDict() const {
  return {.scale = scale_, .growth_tracker = 0, .hysteresis_tracker = 0};
}

absl::Status ConstantGradScaler::LoadStateDict(
    const GradScalerState& /*state*/) {
  return absl::OkStatus();
}

DynamicGradScaler::DynamicGradScaler(const DynamicGradScalerOptions& options)
    : GradScaler(static_cast<float>(options.initial_scale)),
      options_(options),
      min_scale_(static_cast<float>(options.min_scale)),
      growth_factor_(static_cast<float>(options.growth_factor)),
      backoff_factor_(static_cast<float>(options.backoff_factor)),
      hysteresis_tracker_(options.hysteresis) {}

absl::StatusOr<DynamicGradScaler> DynamicGradScaler::Create(
    const DynamicGradScalerOptions& options) {
  if (absl::Status s = ValidateDynamicScaler(options, kOptionNames); !s.ok()) {
    return s;
  }
  return DynamicGradScaler(options);
}

void DynamicGradScaler::Update(bool found_inf) {
  if (found_inf) {
    growth_tracker_ = 0;
    hysteresis_tracker_ -= 1;
    if (hysteresis_tracker_ <= 0) {
      scale_ = std::max(scale_ * backoff_factor_, min_scale_);
    }
    return;
  }
  growth_tracker_ += 1;
  if (growth_tracker_ == options_.growth_interval) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = options_.hysteresis;
    scale_ = scale_ * growth_factor_;
  }
}

GradScalerState DynamicGradScaler::StateDict() const {
  return {.scale = scale_,
          .growth_tracker = growth_tracker_,
          .hysteresis_tracker = hysteresis_tracker_};
}

absl::Status DynamicGradScaler::LoadStateDict(const GradScalerState& state) {
  if (!(std::isfinite(state.scale) && state.scale > 0)) {
    return FieldError("scale", "must be > 0 and finite", state.scale);
  }
  if (state.growth_tracker < 0 ||
      state.growth_tracker >= options_.growth_interval) {
    return FieldError(
        "growth_tracker",
        absl::StrCat(
            "must be in [0, growth_interval = ", options_.growth_interval,
            "); was the checkpoint written with a longer interval?"),
        state.growth_tracker);
  }
  if (state.hysteresis_tracker > options_.hysteresis) {
    return FieldError(
        "hysteresis_tracker",
        absl::StrCat("must be <= hysteresis (", options_.hysteresis, ")"),
        state.hysteresis_tracker);
  }
  scale_ = state.scale;
  growth_tracker_ = state.growth_tracker;
  hysteresis_tracker_ = state.hysteresis_tracker;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GradScaler>> MakeGradScaler(
    const JobConfig& config) {
  const OptimizerConfig& optimizer = config.optimizer;
  // Megatron tests `if config.loss_scale:`, so anything but 0 asks for a
  // constant scale (and a negative or NaN one is rejected).
  if (optimizer.loss_scale != 0) {
    if (absl::Status s =
            CheckScale("optimizer.loss_scale", optimizer.loss_scale);
        !s.ok()) {
      return s;
    }
    absl::StatusOr<ConstantGradScaler> scaler =
        ConstantGradScaler::Create(optimizer.loss_scale);
    if (!scaler.ok()) return scaler.status();
    return std::make_unique<ConstantGradScaler>(*std::move(scaler));
  }
  if (config.grad_dtype != DType::kFloat16) {
    return std::make_unique<ConstantGradScaler>(
        *ConstantGradScaler::Create(1.0));
  }

  // Megatron declares loss_scale_window a float but compares the growth
  // tracker to it with ==, so only a whole number ever triggers growth.
  const double window = optimizer.loss_scale_window;
  if (!(window >= 1 && window <= static_cast<double>(INT64_MAX / 2) &&
        window == std::floor(window))) {
    return FieldError(kConfigNames.growth_interval,
                      "must be a whole number >= 1", window);
  }
  const DynamicGradScalerOptions options = {
      .initial_scale = optimizer.initial_loss_scale,
      .min_scale = optimizer.min_loss_scale,
      .growth_factor = 2.0,
      .backoff_factor = 0.5,
      .growth_interval = static_cast<int64_t>(window),
      .hysteresis = optimizer.hysteresis};
  if (absl::Status s = ValidateDynamicScaler(options, kConfigNames); !s.ok()) {
    return s;
  }
  absl::StatusOr<DynamicGradScaler> scaler = DynamicGradScaler::Create(options);
  if (!scaler.ok()) return scaler.status();
  return std::make_unique<DynamicGradScaler>(*std::move(scaler));
}

}  // namespace depot
