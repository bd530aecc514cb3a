#include "depot/job_config_diff.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace depot {
namespace {

// Abseil here predates its alias of std::string_view.
absl::string_view ToAbsl(std::string_view text) {
  return absl::string_view(text.data(), text.size());
}

// The two configs' names in the messages ("existing job", "this request").
struct Sides {
  absl::string_view first;
  absl::string_view second;
};

// Equality as the fingerprint sees it: doubles bit for bit (so 0.0 and -0.0
// differ, as their fingerprints do), everything else by value.
bool SameValue(double a, double b) {
  return std::bit_cast<uint64_t>(a) == std::bit_cast<uint64_t>(b);
}
template <typename T>
bool SameValue(const T& a, const T& b) {
  return a == b;
}

// The shortest decimal that reads back as `value`, as a plain number when its
// magnitude is ordinary ("0.0003", "1000") and in scientific notation when it
// is tiny or huge ("1e-08").
std::string FormatValue(double value) {
  const double magnitude = std::fabs(value);
  const bool plain = magnitude == 0 || (magnitude >= 1e-5 && magnitude < 1e16);
  char buffer[400];  // room for any double written in full
  const std::to_chars_result result = std::to_chars(
      buffer, buffer + sizeof(buffer), value,
      plain ? std::chars_format::fixed : std::chars_format::scientific);
  return std::string(buffer, result.ptr);
}
std::string FormatValue(bool value) { return value ? "true" : "false"; }
std::string FormatValue(int value) { return absl::StrCat(value); }
std::string FormatValue(uint32_t value) { return absl::StrCat(value); }
std::string FormatValue(uint64_t value) { return absl::StrCat(value); }
std::string FormatValue(const std::string& value) {
  return absl::StrCat("\"", absl::CHexEscape(value), "\"");
}
std::string FormatValue(DType value) {
  // Out-of-range values can reach here from configs that were never validated
  // (a corrupt checkpoint): print the number rather than "unknown".
  if (!DTypeFromWire(static_cast<int>(value)).ok()) {
    return absl::StrCat("dtype ", static_cast<int>(value));
  }
  return std::string(DTypeName(value));
}
std::string FormatValue(OptimizerKind value) {
  switch (value) {
    case OptimizerKind::kAdamW:
      return "AdamW";
    case OptimizerKind::kAdam:
      return "Adam";
    case OptimizerKind::kSgd:
      return "SGD";
    case OptimizerKind::kAdagrad:
      return "Adagrad";
    case OptimizerKind::kLion:
      return "Lion";
  }
  return absl::StrCat("kind ", static_cast<int>(value));
}
std::string FormatValue(GradNormType value) {
  switch (value) {
    case GradNormType::kL2:
      return "L2";
    case GradNormType::kInf:
      return "inf";
  }
  return absl::StrCat("norm type ", static_cast<int>(value));
}

void AppendDifference(absl::string_view prefix, absl::string_view field,
                      absl::string_view first_value,
                      absl::string_view second_value, const Sides& sides,
                      std::vector<std::string>& out) {
  out.push_back(absl::StrCat(prefix, field, ": ", first_value, " (",
                             sides.first, ") vs ", second_value, " (",
                             sides.second, ")"));
}

// One row of a struct's comparison table: the field's name and what appends
// its differences (one line for a plain value, possibly several for a nested
// struct or a list).
template <typename Struct>
struct FieldRule {
  const char* name;
  void (*append)(absl::string_view prefix, absl::string_view name,
                 const Struct& first, const Struct& second, const Sides& sides,
                 std::vector<std::string>& out);
};

// The rule for a plain member: one line when SameValue says they differ,
// with FormatValue's text on each side.
template <typename Struct, auto Member>
constexpr FieldRule<Struct> ValueField(const char* name) {
  return {name, [](absl::string_view prefix, absl::string_view field,
                   const Struct& first, const Struct& second,
                   const Sides& sides, std::vector<std::string>& out) {
            if (SameValue(first.*Member, second.*Member)) return;
            AppendDifference(prefix, field, FormatValue(first.*Member),
                             FormatValue(second.*Member), sides, out);
          }};
}

#define DEPOT_VALUE_FIELD(Struct, member) \
  ValueField<Struct, &Struct::member>(#member)

// Every field of OptimizerConfig, in declaration order (job_config.h's
// DEPOT_OPTIMIZER_FIELDS; a new type needs a FormatValue overload).
#define DEPOT_OPTIMIZER_ROW(member) DEPOT_VALUE_FIELD(OptimizerConfig, member),
constexpr FieldRule<OptimizerConfig> kOptimizerFields[] = {
    DEPOT_OPTIMIZER_FIELDS(DEPOT_OPTIMIZER_ROW, DEPOT_OPTIMIZER_ROW,
                           DEPOT_OPTIMIZER_ROW)};
#undef DEPOT_OPTIMIZER_ROW

template <typename Struct, size_t N>
void AppendTableDifferences(const FieldRule<Struct> (&table)[N],
                            absl::string_view prefix, const Struct& first,
                            const Struct& second, const Sides& sides,
                            std::vector<std::string>& out) {
  for (const FieldRule<Struct>& rule : table) {
    rule.append(prefix, rule.name, first, second, sides, out);
  }
}

std::string FormatTensor(const std::vector<TensorSpec>& tensors, size_t index) {
  if (index >= tensors.size()) return "none";
  const TensorSpec& tensor = tensors[index];
  return absl::StrCat("{", FormatValue(tensor.name), ", numel ", tensor.numel,
                      ", param_group ", tensor.param_group, "}");
}

bool SameTensor(const TensorSpec& a, const TensorSpec& b) {
  return a.name == b.name && a.numel == b.numel &&
         a.param_group == b.param_group;
}

// The counts, if they differ, and the first index at which the lists differ
// (a tensor one list lacks shows as "none"), with how many of the later
// indices both lists have also differ.
void AppendTensorDifferences(absl::string_view prefix, absl::string_view name,
                             const JobConfig& first, const JobConfig& second,
                             const Sides& sides,
                             std::vector<std::string>& out) {
  const std::vector<TensorSpec>& a = first.tensors;
  const std::vector<TensorSpec>& b = second.tensors;
  if (a.size() != b.size()) {
    AppendDifference(prefix, absl::StrCat("number of ", name),
                     absl::StrCat(a.size()), absl::StrCat(b.size()), sides,
                     out);
  }
  const size_t common = std::min(a.size(), b.size());
  size_t index = 0;
  while (index < common && SameTensor(a[index], b[index])) ++index;
  if (index == std::max(a.size(), b.size())) return;
  size_t later = 0;
  for (size_t i = index + 1; i < common; ++i) {
    if (!SameTensor(a[i], b[i])) ++later;
  }
  AppendDifference(prefix, absl::StrCat(name, "[", index, "]"),
                   FormatTensor(a, index), FormatTensor(b, index), sides, out);
  if (later > 0) {
    absl::StrAppend(
        &out.back(), ", and ", later,
        later == 1 ? " later tensor differs" : " later tensors differ");
  }
}

void AppendOptimizer(absl::string_view prefix, absl::string_view name,
                     const JobConfig& first, const JobConfig& second,
                     const Sides& sides, std::vector<std::string>& out) {
  AppendTableDifferences(kOptimizerFields, absl::StrCat(prefix, name, "."),
                         first.optimizer, second.optimizer, sides, out);
}

// The per-group configs: their counts, then each entry both lists have,
// field by field under "NAME[i].".
void AppendGroupOptimizers(absl::string_view prefix, absl::string_view name,
                           const JobConfig& first, const JobConfig& second,
                           const Sides& sides, std::vector<std::string>& out) {
  const std::vector<OptimizerConfig>& a = first.group_optimizers;
  const std::vector<OptimizerConfig>& b = second.group_optimizers;
  if (a.size() != b.size()) {
    AppendDifference(prefix, absl::StrCat("number of ", name),
                     absl::StrCat(a.size()), absl::StrCat(b.size()), sides,
                     out);
  }
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    AppendTableDifferences(kOptimizerFields,
                           absl::StrCat(prefix, name, "[", i, "]."), a[i],
                           b[i], sides, out);
  }
}

// Every field of JobConfig, in declaration order. A new field is one line
// here; a list of structs gets a rule like AppendTensorDifferences.
constexpr FieldRule<JobConfig> kJobFields[] = {
    DEPOT_VALUE_FIELD(JobConfig, name),
    {"tensors", &AppendTensorDifferences},
    DEPOT_VALUE_FIELD(JobConfig, num_workers),
    {"optimizer", &AppendOptimizer},
    DEPOT_VALUE_FIELD(JobConfig, grad_dtype),
    DEPOT_VALUE_FIELD(JobConfig, weight_dtype),
    DEPOT_VALUE_FIELD(JobConfig, chunk_elems),
    DEPOT_VALUE_FIELD(JobConfig, alignment_elems),
    DEPOT_VALUE_FIELD(JobConfig, num_servers),
    {"group_optimizers", &AppendGroupOptimizers},
};

#undef DEPOT_VALUE_FIELD

}  // namespace

std::vector<std::string> OptimizerConfigDifferences(
    std::string_view prefix, const OptimizerConfig& first,
    std::string_view first_label, const OptimizerConfig& second,
    std::string_view second_label) {
  std::vector<std::string> out;
  AppendTableDifferences(kOptimizerFields, ToAbsl(prefix), first, second,
                         Sides{ToAbsl(first_label), ToAbsl(second_label)}, out);
  return out;
}

std::vector<std::string> JobConfigDifferences(const JobConfig& first,
                                              std::string_view first_label,
                                              const JobConfig& second,
                                              std::string_view second_label) {
  std::vector<std::string> out;
  AppendTableDifferences(kJobFields, "", first, second,
                         Sides{ToAbsl(first_label), ToAbsl(second_label)}, out);
  return out;
}

std::string DescribeJobConfigDifferences(const JobConfig& first,
                                         std::string_view first_label,
                                         const JobConfig& second,
                                         std::string_view second_label) {
  return absl::StrJoin(
      JobConfigDifferences(first, first_label, second, second_label), "; ");
}

}  // namespace depot
