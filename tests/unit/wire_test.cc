// The JobSpec conversion (common/wire): every JobConfig field survives a round
// trip, and the proto3 zero values of the enums that have a meaning of their
// own (moment dtypes, clip norm type) read as the defaults.
#include "wire/wire.h"

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "depot/job_config.h"
#include "gtest/gtest.h"
#include "tests/unit/job_config_mutations.h"

namespace depot {
namespace {

// Every field away from its default (and valid).
JobConfig NonDefaultJob() {
  JobConfig config;
  config.name = "wire";
  config.tensors = {{"w", 300, 0}, {"b", 7, 2}};
  config.num_workers = 3;
  config.grad_dtype = DType::kFloat16;
  config.weight_dtype = DType::kBFloat16;
  config.chunk_elems = 128;
  config.alignment_elems = 32;
  config.num_servers = 2;
  OptimizerConfig& o = config.optimizer;
  o.kind = OptimizerKind::kAdam;
  o.lr = 3e-4;
  o.min_lr = 3e-5;
  o.weight_decay = 0.1;
  o.adam_beta1 = 0.8;
  o.adam_beta2 = 0.95;
  o.adam_eps = 1e-6;
  o.sgd_momentum = 0.5;
  o.sgd_dampening = 0.25;
  o.sgd_nesterov = false;
  o.adagrad_lr_decay = 0.01;
  o.adagrad_initial_accumulator_value = 0.1;
  o.adagrad_eps = 1e-9;
  o.lion_beta1 = 0.95;
  o.lion_beta2 = 0.98;
  o.exp_avg_dtype = DType::kBFloat16;
  o.exp_avg_sq_dtype = DType::kBFloat16;
  o.clip_grad = 1.0;
  o.clip_grad_norm_type = GradNormType::kInf;
  o.grad_norm_skip_threshold = 50;
  o.loss_scale = 128;
  o.initial_loss_scale = 65536;
  o.min_loss_scale = 2;
  o.loss_scale_window = 200;
  o.hysteresis = 4;
  return config;
}

TEST(WireTest, JobConfigRoundTripKeepsEveryField) {
  const JobConfig config = NonDefaultJob();
  ASSERT_TRUE(ValidateJobConfig(config).ok());
  v1::JobSpec spec;
  JobConfigToProto(config, &spec);
  absl::StatusOr<JobConfig> back = JobConfigFromProto(spec);
  ASSERT_TRUE(back.ok()) << back.status();
  // The fingerprint covers every field (fingerprint_test.cc).
  EXPECT_EQ(Fingerprint(*back), Fingerprint(config));
  EXPECT_EQ(back->optimizer.hysteresis, 4);
  EXPECT_EQ(back->optimizer.clip_grad_norm_type, GradNormType::kInf);
  EXPECT_EQ(back->optimizer.exp_avg_sq_dtype, DType::kBFloat16);
}

// Each field changed alone (job_config_mutations.h) survives the trip
// through the wire.
TEST(WireTest, EveryFieldChangedAloneSurvivesTheRoundTrip) {
  testing::ExpectEveryFieldSurvives([](const JobConfig& config) {
    v1::JobSpec spec;
    JobConfigToProto(config, &spec);
    return JobConfigFromProto(spec);
  });
}

TEST(WireTest, NewOptimizerKindsRoundTrip) {
  for (OptimizerKind kind : {OptimizerKind::kAdagrad, OptimizerKind::kLion}) {
    JobConfig config = NonDefaultJob();
    config.optimizer.kind = kind;
    config.optimizer.exp_avg_dtype = DType::kFloat32;
    config.optimizer.exp_avg_sq_dtype = DType::kFloat32;
    v1::JobSpec spec;
    JobConfigToProto(config, &spec);
    absl::StatusOr<JobConfig> back = JobConfigFromProto(spec);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->optimizer.kind, kind);
  }
}

TEST(WireTest, UnspecifiedMomentDTypesAndNormTypeReadAsTheDefaults) {
  v1::JobSpec spec;
  JobConfigToProto(NonDefaultJob(), &spec);
  spec.mutable_optimizer()->set_exp_avg_dtype(v1::DTYPE_UNSPECIFIED);
  spec.mutable_optimizer()->set_exp_avg_sq_dtype(v1::DTYPE_UNSPECIFIED);
  spec.mutable_optimizer()->set_clip_grad_norm_type(v1::GRAD_NORM_UNSPECIFIED);
  absl::StatusOr<JobConfig> back = JobConfigFromProto(spec);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->optimizer.exp_avg_dtype, DType::kFloat32);
  EXPECT_EQ(back->optimizer.exp_avg_sq_dtype, DType::kFloat32);
  EXPECT_EQ(back->optimizer.clip_grad_norm_type, GradNormType::kL2);
}

TEST(WireTest, RejectsFp16MomentsNamingTheField) {
  v1::JobSpec spec;
  JobConfigToProto(NonDefaultJob(), &spec);
  spec.mutable_optimizer()->set_exp_avg_sq_dtype(v1::DTYPE_FP16);
  absl::StatusOr<JobConfig> back = JobConfigFromProto(spec);
  EXPECT_EQ(back.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      absl::StartsWith(back.status().message(), "optimizer.exp_avg_sq_dtype:"))
      << back.status();
}

TEST(WireTest, RejectsUnknownEnumValuesNamingTheField) {
  v1::JobSpec spec;
  JobConfigToProto(NonDefaultJob(), &spec);
  v1::JobSpec bad_norm = spec;
  bad_norm.mutable_optimizer()->set_clip_grad_norm_type(
      static_cast<v1::GradNormType>(9));
  EXPECT_TRUE(absl::StartsWith(JobConfigFromProto(bad_norm).status().message(),
                               "optimizer.clip_grad_norm_type:"));
  v1::JobSpec bad_dtype = spec;
  bad_dtype.mutable_optimizer()->set_exp_avg_dtype(static_cast<v1::DType>(9));
  EXPECT_TRUE(absl::StartsWith(JobConfigFromProto(bad_dtype).status().message(),
                               "optimizer.exp_avg_dtype:"));
  v1::JobSpec bad_kind = spec;
  bad_kind.mutable_optimizer()->set_kind(static_cast<v1::OptimizerKind>(6));
  EXPECT_TRUE(absl::StartsWith(JobConfigFromProto(bad_kind).status().message(),
                               "optimizer.kind:"));
}

}  // namespace
}  // namespace depot
