#include <cmath>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "depot/job_config.h"
#include "gtest/gtest.h"

namespace depot {
namespace {

JobConfig BaseJob() {
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

using Mutation = std::pair<std::string, std::function<void(JobConfig&)>>;

// One change to each field of JobConfig, OptimizerConfig and TensorSpec.
std::vector<Mutation> SingleFieldMutations() {
  return {
      {"name", [](JobConfig& c) { c.name = "gpu"; }},
      {"tensor name", [](JobConfig& c) { c.tensors[0].name = "wpe"; }},
      {"tensor numel", [](JobConfig& c) { c.tensors[1].numel = 65; }},
      {"tensor param_group",
       [](JobConfig& c) { c.tensors[0].param_group = 1; }},
      {"tensor added",
       [](JobConfig& c) {
         c.tensors.push_back({"x", 1, 0});
       }},
      {"tensor removed", [](JobConfig& c) { c.tensors.pop_back(); }},
      {"num_workers", [](JobConfig& c) { c.num_workers = 3; }},
      {"kind", [](JobConfig& c) { c.optimizer.kind = OptimizerKind::kAdam; }},
      {"lr", [](JobConfig& c) { c.optimizer.lr = 2e-3; }},
      {"lr by one ulp",
       [](JobConfig& c) { c.optimizer.lr = std::nextafter(1e-3, 1.0); }},
      {"weight_decay", [](JobConfig& c) { c.optimizer.weight_decay = 0.1; }},
      {"adam_beta1", [](JobConfig& c) { c.optimizer.adam_beta1 = 0.8; }},
      {"adam_beta2", [](JobConfig& c) { c.optimizer.adam_beta2 = 0.95; }},
      {"adam_eps", [](JobConfig& c) { c.optimizer.adam_eps = 1e-6; }},
      {"sgd_momentum", [](JobConfig& c) { c.optimizer.sgd_momentum = 0.5; }},
      {"sgd_dampening", [](JobConfig& c) { c.optimizer.sgd_dampening = 0.1; }},
      {"sgd_nesterov", [](JobConfig& c) { c.optimizer.sgd_nesterov = true; }},
      {"min_lr", [](JobConfig& c) { c.optimizer.min_lr = 1e-5; }},
      {"adagrad_lr_decay",
       [](JobConfig& c) { c.optimizer.adagrad_lr_decay = 0.01; }},
      {"adagrad_initial_accumulator_value",
       [](JobConfig& c) {
         c.optimizer.adagrad_initial_accumulator_value = 0.1;
       }},
      {"adagrad_eps", [](JobConfig& c) { c.optimizer.adagrad_eps = 1e-8; }},
      {"lion_beta1", [](JobConfig& c) { c.optimizer.lion_beta1 = 0.95; }},
      {"lion_beta2", [](JobConfig& c) { c.optimizer.lion_beta2 = 0.98; }},
      {"exp_avg_dtype",
       [](JobConfig& c) { c.optimizer.exp_avg_dtype = DType::kBFloat16; }},
      {"exp_avg_sq_dtype",
       [](JobConfig& c) { c.optimizer.exp_avg_sq_dtype = DType::kBFloat16; }},
      {"clip_grad", [](JobConfig& c) { c.optimizer.clip_grad = 1.0; }},
      {"clip_grad_norm_type",
       [](JobConfig& c) {
         c.optimizer.clip_grad_norm_type = GradNormType::kInf;
       }},
      {"grad_norm_skip_threshold",
       [](JobConfig& c) { c.optimizer.grad_norm_skip_threshold = 100; }},
      {"loss_scale", [](JobConfig& c) { c.optimizer.loss_scale = 1024; }},
      {"initial_loss_scale",
       [](JobConfig& c) { c.optimizer.initial_loss_scale = 65536; }},
      {"min_loss_scale", [](JobConfig& c) { c.optimizer.min_loss_scale = 2; }},
      {"loss_scale_window",
       [](JobConfig& c) { c.optimizer.loss_scale_window = 500; }},
      {"hysteresis", [](JobConfig& c) { c.optimizer.hysteresis = 3; }},
      {"grad_dtype", [](JobConfig& c) { c.grad_dtype = DType::kFloat32; }},
      {"weight_dtype", [](JobConfig& c) { c.weight_dtype = DType::kFloat16; }},
      {"chunk_elems", [](JobConfig& c) { c.chunk_elems = 2048; }},
      {"alignment_elems", [](JobConfig& c) { c.alignment_elems = 128; }},
      {"num_servers", [](JobConfig& c) { c.num_servers = 4; }},
      {"amsgrad", [](JobConfig& c) { c.optimizer.amsgrad = true; }},
      {"maximize", [](JobConfig& c) { c.optimizer.maximize = true; }},
      {"group_optimizers",
       [](JobConfig& c) {
         c.group_optimizers = {c.optimizer, c.optimizer};
       }},
      {"a group's beta1",
       [](JobConfig& c) {
         c.group_optimizers = {c.optimizer, c.optimizer};
         c.group_optimizers[1].adam_beta1 = 0.8;
       }},
      {"a group's maximize",
       [](JobConfig& c) {
         c.group_optimizers = {c.optimizer, c.optimizer};
         c.group_optimizers[0].maximize = true;
       }},
  };
}

TEST(FingerprintTest, EqualConfigsHaveEqualFingerprints) {
  EXPECT_EQ(Fingerprint(BaseJob()), Fingerprint(BaseJob()));
}

TEST(FingerprintTest, ChangingAnySingleFieldChangesIt) {
  const uint64_t base = Fingerprint(BaseJob());
  for (const auto& [what, mutate] : SingleFieldMutations()) {
    JobConfig config = BaseJob();
    mutate(config);
    EXPECT_NE(Fingerprint(config), base) << what;
  }
}

TEST(FingerprintTest, DifferentMutationsGiveDifferentFingerprints) {
  std::set<uint64_t> seen = {Fingerprint(BaseJob())};
  for (const auto& [what, mutate] : SingleFieldMutations()) {
    JobConfig config = BaseJob();
    mutate(config);
    EXPECT_TRUE(seen.insert(Fingerprint(config)).second) << what;
  }
}

TEST(FingerprintTest, TensorOrderMatters) {
  JobConfig swapped = BaseJob();
  std::swap(swapped.tensors[0], swapped.tensors[1]);
  EXPECT_NE(Fingerprint(swapped), Fingerprint(BaseJob()));
}

TEST(FingerprintTest, StringBoundariesMatter) {
  // Same characters in sequence, split differently between two strings.
  JobConfig a = BaseJob();
  JobConfig b = BaseJob();
  // (Move-assigned std::strings: assigning literals trips GCC 12's false
  // -Wrestrict warning at -O3, GCC bug 105329.)
  a.name = std::string("ab");
  a.tensors[0].name = std::string("c");
  b.name = std::string("a");
  b.tensors[0].name = std::string("bc");
  EXPECT_NE(Fingerprint(a), Fingerprint(b));
}

TEST(FingerprintTest, IsStableAcrossBuildsAndMachines) {
  // A golden value: the fingerprint travels between processes and hosts, so
  // its encoding must not change silently. If this fails after an intended
  // encoding change, bump kFingerprintTag in job_config.cc and update the
  // value.
  // Configs that use none of amsgrad, maximize and group_optimizers (added
  // later) keep this value, so states saved before them still load.
  EXPECT_EQ(Fingerprint(BaseJob()), uint64_t{2269984428856724807u});
}

}  // namespace
}  // namespace depot
