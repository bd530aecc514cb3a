#include "client_training.h"

#include <thread>
#include <utility>

#include "absl/memory/memory.h"
#include "training_data.h"

namespace depot::testing {

absl::StatusOr<std::unique_ptr<ClientTraining>> ClientTraining::Open(
    const std::vector<std::string>& servers, const JobConfig& config,
    absl::Duration step_timeout, int connections_per_server,
    absl::Duration unavailable_retry) {
  auto training = absl::WrapUnique(new ClientTraining());
  for (uint32_t rank = 0; rank < config.num_workers; ++rank) {
    ClientOptions options;
    options.servers = servers;
    options.step_timeout = step_timeout;
    options.connections_per_server = connections_per_server;
    options.unavailable_retry = unavailable_retry;
    absl::StatusOr<std::unique_ptr<Client>> client =
        Client::Connect(std::move(options));
    if (!client.ok()) return client.status();
    if (absl::Status s = (*client)->WaitForServers(absl::Seconds(30));
        !s.ok()) {
      return s;
    }
    absl::StatusOr<std::unique_ptr<Job>> job = (*client)->OpenJob(config, rank);
    if (!job.ok()) return job.status();
    training->clients_.push_back(*std::move(client));
    training->jobs_.push_back(*std::move(job));
  }
  return training;
}

absl::Status ClientTraining::InitWeights(uint64_t seed, DType dtype) {
  const std::string weights = MakeInitialWeights(layout(), dtype, seed);
  return jobs_[0]->InitWeights(weights.data(), dtype);
}

WorkerOutcome ClientTraining::RunStep(uint64_t seed, uint64_t step,
                                      uint32_t rank) {
  WorkerOutcome outcome;
  Job& job = *jobs_[rank];
  const std::string grads =
      MakeGradients(layout(), job.config().grad_dtype, seed, step, rank);
  std::string weights(job.total_elems() * DTypeSize(job.config().weight_dtype),
                      '\0');
  StepResult result;
  StepOptions options;
  options.group_hparams = StepHyperParams(step);
  outcome.status =
      job.Step(step, grads.data(), weights.data(), &result, options);
  if (outcome.status.ok()) {
    outcome.results.push_back(result);
    outcome.last_weights = std::move(weights);
  }
  return outcome;
}

std::vector<WorkerOutcome> ClientTraining::RunSteps(
    uint64_t seed, uint64_t first, uint64_t last,
    const std::vector<uint32_t>& ranks) {
  std::vector<WorkerOutcome> outcomes(ranks.size());
  std::vector<std::thread> workers;
  for (size_t i = 0; i < ranks.size(); ++i) {
    workers.emplace_back(
        [this, seed, first, last, rank = ranks[i], outcome = &outcomes[i]] {
          for (uint64_t step = first; step <= last; ++step) {
            WorkerOutcome one = RunStep(seed, step, rank);
            outcome->status = one.status;
            if (!one.status.ok()) return;
            outcome->results.push_back(one.results.front());
            outcome->last_weights = std::move(one.last_weights);
          }
        });
  }
  for (std::thread& worker : workers) worker.join();
  return outcomes;
}

std::vector<WorkerOutcome> ClientTraining::RunSteps(uint64_t seed,
                                                    uint64_t first,
                                                    uint64_t last) {
  std::vector<uint32_t> ranks;
  for (uint32_t rank = 0; rank < jobs_.size(); ++rank) ranks.push_back(rank);
  return RunSteps(seed, first, last, ranks);
}

absl::StatusOr<std::string> ClientTraining::Train(uint64_t seed,
                                                  uint64_t first,
                                                  uint64_t last) {
  std::vector<WorkerOutcome> outcomes = RunSteps(seed, first, last);
  for (const WorkerOutcome& outcome : outcomes) {
    if (!outcome.status.ok()) return outcome.status;
  }
  return std::move(outcomes[0].last_weights);
}

absl::StatusOr<std::vector<float>> ClientTraining::PullMaster() {
  std::vector<float> master(jobs_[0]->total_elems());
  if (absl::Status s =
          jobs_[0]->Pull(0, master.size(), DType::kFloat32, master.data());
      !s.ok()) {
    return s;
  }
  return master;
}

absl::StatusOr<std::vector<uint64_t>> ClientTraining::StateChecksums() {
  absl::StatusOr<std::vector<ServerJobStatus>> statuses =
      jobs_[0]->Status(/*with_checksum=*/true);
  if (!statuses.ok()) return statuses.status();
  std::vector<uint64_t> checksums;
  for (const ServerJobStatus& status : *statuses) {
    checksums.push_back(status.state_checksum);
  }
  return checksums;
}

BackgroundStep::BackgroundStep(ClientTraining& training, uint64_t seed,
                               uint64_t step, uint32_t rank)
    : thread_([this, &training, seed, step, rank] {
        outcome_ = training.RunStep(seed, step, rank);
      }) {}

BackgroundStep::~BackgroundStep() {
  if (thread_.joinable()) thread_.join();
}

const WorkerOutcome& BackgroundStep::Join() {
  if (thread_.joinable()) thread_.join();
  return outcome_;
}

}  // namespace depot::testing
