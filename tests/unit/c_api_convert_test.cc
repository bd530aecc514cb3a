// The C API's conversions (client/src/c_api_convert.h) keep every field of a
// job's config: each field, changed alone (job_config_mutations.h), comes
// back from depot_job_config_t as it went in. A field a conversion forgets
// comes back as its default, and the test names it.
#include "c_api_convert.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/job_config_mutations.h"

namespace depot::c_api {
namespace {

// What a C caller would fill in for `config`, field by field (the C struct
// has no num_servers: that is the client's). `tensors` and `groups` hold the
// arrays it points to.
depot_job_config_t JobToC(const JobConfig& config,
                          std::vector<depot_tensor_spec_t>* tensors,
                          std::vector<depot_optimizer_config_t>* groups) {
  depot_job_config_t c;
  depot_job_config_init(&c);
  c.name = config.name.c_str();
  for (const TensorSpec& tensor : config.tensors) {
    tensors->push_back({tensor.name.c_str(), tensor.numel, tensor.param_group});
  }
  c.tensors = tensors->data();
  c.num_tensors = tensors->size();
  c.num_workers = config.num_workers;
  c.optimizer = ToC(config.optimizer);
  c.grad_dtype = static_cast<int32_t>(config.grad_dtype);
  c.weight_dtype = static_cast<int32_t>(config.weight_dtype);
  c.chunk_elems = config.chunk_elems;
  c.alignment_elems = config.alignment_elems;
  for (const OptimizerConfig& group : config.group_optimizers) {
    groups->push_back(ToC(group));
  }
  c.group_optimizers = groups->data();
  c.num_group_optimizers = groups->size();
  c.checkpoint_every_steps = config.checkpoint_every_steps;
  return c;
}

TEST(CApiConvertTest, EveryFieldChangedAloneSurvivesTheRoundTrip) {
  testing::ExpectEveryFieldSurvives(
      [](const JobConfig& config) -> absl::StatusOr<JobConfig> {
        std::vector<depot_tensor_spec_t> tensors;
        std::vector<depot_optimizer_config_t> groups;
        absl::StatusOr<JobConfig> back =
            FromC(JobToC(config, &tensors, &groups));
        if (back.ok()) back->num_servers = config.num_servers;  // not in C
        return back;
      });
}

}  // namespace
}  // namespace depot::c_api
