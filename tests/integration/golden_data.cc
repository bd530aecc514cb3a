#include "golden_data.h"

#include <bit>
#include <cstring>
#include <fstream>
#include <iterator>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace depot::testing {
namespace {

using ::google::protobuf::ListValue;
using ::google::protobuf::Struct;
using ::google::protobuf::Value;

// The data files are little-endian float32, read by memcpy.
static_assert(std::endian::native == std::endian::little);

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(
        "cannot open ", path, "; regenerate with tests/golden/generate.py"));
  }
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// `count` vectors of `length` floats from the file `name` in `dir`.
absl::StatusOr<std::vector<std::vector<float>>> ReadVectors(
    const std::string& dir, const std::string& name, size_t count,
    size_t length) {
  absl::StatusOr<std::string> bytes = ReadFile(absl::StrCat(dir, "/", name));
  if (!bytes.ok()) return bytes.status();
  const size_t vector_bytes = length * sizeof(float);
  if (bytes->size() != count * vector_bytes) {
    return absl::DataLossError(
        absl::StrCat(dir, "/", name, " has ", bytes->size(), " bytes; the ",
                     "manifest implies ", count, " x ", length, " float32"));
  }
  std::vector<std::vector<float>> vectors(count, std::vector<float>(length));
  for (size_t i = 0; i < count; ++i) {
    std::memcpy(vectors[i].data(), bytes->data() + i * vector_bytes,
                vector_bytes);
  }
  return vectors;
}

// Typed access to the parsed manifest, with errors that name the field.
absl::StatusOr<const Value*> Field(const Struct& object,
                                   absl::string_view key) {
  auto it = object.fields().find(std::string(key));
  if (it == object.fields().end()) {
    return absl::DataLossError(
        absl::StrCat("manifest.json: field \"", key, "\" is missing"));
  }
  return &it->second;
}

absl::StatusOr<double> Number(const Struct& object, absl::string_view key) {
  absl::StatusOr<const Value*> value = Field(object, key);
  if (!value.ok()) return value.status();
  if ((*value)->kind_case() != Value::kNumberValue) {
    return absl::DataLossError(
        absl::StrCat("manifest.json: \"", key, "\" is not a number"));
  }
  return (*value)->number_value();
}

absl::StatusOr<std::string> String(const Struct& object,
                                   absl::string_view key) {
  absl::StatusOr<const Value*> value = Field(object, key);
  if (!value.ok()) return value.status();
  if ((*value)->kind_case() != Value::kStringValue) {
    return absl::DataLossError(
        absl::StrCat("manifest.json: \"", key, "\" is not a string"));
  }
  return (*value)->string_value();
}

absl::StatusOr<const ListValue*> List(const Struct& object,
                                      absl::string_view key) {
  absl::StatusOr<const Value*> value = Field(object, key);
  if (!value.ok()) return value.status();
  if ((*value)->kind_case() != Value::kListValue) {
    return absl::DataLossError(
        absl::StrCat("manifest.json: \"", key, "\" is not a list"));
  }
  return &(*value)->list_value();
}

absl::StatusOr<OptimizerKind> KindFromName(const std::string& name) {
  if (name == "adamw") return OptimizerKind::kAdamW;
  if (name == "adam") return OptimizerKind::kAdam;
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "adagrad") return OptimizerKind::kAdagrad;
  if (name == "lion") return OptimizerKind::kLion;
  return absl::InvalidArgumentError(
      absl::StrCat("manifest.json: unknown optimizer kind \"", name, "\""));
}

// Sets the OptimizerConfig field the manifest calls `key`.
absl::Status SetOptimizerField(const std::string& key, const Value& value,
                               OptimizerConfig& config) {
  static const std::pair<const char*, double OptimizerConfig::*> kNumbers[] = {
      {"adam_beta1", &OptimizerConfig::adam_beta1},
      {"adam_beta2", &OptimizerConfig::adam_beta2},
      {"adam_eps", &OptimizerConfig::adam_eps},
      {"sgd_momentum", &OptimizerConfig::sgd_momentum},
      {"sgd_dampening", &OptimizerConfig::sgd_dampening},
      {"adagrad_lr_decay", &OptimizerConfig::adagrad_lr_decay},
      {"adagrad_initial_accumulator_value",
       &OptimizerConfig::adagrad_initial_accumulator_value},
      {"adagrad_eps", &OptimizerConfig::adagrad_eps},
      {"lion_beta1", &OptimizerConfig::lion_beta1},
      {"lion_beta2", &OptimizerConfig::lion_beta2},
  };
  if (key == "kind") {
    absl::StatusOr<OptimizerKind> kind = KindFromName(value.string_value());
    if (!kind.ok()) return kind.status();
    config.kind = *kind;
    return absl::OkStatus();
  }
  static const std::pair<const char*, bool OptimizerConfig::*> kFlags[] = {
      {"sgd_nesterov", &OptimizerConfig::sgd_nesterov},
      {"amsgrad", &OptimizerConfig::amsgrad},
      {"maximize", &OptimizerConfig::maximize},
  };
  for (const auto& [name, member] : kFlags) {
    if (key == name && value.kind_case() == Value::kBoolValue) {
      config.*member = value.bool_value();
      return absl::OkStatus();
    }
  }
  for (const auto& [name, member] : kNumbers) {
    if (key == name && value.kind_case() == Value::kNumberValue) {
      config.*member = value.number_value();
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "manifest.json: optimizer field \"", key,
      "\" is unknown or of the wrong type; teach golden_data.cc its name"));
}

// rows[s][k] from a list of per-step lists of per-group numbers.
absl::StatusOr<std::vector<std::vector<double>>> StepRows(const Struct& object,
                                                          absl::string_view key,
                                                          uint64_t steps) {
  absl::StatusOr<const ListValue*> list = List(object, key);
  if (!list.ok()) return list.status();
  if (static_cast<uint64_t>((*list)->values_size()) != steps) {
    return absl::DataLossError(absl::StrCat("manifest.json: \"", key, "\" has ",
                                            (*list)->values_size(),
                                            " rows, expected ", steps));
  }
  std::vector<std::vector<double>> rows;
  for (const Value& row : (*list)->values()) {
    rows.emplace_back();
    for (const Value& v : row.list_value().values()) {
      rows.back().push_back(v.number_value());
    }
  }
  return rows;
}

absl::StatusOr<GoldenCase> ParseCase(const Struct& object,
                                     const std::string& dir, uint64_t steps,
                                     size_t param_elems) {
  GoldenCase golden;
  absl::StatusOr<std::string> name = String(object, "name");
  if (!name.ok()) return name.status();
  golden.name = *name;
  absl::StatusOr<std::string> reference = String(object, "reference");
  if (!reference.ok()) return reference.status();
  golden.reference = *reference;
  absl::StatusOr<const Value*> optimizer = Field(object, "optimizer");
  if (!optimizer.ok()) return optimizer.status();
  for (const auto& [key, value] : (*optimizer)->struct_value().fields()) {
    if (absl::Status s = SetOptimizerField(key, value, golden.optimizer);
        !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<std::vector<std::vector<double>>> lrs =
      StepRows(object, "lr", steps);
  if (!lrs.ok()) return lrs.status();
  absl::StatusOr<std::vector<std::vector<double>>> wds =
      StepRows(object, "weight_decay", steps);
  if (!wds.ok()) return wds.status();
  for (uint64_t s = 0; s < steps; ++s) {
    if ((*lrs)[s].size() != (*wds)[s].size()) {
      return absl::DataLossError(absl::StrCat(
          "manifest.json: case ", golden.name, " step ", s + 1,
          " has a different number of lr and weight_decay values"));
    }
    golden.hparams.emplace_back();
    for (size_t k = 0; k < (*lrs)[s].size(); ++k) {
      golden.hparams.back().push_back(
          {static_cast<uint32_t>(k), (*lrs)[s][k], (*wds)[s][k]});
    }
  }
  absl::StatusOr<const Value*> trajectories = Field(object, "trajectories");
  if (!trajectories.ok()) return trajectories.status();
  for (const auto& [variant, file] : (*trajectories)->struct_value().fields()) {
    absl::StatusOr<std::vector<std::vector<float>>> trajectory =
        ReadVectors(dir, file.string_value(), steps, param_elems);
    if (!trajectory.ok()) return trajectory.status();
    golden.trajectories[variant] = *std::move(trajectory);
  }
  return golden;
}

}  // namespace

const GoldenCase* GoldenData::Find(absl::string_view name) const {
  for (const GoldenCase& golden : cases) {
    if (golden.name == name) return &golden;
  }
  return nullptr;
}

absl::StatusOr<GoldenData> LoadGoldenData(const std::string& dir) {
  absl::StatusOr<std::string> json =
      ReadFile(absl::StrCat(dir, "/manifest.json"));
  if (!json.ok()) return json.status();
  Struct manifest;
  if (auto s = google::protobuf::util::JsonStringToMessage(*json, &manifest);
      !s.ok()) {
    return absl::DataLossError(
        absl::StrCat(dir, "/manifest.json is not valid JSON: ", s.ToString()));
  }
  GoldenData data;
  absl::StatusOr<std::string> torch_version = String(manifest, "torch_version");
  if (!torch_version.ok()) return torch_version.status();
  data.torch_version = *torch_version;
  absl::StatusOr<double> steps = Number(manifest, "steps");
  if (!steps.ok()) return steps.status();
  data.steps = static_cast<uint64_t>(*steps);

  absl::StatusOr<const ListValue*> tensors = List(manifest, "tensors");
  if (!tensors.ok()) return tensors.status();
  size_t param_elems = 0;
  for (const Value& t : (*tensors)->values()) {
    absl::StatusOr<std::string> name = String(t.struct_value(), "name");
    if (!name.ok()) return name.status();
    absl::StatusOr<double> numel = Number(t.struct_value(), "numel");
    if (!numel.ok()) return numel.status();
    absl::StatusOr<double> group = Number(t.struct_value(), "param_group");
    if (!group.ok()) return group.status();
    data.tensors.push_back(
        {*name, static_cast<uint64_t>(*numel), static_cast<uint32_t>(*group)});
    param_elems += static_cast<size_t>(*numel);
  }

  absl::StatusOr<std::string> inputs_file = String(manifest, "inputs");
  if (!inputs_file.ok()) return inputs_file.status();
  absl::StatusOr<std::vector<std::vector<float>>> inputs =
      ReadVectors(dir, *inputs_file, data.steps + 1, param_elems);
  if (!inputs.ok()) return inputs.status();
  data.initial_weights = std::move(inputs->front());
  data.grads.assign(std::make_move_iterator(inputs->begin() + 1),
                    std::make_move_iterator(inputs->end()));

  absl::StatusOr<const ListValue*> cases = List(manifest, "cases");
  if (!cases.ok()) return cases.status();
  for (const Value& c : (*cases)->values()) {
    absl::StatusOr<GoldenCase> golden =
        ParseCase(c.struct_value(), dir, data.steps, param_elems);
    if (!golden.ok()) return golden.status();
    data.cases.push_back(*std::move(golden));
  }
  return data;
}

std::vector<float> ToFlat(const Layout& layout,
                          const std::vector<float>& packed) {
  std::vector<float> flat(layout.total_elems(), 0.0f);
  size_t next = 0;
  for (const Segment& segment : layout.SegmentsIn(0, layout.total_elems())) {
    for (uint64_t i = segment.begin; i < segment.end; ++i) {
      flat[i] = packed[next++];
    }
  }
  return flat;
}

std::vector<float> ToPacked(const Layout& layout,
                            const std::vector<float>& flat) {
  std::vector<float> packed;
  packed.reserve(layout.param_elems());
  for (const Segment& segment : layout.SegmentsIn(0, layout.total_elems())) {
    packed.insert(packed.end(), flat.begin() + segment.begin,
                  flat.begin() + segment.end);
  }
  return packed;
}

}  // namespace depot::testing
