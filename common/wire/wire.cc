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
  v1::OptimizerConfig* opt = spec->mutable_optimizer();
  const OptimizerConfig& o = config.optimizer;
  opt->set_kind(static_cast<v1::OptimizerKind>(static_cast<int>(o.kind)));
  opt->set_lr(o.lr);
  opt->set_weight_decay(o.weight_decay);
  opt->set_adam_beta1(o.adam_beta1);
  opt->set_adam_beta2(o.adam_beta2);
  opt->set_adam_eps(o.adam_eps);
  opt->set_sgd_momentum(o.sgd_momentum);
  opt->set_sgd_dampening(o.sgd_dampening);
  opt->set_sgd_nesterov(o.sgd_nesterov);
  spec->set_grad_dtype(DTypeToProto(config.grad_dtype));
  spec->set_weight_dtype(DTypeToProto(config.weight_dtype));
  spec->set_chunk_elems(config.chunk_elems);
  spec->set_alignment_elems(config.alignment_elems);
  spec->set_num_servers(config.num_servers);
}

absl::StatusOr<JobConfig> JobConfigFromProto(const v1::JobSpec& spec) {
  JobConfig config;
  config.name = spec.name();
  config.tensors.reserve(spec.tensors_size());
  for (const v1::TensorSpec& t : spec.tensors()) {
    config.tensors.push_back({t.name(), t.numel(), t.param_group()});
  }
  config.num_workers = spec.num_workers();
  const v1::OptimizerConfig& opt = spec.optimizer();
  switch (opt.kind()) {
    case v1::OPTIMIZER_ADAMW:
      config.optimizer.kind = OptimizerKind::kAdamW;
      break;
    case v1::OPTIMIZER_ADAM:
      config.optimizer.kind = OptimizerKind::kAdam;
      break;
    case v1::OPTIMIZER_SGD:
      config.optimizer.kind = OptimizerKind::kSgd;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer.kind: unsupported optimizer ", static_cast<int>(opt.kind()),
          " (expected OPTIMIZER_ADAMW, OPTIMIZER_ADAM or OPTIMIZER_SGD)"));
  }
  config.optimizer.lr = opt.lr();
  config.optimizer.weight_decay = opt.weight_decay();
  config.optimizer.adam_beta1 = opt.adam_beta1();
  config.optimizer.adam_beta2 = opt.adam_beta2();
  config.optimizer.adam_eps = opt.adam_eps();
  config.optimizer.sgd_momentum = opt.sgd_momentum();
  config.optimizer.sgd_dampening = opt.sgd_dampening();
  config.optimizer.sgd_nesterov = opt.sgd_nesterov();
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
