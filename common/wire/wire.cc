#include "wire/wire.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace depot {

v1::DType DTypeToProto(DType dtype) {
  return static_cast<v1::DType>(static_cast<int>(dtype));
}

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, const char* field) {
  switch (dtype) {
    case v1::DTYPE_FP32:
      return DType::kFloat32;
    case v1::DTYPE_BF16:
      return DType::kBFloat16;
    case v1::DTYPE_FP16:
      return DType::kFloat16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": unsupported dtype ", static_cast<int>(dtype),
                       " (expected DTYPE_FP32, DTYPE_BF16 or DTYPE_FP16)"));
  }
}

namespace {

absl::StatusOr<OptimizerKind> OptimizerKindFromProto(v1::OptimizerKind kind) {
  switch (kind) {
    case v1::OPTIMIZER_ADAMW:
      return OptimizerKind::kAdamW;
    case v1::OPTIMIZER_ADAM:
      return OptimizerKind::kAdam;
    case v1::OPTIMIZER_SGD:
      return OptimizerKind::kSgd;
    case v1::OPTIMIZER_ADAGRAD:
      return OptimizerKind::kAdagrad;
    case v1::OPTIMIZER_LION:
      return OptimizerKind::kLion;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer.kind: unsupported optimizer ", static_cast<int>(kind),
          " (expected OPTIMIZER_ADAMW, OPTIMIZER_ADAM, OPTIMIZER_SGD, "
          "OPTIMIZER_ADAGRAD or OPTIMIZER_LION)"));
  }
}

// DTYPE_UNSPECIFIED reads as fp32, the default, so that a spec written before
// the field existed keeps its meaning. Whether the dtype suits the slot is
// ValidateOptimizerConfig's to say.
absl::StatusOr<DType> MomentDTypeFromProto(v1::DType dtype, const char* field) {
  if (dtype == v1::DTYPE_UNSPECIFIED) return DType::kFloat32;
  return DTypeFromProto(dtype, field);
}

absl::StatusOr<GradNormType> GradNormTypeFromProto(v1::GradNormType type) {
  switch (type) {
    case v1::GRAD_NORM_UNSPECIFIED:
    case v1::GRAD_NORM_L2:
      return GradNormType::kL2;
    case v1::GRAD_NORM_INF:
      return GradNormType::kInf;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer.clip_grad_norm_type: unsupported norm type ",
          static_cast<int>(type), " (expected GRAD_NORM_L2 or GRAD_NORM_INF)"));
  }
}

// Converts without validating the values (JobConfigFromProto validates the
// whole config).
absl::StatusOr<OptimizerConfig> OptimizerConfigFromProto(
    const v1::OptimizerConfig& opt) {
  OptimizerConfig config;
  absl::StatusOr<OptimizerKind> kind = OptimizerKindFromProto(opt.kind());
  if (!kind.ok()) return kind.status();
  absl::StatusOr<DType> exp_avg =
      MomentDTypeFromProto(opt.exp_avg_dtype(), "optimizer.exp_avg_dtype");
  if (!exp_avg.ok()) return exp_avg.status();
  absl::StatusOr<DType> exp_avg_sq = MomentDTypeFromProto(
      opt.exp_avg_sq_dtype(), "optimizer.exp_avg_sq_dtype");
  if (!exp_avg_sq.ok()) return exp_avg_sq.status();
  absl::StatusOr<GradNormType> norm_type =
      GradNormTypeFromProto(opt.clip_grad_norm_type());
  if (!norm_type.ok()) return norm_type.status();
  config.kind = *kind;
  config.exp_avg_dtype = *exp_avg;
  config.exp_avg_sq_dtype = *exp_avg_sq;
  config.clip_grad_norm_type = *norm_type;
#define DEPOT_FROM_PROTO(member) config.member = opt.member();
#define DEPOT_ENUM(member)
  DEPOT_OPTIMIZER_FIELDS(DEPOT_FROM_PROTO, DEPOT_FROM_PROTO, DEPOT_ENUM)
#undef DEPOT_FROM_PROTO
#undef DEPOT_ENUM
  return config;
}

void OptimizerConfigToProto(const OptimizerConfig& o, v1::OptimizerConfig* opt) {
  opt->set_kind(static_cast<v1::OptimizerKind>(static_cast<int>(o.kind)));
  opt->set_exp_avg_dtype(DTypeToProto(o.exp_avg_dtype));
  opt->set_exp_avg_sq_dtype(DTypeToProto(o.exp_avg_sq_dtype));
  opt->set_clip_grad_norm_type(
      static_cast<v1::GradNormType>(static_cast<int>(o.clip_grad_norm_type)));
#define DEPOT_TO_PROTO(member) opt->set_##member(o.member);
#define DEPOT_ENUM(member)
  DEPOT_OPTIMIZER_FIELDS(DEPOT_TO_PROTO, DEPOT_TO_PROTO, DEPOT_ENUM)
#undef DEPOT_TO_PROTO
#undef DEPOT_ENUM
}

}  // namespace

void JobConfigToProto(const JobConfig& config, v1::JobSpec* spec) {
  spec->Clear();
  spec->set_name(config.name);
  for (const TensorSpec& t : config.tensors) {
    v1::TensorSpec* out = spec->add_tensors();
    out->set_name(t.name);
    out->set_numel(t.numel);
    out->set_param_group(t.param_group);
  }
  spec->set_num_workers(config.num_workers);
  OptimizerConfigToProto(config.optimizer, spec->mutable_optimizer());
  for (const OptimizerConfig& group : config.group_optimizers) {
    OptimizerConfigToProto(group, spec->add_group_optimizers());
  }
  spec->set_grad_dtype(DTypeToProto(config.grad_dtype));
  spec->set_weight_dtype(DTypeToProto(config.weight_dtype));
  spec->set_chunk_elems(config.chunk_elems);
  spec->set_alignment_elems(config.alignment_elems);
  spec->set_num_servers(config.num_servers);
  spec->set_checkpoint_every_steps(config.checkpoint_every_steps);
}

absl::StatusOr<JobConfig> JobConfigFromProto(const v1::JobSpec& spec) {
  JobConfig config;
  config.name = spec.name();
  config.tensors.reserve(spec.tensors_size());
  for (const v1::TensorSpec& t : spec.tensors()) {
    config.tensors.push_back({t.name(), t.numel(), t.param_group()});
  }
  config.num_workers = spec.num_workers();
  absl::StatusOr<OptimizerConfig> optimizer =
      OptimizerConfigFromProto(spec.optimizer());
  if (!optimizer.ok()) return optimizer.status();
  config.optimizer = *optimizer;
  for (const v1::OptimizerConfig& group : spec.group_optimizers()) {
    absl::StatusOr<OptimizerConfig> converted = OptimizerConfigFromProto(group);
    if (!converted.ok()) {
      return absl::Status(
          converted.status().code(),
          absl::StrCat("group_optimizers[", config.group_optimizers.size(),
                       "]: ", converted.status().message()));
    }
    config.group_optimizers.push_back(*converted);
  }
  absl::StatusOr<DType> grad = DTypeFromProto(spec.grad_dtype(), "grad_dtype");
  if (!grad.ok()) return grad.status();
  absl::StatusOr<DType> weight =
      DTypeFromProto(spec.weight_dtype(), "weight_dtype");
  if (!weight.ok()) return weight.status();
  config.grad_dtype = *grad;
  config.weight_dtype = *weight;
  config.chunk_elems = spec.chunk_elems();
  config.alignment_elems = spec.alignment_elems();
  config.num_servers = spec.num_servers();
  config.checkpoint_every_steps = spec.checkpoint_every_steps();
  if (absl::Status s = ValidateJobConfig(config); !s.ok()) return s;
  return config;
}

void GroupHyperParamsToProto(const std::vector<GroupHyperParams>& groups,
                             v1::StepHeader* header) {
  header->clear_group_hparams();
  for (const GroupHyperParams& g : groups) {
    v1::GroupHyperParams* out = header->add_group_hparams();
    out->set_param_group(g.param_group);
    out->set_lr(g.lr);
    out->set_weight_decay(g.weight_decay);
  }
}

std::vector<GroupHyperParams> GroupHyperParamsFromProto(
    const v1::StepHeader& header) {
  std::vector<GroupHyperParams> groups;
  groups.reserve(header.group_hparams_size());
  for (const v1::GroupHyperParams& g : header.group_hparams()) {
    groups.push_back({g.param_group(), g.lr(), g.weight_decay()});
  }
  return groups;
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share their numbering (both follow
  // google.rpc.Code).
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace depot
