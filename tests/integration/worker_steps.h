// Runs one training step on every worker of a ClientTraining at once, with
// gradients and StepOptions the test chooses (ClientTraining::RunSteps uses
// the standard inputs and options).
#ifndef DEPOT_TESTS_INTEGRATION_WORKER_STEPS_H_
#define DEPOT_TESTS_INTEGRATION_WORKER_STEPS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "client_training.h"
#include "depot/client.h"

namespace depot::testing {

// Worker r runs Job::Step(step, grads[r], ..., options) on its own thread, for
// every r in `ranks` (all workers when empty). Outcomes are in rank order of
// `ranks`.
std::vector<WorkerOutcome> StepWorkers(ClientTraining& training, uint64_t step,
                                       const std::vector<std::string>& grads,
                                       const StepOptions& options,
                                       std::vector<uint32_t> ranks = {});

// Every worker's MakeGradients(seed, step, rank) in the job's grad dtype.
std::vector<std::string> StandardGradients(const JobConfig& config,
                                           uint64_t seed, uint64_t step);

}  // namespace depot::testing

#endif  // DEPOT_TESTS_INTEGRATION_WORKER_STEPS_H_
