#include "worker_steps.h"

#include <thread>

#include "training_data.h"

namespace depot::testing {

std::vector<WorkerOutcome> StepWorkers(ClientTraining& training, uint64_t step,
                                       const std::vector<std::string>& grads,
                                       const StepOptions& options,
                                       std::vector<uint32_t> ranks) {
  if (ranks.empty()) {
    for (uint32_t rank = 0; rank < grads.size(); ++rank) ranks.push_back(rank);
  }
  std::vector<WorkerOutcome> outcomes(ranks.size());
  std::vector<std::thread> workers;
  for (size_t i = 0; i < ranks.size(); ++i) {
    workers.emplace_back([&, i] {
      Job& job = training.job(ranks[i]);
      std::string weights(
          job.total_elems() * DTypeSize(job.config().weight_dtype), '\0');
      StepResult result;
      WorkerOutcome& outcome = outcomes[i];
      outcome.status = job.Step(step, grads[ranks[i]].data(), weights.data(),
                                &result, options);
      if (outcome.status.ok()) {
        outcome.results.push_back(result);
        outcome.last_weights = std::move(weights);
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
  return outcomes;
}

std::vector<std::string> StandardGradients(const JobConfig& config,
                                           uint64_t seed, uint64_t step) {
  const Layout layout = *Layout::Create(config.tensors, config.alignment_elems);
  std::vector<std::string> grads;
  for (uint32_t rank = 0; rank < config.num_workers; ++rank) {
    grads.push_back(MakeGradients(layout, config.grad_dtype, seed, step, rank));
  }
  return grads;
}

}  // namespace depot::testing
