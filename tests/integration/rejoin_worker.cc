#include "rejoin_worker.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "depot/dtype.h"
#include "training_data.h"

namespace depot::testing {

JobConfig RejoinJobConfig(std::string name) {
  return LargeJobConfig(std::move(name), DType::kFloat32, DType::kBFloat16,
                        /*num_workers=*/2);
}

std::string CoupledGradients(const Layout& layout,
                             const std::vector<float>& weights, uint64_t seed,
                             uint64_t step, uint32_t rank) {
  const uint64_t n = layout.total_elems();
  const std::string data =
      MakeGradients(layout, DType::kFloat32, seed, step, rank);
  const float* d = reinterpret_cast<const float*>(data.data());
  double sum = 0.0;
  for (uint64_t i = 0; i < n; ++i) sum += weights[i];
  const float coupling = static_cast<float>(sum / static_cast<double>(n)) / 64;
  std::string grads(n * sizeof(float), '\0');
  float* g = reinterpret_cast<float*>(grads.data());
  for (uint64_t i = 0; i < n; ++i) {
    g[i] = (weights[i] - d[i]) * 0.5f + coupling;
  }
  return grads;
}

namespace {

// N weights of the job's weight dtype, widened to fp32.
std::vector<float> Widen(const Job& job, const std::string& weights) {
  std::vector<float> wide(job.total_elems());
  ConvertToFloat(job.config().weight_dtype, weights.data(), wide.data(),
                 wide.size());
  return wide;
}

// The oldest step the servers report (each one's in *server_steps) and the
// weights of that step.
absl::Status ReadStatusAndPull(Job& job, uint64_t seed, uint64_t* resumed_from,
                               std::vector<uint64_t>* server_steps,
                               std::vector<float>* weights) {
  absl::StatusOr<std::vector<ServerJobStatus>> status = job.Status(false);
  if (!status.ok()) return status.status();
  uint64_t oldest = status->front().step;
  server_steps->clear();
  for (const ServerJobStatus& server : *status) {
    oldest = std::min(oldest, server.step);
    server_steps->push_back(server.step);
  }
  *resumed_from = oldest;
  if (oldest == 0) {
    const std::string initial =
        MakeInitialWeights(job.layout(), DType::kFloat32, seed);
    const float* values = reinterpret_cast<const float*>(initial.data());
    weights->assign(values, values + job.total_elems());
    return absl::OkStatus();
  }
  std::string pulled(job.total_elems() * DTypeSize(job.config().weight_dtype),
                     '\0');
  if (absl::Status s = job.Pull(0, job.total_elems(), job.config().weight_dtype,
                                pulled.data(), oldest);
      !s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("pull at step ", oldest, ": ", s.message()));
  }
  *weights = Widen(job, pulled);
  return absl::OkStatus();
}

}  // namespace

absl::Status RejoinAndTrain(Job& job, uint64_t seed, uint64_t last_step,
                            const std::function<void(uint64_t)>& before_step,
                            uint64_t* resumed_from,
                            std::vector<uint64_t>* server_steps) {
  std::vector<float> weights;
  if (absl::Status s =
          ReadStatusAndPull(job, seed, resumed_from, server_steps, &weights);
      !s.ok()) {
    return s;
  }
  std::string out(job.total_elems() * DTypeSize(job.config().weight_dtype),
                  '\0');
  for (uint64_t step = *resumed_from + 1; step <= last_step; ++step) {
    const std::string grads =
        CoupledGradients(job.layout(), weights, seed, step, job.worker_rank());
    StepOptions options;
    options.group_hparams = StepHyperParams(step);
    if (before_step) before_step(step);
    absl::Status s;
    // A restarted worker's first step may find its killed predecessor's
    // stream not yet closed on a server (ALREADY_EXISTS): the server notices
    // the dead connection within moments.
    for (int attempt = 0; attempt < 100; ++attempt) {
      s = job.Step(step, grads.data(), out.data(), nullptr, options);
      if (s.code() != absl::StatusCode::kAlreadyExists) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("step ", step, ": ", s.message()));
    }
    weights = Widen(job, out);
  }
  return absl::OkStatus();
}

}  // namespace depot::testing
