// train_one_step SERVER: one SGD step of a two-tensor job on the depot-server
// at SERVER ("host:port"), through the installed C++ API only. The learning
// rate comes from an OptimizerParamScheduler and the loss scale from
// MakeGradScaler, so the classes and functions of every public header are
// called across the library's boundary. Exit status 0 when the updated
// weights are exactly w - lr * g and the padding is zero.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "depot/client.h"
#include "depot/dtype.h"
#include "depot/grad_scaler.h"
#include "depot/job_config.h"
#include "depot/layout.h"
#include "depot/param_scheduler.h"
#include "depot/shard_plan.h"

namespace {

// The schedule's learning rate; the config's differs, so weights updated
// with it show that the per-step hyperparameters reached the server.
constexpr double kScheduledLr = 0.5;

int Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "train_one_step: %s: %s\n", what.c_str(),
               status.ToString().c_str());
  return 1;
}

int Fail(const std::string& what) { return Fail(what, absl::OkStatus()); }

depot::JobConfig SgdConfig() {
  depot::JobConfig config;
  config.name = "downstream-train-one-step";
  config.tensors = {{"w", 1000, 0}, {"b", 10, 1}};
  config.chunk_elems = 256;
  config.optimizer.kind = depot::OptimizerKind::kSgd;
  config.optimizer.lr = 0.1;
  config.optimizer.sgd_momentum = 0.0;
  config.optimizer.weight_decay = 0.0;
  return config;
}

absl::StatusOr<depot::OptimizerParamScheduler> ConstantSchedule() {
  depot::ParamSchedulerOptions options;
  options.max_lr = kScheduledLr;
  options.min_lr = kScheduledLr;
  options.lr_decay_style = depot::LrDecayStyle::kConstant;
  depot::SchedulerParamGroup weights;
  weights.param_group = 0;
  depot::SchedulerParamGroup biases;
  biases.param_group = 1;
  return depot::OptimizerParamScheduler::Create(options, {weights, biases});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: train_one_step HOST:PORT\n");
    return 2;
  }
  const depot::JobConfig config = SgdConfig();
  if (absl::Status s = depot::ValidateJobConfig(config); !s.ok()) {
    return Fail("ValidateJobConfig", s);
  }
  absl::StatusOr<depot::JobGeometry> geometry = depot::MakeJobGeometry(config);
  if (!geometry.ok()) return Fail("MakeJobGeometry", geometry.status());

  depot::ClientOptions options;
  options.servers = {argv[1]};
  absl::StatusOr<std::unique_ptr<depot::Client>> client =
      depot::Client::Connect(options);
  if (!client.ok()) return Fail("Connect", client.status());
  if (absl::Status s = (*client)->WaitForServers(absl::Seconds(60)); !s.ok()) {
    return Fail("WaitForServers", s);
  }
  absl::StatusOr<std::unique_ptr<depot::Job>> job =
      (*client)->OpenJob(config, /*worker_rank=*/0);
  if (!job.ok()) return Fail("OpenJob", job.status());
  const depot::Layout& layout = (*job)->layout();
  const uint64_t n = (*job)->total_elems();
  if (n != geometry->layout.total_elems() ||
      (*job)->plan().num_chunks() != geometry->plan.num_chunks()) {
    return Fail("the job's layout differs from MakeJobGeometry's");
  }
  if ((*job)->fingerprint() != depot::Fingerprint((*job)->config())) {
    return Fail("the job's fingerprint differs from Fingerprint(config)");
  }

  // Dyadic values: w - 0.5 * g is exact in fp32, so the check is bitwise.
  std::vector<float> weights(n, 0.0f);
  std::vector<float> grads(n, 0.0f);
  for (size_t t = 0; t < layout.tensors().size(); ++t) {
    for (uint64_t i = 0; i < layout.tensors()[t].numel; ++i) {
      weights[layout.offset(t) + i] = static_cast<float>(i % 16) * 0.25f;
      grads[layout.offset(t) + i] = static_cast<float>(i % 3) - 1.0f;
    }
  }
  // The initial weights go in as bf16, converted by the library; these values
  // are exact in bf16.
  std::vector<uint16_t> weights_bf16(n);
  depot::ConvertFromFloat(weights.data(), depot::DType::kBFloat16,
                          weights_bf16.data(), n);
  if (absl::Status s =
          (*job)->InitWeights(weights_bf16.data(), depot::DType::kBFloat16);
      !s.ok()) {
    return Fail("InitWeights", s);
  }

  absl::StatusOr<depot::OptimizerParamScheduler> schedule = ConstantSchedule();
  if (!schedule.ok()) return Fail("OptimizerParamScheduler", schedule.status());
  absl::StatusOr<std::unique_ptr<depot::GradScaler>> scaler =
      depot::MakeGradScaler(config);
  if (!scaler.ok()) return Fail("MakeGradScaler", scaler.status());

  depot::StepOptions step_options;
  step_options.group_hparams = schedule->hyper_params();
  step_options.loss_scale = (*scaler)->scale();
  std::vector<float> updated(n, -1.0f);
  depot::StepResult result;
  if (absl::Status s = (*job)->Step(1, grads.data(), updated.data(), &result,
                                    step_options);
      !s.ok()) {
    return Fail("Step", s);
  }
  if (result.step != 1 || result.skipped ||
      result.chunks != (*job)->plan().num_chunks()) {
    return Fail("unexpected StepResult");
  }

  uint64_t checked = 0;
  std::vector<bool> is_tensor(n, false);
  for (size_t t = 0; t < layout.tensors().size(); ++t) {
    for (uint64_t i = 0; i < layout.tensors()[t].numel; ++i) {
      const uint64_t at = layout.offset(t) + i;
      is_tensor[at] = true;
      const float expected =
          weights[at] - static_cast<float>(kScheduledLr) * grads[at];
      if (updated[at] != expected) {
        std::fprintf(stderr,
                     "train_one_step: %s[%llu] is %.9g, expected %.9g\n",
                     layout.tensors()[t].name.c_str(),
                     static_cast<unsigned long long>(i), updated[at],
                     expected);
        return 1;
      }
      ++checked;
    }
  }
  for (uint64_t at = 0; at < n; ++at) {
    if (!is_tensor[at] && updated[at] != 0.0f) {
      return Fail("padding element " + std::to_string(at) + " is not zero");
    }
  }
  if (absl::Status s = (*job)->Delete(); !s.ok()) return Fail("Delete", s);
  std::printf("train_one_step: step 1 updated %llu weights as expected (%s)\n",
              static_cast<unsigned long long>(checked),
              std::string(depot::DTypeName(config.weight_dtype)).c_str());
  return 0;
}
