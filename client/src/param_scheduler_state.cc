// The scheduler's state as a key-value map and as text, for checkpoints.
#include <charconv>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "depot/param_scheduler.h"

namespace depot {
namespace {

std::string FormatDouble(double value) {
  // Shortest form that reads back to the same double.
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

// Reads typed values out of a key-value map, remembering the first error and
// which keys it used, so that unknown keys can be reported at the end.
class KeyValueReader {
 public:
  explicit KeyValueReader(const std::map<std::string, std::string>& key_values)
      : key_values_(key_values) {}

  template <typename T>
  void ReadNumber(absl::string_view key, T& out) {
    const std::string* text = Find(key);
    if (text == nullptr) return;
    const char* end = text->data() + text->size();
    const auto result = std::from_chars(text->data(), end, out);
    if (result.ec != std::errc() || result.ptr != end) {
      Fail(absl::StrCat(key, ": \"", *text, "\" is not ",
                        std::is_integral_v<T> ? "an integer" : "a number"));
    }
  }

  // `parse` names `key` in its errors (the keys are the options' names).
  template <typename Style>
  void ReadStyle(absl::string_view key,
                 absl::StatusOr<Style> (*parse)(std::string_view), Style& out) {
    const std::string* text = Find(key);
    if (text == nullptr) return;
    absl::StatusOr<Style> style = parse(std::string_view(*text));
    if (style.ok()) {
      out = *style;
    } else if (status_.ok()) {
      status_ = style.status();
    }
  }

  // The first error, or INVALID_ARGUMENT naming a key that was never read.
  absl::Status Finish() const {
    if (!status_.ok()) return status_;
    for (const auto& [key, value] : key_values_) {
      if (used_.count(key) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            key,
            ": not a key of the scheduler's state (a typo, or a state "
            "written by something else?)"));
      }
    }
    return absl::OkStatus();
  }

 private:
  const std::string* Find(absl::string_view key) {
    used_.insert(std::string(key));
    auto it = key_values_.find(std::string(key));
    if (it == key_values_.end()) {
      Fail(absl::StrCat(key, ": missing from the scheduler's state"));
      return nullptr;
    }
    return &it->second;
  }

  void Fail(std::string message) {
    if (status_.ok()) status_ = absl::InvalidArgumentError(std::move(message));
  }

  const std::map<std::string, std::string>& key_values_;
  std::set<std::string> used_;
  absl::Status status_;
};

}  // namespace

std::map<std::string, std::string> ParamSchedulerStateToKeyValues(
    const ParamSchedulerState& state) {
  return {
      {"max_lr", FormatDouble(state.max_lr)},
      {"lr_warmup_steps", absl::StrCat(state.lr_warmup_steps)},
      {"num_steps", absl::StrCat(state.num_steps)},
      {"lr_decay_style", std::string(LrDecayStyleName(state.lr_decay_style))},
      {"lr_decay_steps", absl::StrCat(state.lr_decay_steps)},
      {"min_lr", FormatDouble(state.min_lr)},
      {"start_wd", FormatDouble(state.start_wd)},
      {"end_wd", FormatDouble(state.end_wd)},
      {"wd_incr_style", std::string(WdIncrStyleName(state.wd_incr_style))},
      {"wd_incr_steps", absl::StrCat(state.wd_incr_steps)},
  };
}

absl::StatusOr<ParamSchedulerState> ParamSchedulerStateFromKeyValues(
    const std::map<std::string, std::string>& key_values) {
  ParamSchedulerState state;
  KeyValueReader reader(key_values);
  reader.ReadNumber("max_lr", state.max_lr);
  reader.ReadNumber("lr_warmup_steps", state.lr_warmup_steps);
  reader.ReadNumber("num_steps", state.num_steps);
  reader.ReadStyle("lr_decay_style", ParseLrDecayStyle, state.lr_decay_style);
  reader.ReadNumber("lr_decay_steps", state.lr_decay_steps);
  reader.ReadNumber("min_lr", state.min_lr);
  reader.ReadNumber("start_wd", state.start_wd);
  reader.ReadNumber("end_wd", state.end_wd);
  reader.ReadStyle("wd_incr_style", ParseWdIncrStyle, state.wd_incr_style);
  reader.ReadNumber("wd_incr_steps", state.wd_incr_steps);
  if (absl::Status s = reader.Finish(); !s.ok()) return s;
  return state;
}

std::string FormatParamSchedulerState(const ParamSchedulerState& state) {
  std::string text;
  for (const auto& [key, value] : ParamSchedulerStateToKeyValues(state)) {
    absl::StrAppend(&text, key, "=", value, "\n");
  }
  return text;
}

absl::StatusOr<ParamSchedulerState> ParseParamSchedulerState(
    std::string_view std_text) {
  const absl::string_view text(std_text.data(), std_text.size());
  std::map<std::string, std::string> key_values;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    const size_t equals = line.find('=');
    if (equals == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", line_number, ": expected key=value, got \"", line, "\""));
    }
    const std::string key(line.substr(0, equals));
    if (!key_values.emplace(key, std::string(line.substr(equals + 1))).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", line_number, ": key \"", key, "\" appears twice"));
    }
  }
  return ParamSchedulerStateFromKeyValues(key_values);
}

}  // namespace depot
