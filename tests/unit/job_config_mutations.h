// A valid JobConfig and one change to each of its fields, for the tests of
// everything that must notice any field: the fingerprint
// (fingerprint_test.cc) and the field-by-field comparison
// (job_config_diff_test.cc), and the conversions there and back (wire_test.cc,
// c_api_convert_test.cc). A field added to JobConfig, OptimizerConfig or
// TensorSpec gets a mutation here, and these tests then check it.
#ifndef DEPOT_TESTS_UNIT_JOB_CONFIG_MUTATIONS_H_
#define DEPOT_TESTS_UNIT_JOB_CONFIG_MUTATIONS_H_

#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "depot/job_config.h"
#include "depot/job_config_diff.h"
#include "gtest/gtest.h"

namespace depot::testing {

inline JobConfig BaseJob() {
  JobConfig config;
  config.name = "gpt";
  config.tensors = {{"wte", 5000, 0}, {"ln_f", 64, 1}};
  config.num_workers = 2;
  config.optimizer.kind = OptimizerKind::kAdamW;
  config.grad_dtype = DType::kBFloat16;
  config.weight_dtype = DType::kBFloat16;
  config.chunk_elems = 1024;
  config.alignment_elems = 64;
  config.num_servers = 3;
  return config;
}

// One change to a config: `field` names what changed as
// JobConfigDifferences names it (the first line it reports).
struct Mutation {
  std::string field;
  std::function<void(JobConfig&)> mutate;
};

// One change to each field of JobConfig, OptimizerConfig and TensorSpec (and
// to the tensor list's length).
inline std::vector<Mutation> SingleFieldMutations() {
  return {
      {"name", [](JobConfig& c) { c.name = "gpu"; }},
      {"tensors[0]", [](JobConfig& c) { c.tensors[0].name = "wpe"; }},
      {"tensors[1]", [](JobConfig& c) { c.tensors[1].numel = 65; }},
      {"tensors[0]", [](JobConfig& c) { c.tensors[0].param_group = 1; }},
      {"number of tensors",
       [](JobConfig& c) {
         c.tensors.push_back({"x", 1, 0});
       }},
      {"number of tensors", [](JobConfig& c) { c.tensors.pop_back(); }},
      {"num_workers", [](JobConfig& c) { c.num_workers = 3; }},
      {"optimizer.kind",
       [](JobConfig& c) { c.optimizer.kind = OptimizerKind::kAdam; }},
      {"optimizer.lr", [](JobConfig& c) { c.optimizer.lr = 2e-3; }},
      {"optimizer.lr",
       [](JobConfig& c) { c.optimizer.lr = std::nextafter(1e-3, 1.0); }},
      {"optimizer.weight_decay",
       [](JobConfig& c) { c.optimizer.weight_decay = 0.1; }},
      {"optimizer.adam_beta1",
       [](JobConfig& c) { c.optimizer.adam_beta1 = 0.8; }},
      {"optimizer.adam_beta2",
       [](JobConfig& c) { c.optimizer.adam_beta2 = 0.95; }},
      {"optimizer.adam_eps", [](JobConfig& c) { c.optimizer.adam_eps = 1e-6; }},
      {"optimizer.sgd_momentum",
       [](JobConfig& c) { c.optimizer.sgd_momentum = 0.5; }},
      {"optimizer.sgd_dampening",
       [](JobConfig& c) { c.optimizer.sgd_dampening = 0.1; }},
      {"optimizer.sgd_nesterov",
       [](JobConfig& c) { c.optimizer.sgd_nesterov = true; }},
      {"optimizer.min_lr", [](JobConfig& c) { c.optimizer.min_lr = 1e-5; }},
      {"optimizer.adagrad_lr_decay",
       [](JobConfig& c) { c.optimizer.adagrad_lr_decay = 0.01; }},
      {"optimizer.adagrad_initial_accumulator_value",
       [](JobConfig& c) {
         c.optimizer.adagrad_initial_accumulator_value = 0.1;
       }},
      {"optimizer.adagrad_eps",
       [](JobConfig& c) { c.optimizer.adagrad_eps = 1e-8; }},
      {"optimizer.lion_beta1",
       [](JobConfig& c) { c.optimizer.lion_beta1 = 0.95; }},
      {"optimizer.lion_beta2",
       [](JobConfig& c) { c.optimizer.lion_beta2 = 0.98; }},
      {"optimizer.exp_avg_dtype",
       [](JobConfig& c) { c.optimizer.exp_avg_dtype = DType::kBFloat16; }},
      {"optimizer.exp_avg_sq_dtype",
       [](JobConfig& c) { c.optimizer.exp_avg_sq_dtype = DType::kBFloat16; }},
      {"optimizer.clip_grad",
       [](JobConfig& c) { c.optimizer.clip_grad = 1.0; }},
      {"optimizer.clip_grad_norm_type",
       [](JobConfig& c) {
         c.optimizer.clip_grad_norm_type = GradNormType::kInf;
       }},
      {"optimizer.grad_norm_skip_threshold",
       [](JobConfig& c) { c.optimizer.grad_norm_skip_threshold = 100; }},
      {"optimizer.loss_scale",
       [](JobConfig& c) { c.optimizer.loss_scale = 1024; }},
      {"optimizer.initial_loss_scale",
       [](JobConfig& c) { c.optimizer.initial_loss_scale = 65536; }},
      {"optimizer.min_loss_scale",
       [](JobConfig& c) { c.optimizer.min_loss_scale = 2; }},
      {"optimizer.loss_scale_window",
       [](JobConfig& c) { c.optimizer.loss_scale_window = 500; }},
      {"optimizer.hysteresis",
       [](JobConfig& c) { c.optimizer.hysteresis = 3; }},
      {"grad_dtype", [](JobConfig& c) { c.grad_dtype = DType::kFloat32; }},
      {"weight_dtype", [](JobConfig& c) { c.weight_dtype = DType::kFloat16; }},
      {"chunk_elems", [](JobConfig& c) { c.chunk_elems = 2048; }},
      {"alignment_elems", [](JobConfig& c) { c.alignment_elems = 128; }},
      {"num_servers", [](JobConfig& c) { c.num_servers = 4; }},
      {"optimizer.amsgrad", [](JobConfig& c) { c.optimizer.amsgrad = true; }},
      {"optimizer.maximize",
       [](JobConfig& c) { c.optimizer.maximize = true; }},
      {"number of group_optimizers",
       [](JobConfig& c) { c.group_optimizers = {c.optimizer, c.optimizer}; }},
  };
}

// For the tests of a conversion there and back (the proto, the C API):
// each field changed alone must come back as it went, by value and by
// fingerprint. A field the conversion forgets comes back as its default, and
// the failure names it.
inline void ExpectEveryFieldSurvives(
    const std::function<absl::StatusOr<JobConfig>(const JobConfig&)>&
        there_and_back) {
  const std::vector<Mutation> mutations = SingleFieldMutations();
  ASSERT_GT(mutations.size(), 30u);
  for (const Mutation& mutation : mutations) {
    JobConfig config = BaseJob();
    mutation.mutate(config);
    absl::StatusOr<JobConfig> back = there_and_back(config);
    ASSERT_TRUE(back.ok()) << mutation.field << ": " << back.status();
    EXPECT_EQ(DescribeJobConfigDifferences(config, "given", *back, "read"), "")
        << mutation.field;
    EXPECT_EQ(Fingerprint(*back), Fingerprint(config)) << mutation.field;
  }
}

}  // namespace depot::testing

#endif  // DEPOT_TESTS_UNIT_JOB_CONFIG_MUTATIONS_H_
