#!/usr/bin/python3
"""Golden tables for Depot's OptimizerParamScheduler and grad scalers.

A from-scratch transcription of the formulas of Megatron-Core's
OptimizerParamScheduler (megatron/core/optimizer_param_scheduler.py) and
DynamicGradScaler (megatron/core/optimizer/grad_scaler.py), written from their
documented behaviour, not imported from Megatron. Schedules are computed in
float64 (Python floats, as Megatron computes them); the loss scale in float32
(numpy.float32, as Megatron keeps it in an fp32 tensor).

Prints a C++ header; the committed headers in tests/unit/ were made with
  /usr/bin/python3 tests/golden/megatron_schedules.py schedules \
      > tests/unit/param_scheduler_golden.h
  /usr/bin/python3 tests/golden/megatron_schedules.py scalers \
      > tests/unit/grad_scaler_golden.h
(each header repeats its command).
"""

import math
import sys

import numpy as np


# ---- Schedules --------------------------------------------------------------


def schedule_lr(c, group, n):
    """The lr of `group` after `n` steps, before lr_mult."""
    max_lr = group.get("max_lr", c["max_lr"])
    min_lr = group.get("min_lr", c["min_lr"])
    warmup, decay = c["lr_warmup_steps"], c["lr_decay_steps"]
    if warmup > 0 and n <= warmup:
        return c["init_lr"] + (max_lr - c["init_lr"]) * float(n) / float(warmup)
    style = c["lr_decay_style"]
    if style == "constant":
        return max_lr
    if n > decay:
        return min_lr
    if style == "inverse-square-root":
        lr = max_lr * max(warmup, 1) ** 0.5 / (max(n, 1) ** 0.5)
        return max(min_lr, lr)
    ratio = float(n - warmup) / float(decay - warmup)
    if style == "linear":
        coeff = 1.0 - ratio
    elif style == "cosine":
        coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
    elif style == "WSD":
        tail = c["wsd_decay_steps"]
        anneal_start = decay - tail
        if n <= anneal_start:
            coeff = 1.0
        else:
            r = float(n - anneal_start) / float(tail)
            coeff = {
                "linear": lambda: 1.0 - r,
                "cosine": lambda: 0.5 * (math.cos(math.pi * r) + 1.0),
                "exponential": lambda: (2.0 * math.pow(0.5, r)) - 1.0,
                "minus_sqrt": lambda: 1.0 - math.sqrt(r),
            }[c["lr_wsd_decay_style"]]()
    else:
        raise ValueError(style)
    return min_lr + coeff * (max_lr - min_lr)


def schedule_wd(c, group, n):
    """The weight decay of `group` after `n` steps, before wd_mult."""
    start = group.get("start_wd", c["start_wd"])
    end = group.get("end_wd", c["end_wd"])
    if n > c["wd_incr_steps"] or c["wd_incr_style"] == "constant":
        return end
    ratio = float(n) / float(c["wd_incr_steps"])
    if c["wd_incr_style"] == "linear":
        coeff = ratio
    else:
        coeff = 0.5 * (math.cos(math.pi * (1 - ratio)) + 1.0)
    return start + coeff * (end - start)


def schedule(name, increment, count, groups=None, **options):
    c = dict(init_lr=0.0, max_lr=1e-3, min_lr=1e-4, lr_warmup_steps=0,
             lr_decay_steps=20, lr_decay_style="linear", start_wd=0.1,
             end_wd=0.1, wd_incr_steps=0, wd_incr_style="constant",
             wsd_decay_steps=None, lr_wsd_decay_style=None)
    c.update(options)
    groups = groups or [dict(param_group=0)]
    rows = []
    for i in range(count + 1):
        n = i * increment
        rows.append((n, [(schedule_lr(c, g, n) * g.get("lr_mult", 1.0),
                          schedule_wd(c, g, n) * g.get("wd_mult", 1.0))
                         for g in groups]))
    return dict(name=name, c=c, groups=groups, increment=increment, rows=rows)


def schedules():
    two_groups = [dict(param_group=0), dict(param_group=3, wd_mult=0.0)]
    out = [
        schedule("LinearWarmupThenLinearDecay", 1, 25, two_groups,
                 init_lr=1e-5, lr_warmup_steps=5, lr_decay_style="linear"),
        schedule("LinearDecayWithoutWarmup", 1, 22, lr_decay_style="linear"),
        schedule("CosineDecayWithWarmup", 1, 25, two_groups, init_lr=2e-5,
                 max_lr=3e-4, min_lr=3e-5, lr_warmup_steps=4,
                 lr_decay_steps=21, lr_decay_style="cosine"),
        schedule("ConstantAfterWarmup", 1, 12, init_lr=1e-4, lr_warmup_steps=3,
                 lr_decay_steps=8, lr_decay_style="constant"),
        schedule("InverseSquareRootWithWarmup", 1, 34, lr_warmup_steps=4,
                 lr_decay_steps=30, lr_decay_style="inverse-square-root",
                 min_lr=4e-4),
        schedule("InverseSquareRootWithoutWarmup", 1, 22,
                 lr_decay_style="inverse-square-root", min_lr=0.0),
    ]
    for tail in ("linear", "cosine", "exponential", "minus_sqrt"):
        out.append(schedule(
            "WsdWith" + tail.title().replace("_", "") + "Tail", 1, 23,
            two_groups, init_lr=0.0, lr_warmup_steps=3, lr_decay_steps=20,
            lr_decay_style="WSD", wsd_decay_steps=8, lr_wsd_decay_style=tail))
    out += [
        schedule("WsdTailLongerThanTheDecayAfterWarmup", 1, 12,
                 lr_warmup_steps=2, lr_decay_steps=10, lr_decay_style="WSD",
                 wsd_decay_steps=9, lr_wsd_decay_style="cosine"),
        schedule("LinearWeightDecayIncrement", 1, 18, two_groups,
                 start_wd=0.0, end_wd=0.1, wd_incr_steps=15,
                 wd_incr_style="linear"),
        schedule("CosineWeightDecayIncrement", 1, 18, two_groups,
                 start_wd=0.01, end_wd=0.1, wd_incr_steps=15,
                 wd_incr_style="cosine"),
        schedule("GroupMultipliersAndOverrides", 1, 24, [
            dict(param_group=0),
            dict(param_group=1, lr_mult=0.5, wd_mult=0.0),
            dict(param_group=2, max_lr=5e-3, min_lr=5e-4, lr_mult=2.0),
            dict(param_group=7, start_wd=0.0, end_wd=0.2, wd_mult=0.5),
        ], init_lr=1e-6, lr_warmup_steps=4, lr_decay_style="cosine",
                 start_wd=0.05, end_wd=0.1, wd_incr_steps=16,
                 wd_incr_style="linear"),
        schedule("IncrementsInSamples", 16, 24, two_groups, init_lr=0.0,
                 lr_warmup_steps=64, lr_decay_steps=320,
                 lr_decay_style="cosine", start_wd=0.0, end_wd=0.1,
                 wd_incr_steps=256, wd_incr_style="cosine"),
    ]
    return out


def cpp_optional(value):
    return "std::nullopt" if value is None else cpp(value)


def cpp(value):
    if isinstance(value, str):
        return '"%s"' % value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    # repr is the shortest text that reads back to the same double.
    text = repr(float(value))
    return text if ("." in text or "e" in text or "n" in text) else text + ".0"


def print_schedules():
    print(header("schedules", "param_scheduler_golden.h"))
    print("""#include <cstdint>
#include <optional>
#include <vector>

namespace depot::golden {

struct ScheduleGroup {
  uint32_t param_group;
  double lr_mult;
  double wd_mult;
  std::optional<double> max_lr, min_lr, start_wd, end_wd;
};

// One group's hyperparameters: schedule * lr_mult, schedule * wd_mult.
struct GroupValues {
  double lr;
  double weight_decay;
};

struct ScheduleRow {
  int64_t num_steps;
  std::vector<GroupValues> groups;  // in the order of Schedule::groups
};

struct Schedule {
  const char* name;
  double init_lr, max_lr, min_lr;
  int64_t lr_warmup_steps, lr_decay_steps;
  const char* lr_decay_style;
  double start_wd, end_wd;
  int64_t wd_incr_steps;
  const char* wd_incr_style;
  std::optional<int64_t> wsd_decay_steps;
  const char* lr_wsd_decay_style;  // nullptr when there is none
  std::vector<ScheduleGroup> groups;
  int64_t increment;  // each row is one Step(increment) after the previous
  std::vector<ScheduleRow> rows;  // rows[0]: as created (Megatron's step(0))
};

inline const std::vector<Schedule>& Schedules() {
  static const auto* const kSchedules = new std::vector<Schedule>{""")
    for s in schedules():
        c = s["c"]
        print("  {\"%s\"," % s["name"])
        print("   %s, %s, %s, %s, %s, %s," % (
            cpp(c["init_lr"]), cpp(c["max_lr"]), cpp(c["min_lr"]),
            cpp(c["lr_warmup_steps"]), cpp(c["lr_decay_steps"]),
            cpp(c["lr_decay_style"])))
        print("   %s, %s, %s, %s, %s, %s," % (
            cpp(c["start_wd"]), cpp(c["end_wd"]), cpp(c["wd_incr_steps"]),
            cpp(c["wd_incr_style"]), cpp_optional(c["wsd_decay_steps"]),
            "nullptr" if c["lr_wsd_decay_style"] is None
            else cpp(c["lr_wsd_decay_style"])))
        print("   {")
        for g in s["groups"]:
            print("    {%d, %s, %s, %s, %s, %s, %s}," % (
                g["param_group"], cpp(g.get("lr_mult", 1.0)),
                cpp(g.get("wd_mult", 1.0)), cpp_optional(g.get("max_lr")),
                cpp_optional(g.get("min_lr")), cpp_optional(g.get("start_wd")),
                cpp_optional(g.get("end_wd"))))
        print("   },")
        print("   %d," % s["increment"])
        print("   {")
        for n, values in s["rows"]:
            print("    {%d, {%s}}," % (n, ", ".join(
                "{%s, %s}" % (cpp(lr), cpp(wd)) for lr, wd in values)))
        print("   }},")
    print("""  };
  return *kSchedules;
}

}  // namespace depot::golden

#endif  // DEPOT_TESTS_UNIT_PARAM_SCHEDULER_GOLDEN_H_""")


# ---- Loss scalers -----------------------------------------------------------


class DynamicScaler:
    """Megatron's DynamicGradScaler, the scale in fp32."""

    def __init__(self, initial_scale, min_scale, growth_factor, backoff_factor,
                 growth_interval, hysteresis):
        self.scale = np.float32(initial_scale)
        self.min_scale = np.float32(min_scale)
        self.growth_factor = np.float32(growth_factor)
        self.backoff_factor = np.float32(backoff_factor)
        self.growth_interval = growth_interval
        self.hysteresis = hysteresis
        self.growth_tracker = 0
        self.hysteresis_tracker = hysteresis

    def update(self, found_inf):
        if found_inf:
            self.growth_tracker = 0
            self.hysteresis_tracker -= 1
            if self.hysteresis_tracker <= 0:
                self.scale = max(np.float32(self.scale * self.backoff_factor),
                                 self.min_scale)
        else:
            self.growth_tracker += 1
            if self.growth_tracker == self.growth_interval:
                self.growth_tracker = 0
                self.hysteresis_tracker = self.hysteresis
                self.scale = np.float32(self.scale * self.growth_factor)


MEGATRON_DEFAULTS = dict(initial_scale=2.0 ** 32, min_scale=1.0,
                         growth_factor=2.0, backoff_factor=0.5,
                         growth_interval=1000, hysteresis=2)


def scaler(name, runs, **options):
    """`runs`: (found_inf, repeat) pairs; one expected state after each run."""
    args = dict(MEGATRON_DEFAULTS)
    args.update(options)
    s = DynamicScaler(**args)
    rows = []
    for found_inf, repeat in runs:
        for _ in range(repeat):
            s.update(found_inf)
        rows.append((found_inf, repeat, s.scale, s.growth_tracker,
                     s.hysteresis_tracker))
    return dict(name=name, args=args, rows=rows)


def scalers():
    small = dict(initial_scale=65536.0, growth_interval=4)
    T, F = True, False
    return [
        scaler("HysteresisNeedsTwoInfsBeforeBackoff",
               [(T, 1), (T, 1), (T, 1)], **small),
        scaler("FiniteStepsDoNotResetHysteresis",
               [(T, 1), (F, 1), (F, 1), (T, 1), (F, 3), (T, 1)], **small),
        scaler("GrowthResetsHysteresis",
               [(T, 1), (F, 4), (T, 1), (T, 1)], **small),
        scaler("InfResetsTheGrowthInterval",
               [(F, 3), (T, 1), (F, 3), (F, 1), (F, 4)], **small),
        scaler("BackoffStopsAtMinScale",
               [(T, 1), (T, 1), (T, 1), (T, 1), (T, 1)],
               initial_scale=8.0, min_scale=1.5, hysteresis=1),
        scaler("MegatronDefaultsGrowAfterAThousandFiniteSteps",
               [(F, 999), (F, 1), (F, 1000), (T, 1), (F, 999), (T, 1),
                (F, 1000)]),
        scaler("HysteresisOfThree",
               [(T, 2), (F, 1), (T, 1), (T, 1)], hysteresis=3, **small),
        scaler("Float32ScaleWithUnevenFactors",
               [(F, 2), (F, 2), (T, 1), (T, 1), (F, 2), (T, 1)],
               initial_scale=1000.1, min_scale=0.7, growth_factor=3.3,
               backoff_factor=0.3, growth_interval=2, hysteresis=1),
    ]


def print_scalers():
    print(header("scalers", "grad_scaler_golden.h"))
    print("""#include <cstdint>
#include <vector>

namespace depot::golden {

// The scaler's state after `repeat` calls of Update(found_inf).
struct ScalerRun {
  bool found_inf;
  int repeat;
  float scale;
  int64_t growth_tracker;
  int64_t hysteresis_tracker;
};

struct ScalerSequence {
  const char* name;
  double initial_scale, min_scale, growth_factor, backoff_factor;
  int64_t growth_interval, hysteresis;
  std::vector<ScalerRun> runs;
};

inline const std::vector<ScalerSequence>& ScalerSequences() {
  static const auto* const kSequences = new std::vector<ScalerSequence>{""")
    for s in scalers():
        a = s["args"]
        print("  {\"%s\", %s, %s, %s, %s, %d, %d, {" % (
            s["name"], cpp(a["initial_scale"]), cpp(a["min_scale"]),
            cpp(a["growth_factor"]), cpp(a["backoff_factor"]),
            a["growth_interval"], a["hysteresis"]))
        for found_inf, repeat, scale, growth, hysteresis in s["rows"]:
            # An fp32 value printed as the double it equals, exactly.
            print("    {%s, %d, %sf, %d, %d}," % (
                cpp(found_inf), repeat, cpp(float(scale)), growth,
                hysteresis))
        print("  }},")
    print("""  };
  return *kSequences;
}

}  // namespace depot::golden

#endif  // DEPOT_TESTS_UNIT_GRAD_SCALER_GOLDEN_H_""")


def header(what, file_name):
    guard = "DEPOT_TESTS_UNIT_%s_" % file_name.upper().replace(".", "_")
    return (
        "// Generated by tests/golden/megatron_schedules.py; do not edit.\n"
        "// Regenerate with:\n"
        "//   /usr/bin/python3 tests/golden/megatron_schedules.py %s >"
        " tests/unit/%s\n"
        "#ifndef %s\n#define %s\n" % (what, file_name, guard, guard))


def main():
    what = sys.argv[1] if len(sys.argv) == 2 else ""
    if what == "schedules":
        print_schedules()
    elif what == "scalers":
        print_scalers()
    else:
        sys.exit("usage: megatron_schedules.py schedules|scalers")


if __name__ == "__main__":
    main()
