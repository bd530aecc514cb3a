// ClientTraining: W workers training one job through the real client library,
// the way W trainer processes would: each worker has its own Client and Job
// (Client::OpenJob with its rank) and runs its steps on its own thread.
#ifndef DEPOT_TESTS_INTEGRATION_CLIENT_TRAINING_H_
#define DEPOT_TESTS_INTEGRATION_CLIENT_TRAINING_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "depot/client.h"

namespace depot::testing {

// What one worker saw over a run of steps.
struct WorkerOutcome {
  absl::Status status;              // the first failed Step's, else OK
  std::vector<StepResult> results;  // one per step that succeeded
  std::string last_weights;         // weights_out of the last successful step
};

class ClientTraining {
 public:
  // Connects one client per worker to `servers`, waits for them to be SERVING
  // and opens the job as each rank. config.num_workers sets W.
  static absl::StatusOr<std::unique_ptr<ClientTraining>> Open(
      const std::vector<std::string>& servers, const JobConfig& config,
      absl::Duration step_timeout = absl::Minutes(2),
      int connections_per_server = ClientOptions().connections_per_server,
      absl::Duration unavailable_retry = ClientOptions().unavailable_retry);

  // Rank 0 initialises the job with MakeInitialWeights(seed) in `dtype`.
  absl::Status InitWeights(uint64_t seed, DType dtype);

  // Steps first..last on every worker in `ranks` concurrently, one thread per
  // worker, with MakeGradients(seed, step, rank) and StepHyperParams(step).
  // Returns once every thread is done; outcomes are in the order of `ranks`.
  std::vector<WorkerOutcome> RunSteps(uint64_t seed, uint64_t first,
                                      uint64_t last,
                                      const std::vector<uint32_t>& ranks);
  // The same with every rank 0..W-1.
  std::vector<WorkerOutcome> RunSteps(uint64_t seed, uint64_t first,
                                      uint64_t last);

  // RunSteps on every rank: the first failed worker's error (in rank order),
  // else rank 0's weights after step `last`.
  absl::StatusOr<std::string> Train(uint64_t seed, uint64_t first,
                                    uint64_t last);

  // One step of one worker on the calling thread.
  WorkerOutcome RunStep(uint64_t seed, uint64_t step, uint32_t rank);

  // Pulls all N master weights as fp32 through rank 0's job.
  absl::StatusOr<std::vector<float>> PullMaster();

  // Each server's state checksum, in server order.
  absl::StatusOr<std::vector<uint64_t>> StateChecksums();

  Job& job(uint32_t rank) { return *jobs_[rank]; }
  const Layout& layout() const { return jobs_[0]->layout(); }

 private:
  ClientTraining() = default;

  std::vector<std::unique_ptr<Client>> clients_;
  std::vector<std::unique_ptr<Job>> jobs_;
};

// One worker's Step running on its own thread, for tests that act on the
// servers while the step waits for them.
class BackgroundStep {
 public:
  // Starts ClientTraining::RunStep(seed, step, rank). `training` must outlive
  // this object.
  BackgroundStep(ClientTraining& training, uint64_t seed, uint64_t step,
                 uint32_t rank);
  BackgroundStep(const BackgroundStep&) = delete;
  BackgroundStep& operator=(const BackgroundStep&) = delete;
  // Joins the thread (the step must be able to end: kill its servers first
  // when unsure).
  ~BackgroundStep();

  // Waits for the step to end and returns what the worker saw.
  const WorkerOutcome& Join();

 private:
  WorkerOutcome outcome_;
  std::thread thread_;
};

}  // namespace depot::testing

#endif  // DEPOT_TESTS_INTEGRATION_CLIENT_TRAINING_H_
