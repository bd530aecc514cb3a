// A worker of the rejoin test (rejoin_test.cc): it trains a model whose
// gradient depends on the whole model's weights, as a real one does, and it
// starts the way a restarted trainer does: it reads the job's status, pulls
// the weights at the oldest step the servers report (Job::Pull at a step)
// and goes on from the step after it. The test runs it in-process (the
// uninterrupted run) and as the depot_rejoin_worker process that it kills
// with SIGKILL.
#ifndef DEPOT_TESTS_INTEGRATION_REJOIN_WORKER_H_
#define DEPOT_TESTS_INTEGRATION_REJOIN_WORKER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "depot/client.h"

namespace depot::testing {

// The job the rejoin test trains: LargeJobConfig (17 chunks, two servers)
// with fp32 gradients, bf16 weights (what a restarted worker pulls, and what
// the servers keep of the step before), two workers.
JobConfig RejoinJobConfig(std::string name);

// Worker `rank`'s gradient of `step` at `weights` (N values, widened to
// fp32): g_i = (w_i - d_i) / 2 + mean(w) / 64, with d = MakeGradients(seed,
// step, rank). The mean couples every chunk to every other, so a gradient
// computed from weights of two different steps differs from the true one
// everywhere.
std::string CoupledGradients(const Layout& layout,
                             const std::vector<float>& weights, uint64_t seed,
                             uint64_t step, uint32_t rank);

// Reads the job's status and resumes after the oldest step t the servers
// report: the weights of t pulled at t from every server (t = 0: the initial
// weights every worker sends, MakeInitialWeights(seed)), then steps t + 1 ..
// `last_step` with CoupledGradients and StepHyperParams. `before_step(step)`
// runs just before each Job::Step. Sets *resumed_from to t and
// *server_steps to each server's step then (GetJob's), in server order.
absl::Status RejoinAndTrain(Job& job, uint64_t seed, uint64_t last_step,
                            const std::function<void(uint64_t)>& before_step,
                            uint64_t* resumed_from,
                            std::vector<uint64_t>* server_steps);

}  // namespace depot::testing

#endif  // DEPOT_TESTS_INTEGRATION_REJOIN_WORKER_H_
