// depot-train-mlp: trains a small MLP with Depot as its optimizer (AdamW on the
// servers). Run one process per worker against the same servers:
//
//   depot-train-mlp --servers=h1:50051,h2:50051 --num_workers=2 --worker_rank=0
//   depot-train-mlp --servers=h1:50051,h2:50051 --num_workers=2 --worker_rank=1
//
// The task is regression onto a fixed random "teacher" MLP of the same shape,
// with fresh synthetic inputs every step, so the loss must fall. The model is
// 512 -> 1536 -> 1536 -> 16 (about 3.2 M parameters), forward and backward in
// plain C++ on the CPU.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "depot/client.h"
#include "depot/flags_usage.h"
#include "mlp.h"

ABSL_FLAG(std::vector<std::string>, servers,
          std::vector<std::string>({"127.0.0.1:50051", "127.0.0.1:50052"}),
          "Comma-separated host:port of the depot-server processes, in the "
          "same order for every worker");
ABSL_FLAG(uint32_t, num_workers, 2, "Data-parallel workers taking part");
ABSL_FLAG(uint32_t, worker_rank, 0, "This worker's rank, 0 .. num_workers - 1");
ABSL_FLAG(uint64_t, steps, 30, "Training steps to run");
ABSL_FLAG(uint32_t, batch_size, 32, "Samples per step on this worker");
ABSL_FLAG(double, lr, 1e-3, "AdamW learning rate");
ABSL_FLAG(std::string, job_name, "demo-mlp",
          "Depot job name; every worker of the run must use the same one");
ABSL_FLAG(uint64_t, seed, 1,
          "Seed of the initial weights and of the teacher (the same for every "
          "worker); each worker's data stream also mixes in its rank");

namespace depot::examples {
namespace {

const std::vector<size_t> kWidths = {512, 1536, 1536, 16};
constexpr double kWeightDecay = 0.01;
constexpr uint64_t kChunkElems = uint64_t{1}
                                 << 16;  // ~20 chunks: a real pipeline
constexpr uint64_t kTeacherSeedSalt = 0x7eac4e7;
constexpr uint64_t kDataSeedSalt = 0xda7a;

// Every worker initialises the job with the same weights: no worker can tell
// when another's init has finished (there is no side channel, and the example
// does not sleep). A server refuses init for a chunk once a step-1 gradient of
// a peer is pending on it (FAILED_PRECONDITION); that peer finished its own
// init before stepping, so the weights are in place and this worker can go on.
// A job that has already applied steps, left by an earlier run under the same
// name, refuses too; its step count tells the two apart.
absl::Status InitOrJoin(Job& job, const std::vector<float>& weights) {
  absl::Status init = job.InitWeights(weights.data(), DType::kFloat32);
  if (!absl::IsFailedPrecondition(init)) return init;
  absl::StatusOr<std::vector<ServerJobStatus>> statuses = job.Status(false);
  if (!statuses.ok()) return statuses.status();
  for (const ServerJobStatus& status : *statuses) {
    if (status.step > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job \"", job.config().name, "\" has already been trained to step ",
          status.step, " on ", status.server,
          ": pass another --job_name or restart the servers"));
    }
  }
  return absl::OkStatus();
}

// Fills `input` with standard-normal samples and `target` with the teacher's
// answers to them.
void DrawBatch(const Mlp& model, const std::vector<float>& teacher,
               size_t batch, std::mt19937_64& rng, std::vector<float>* input,
               std::vector<float>* target) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  input->resize(batch * model.input_width());
  for (float& x : *input) x = normal(rng);
  Mlp::Activations acts;
  model.Forward(teacher.data(), input->data(), batch, &acts);
  *target = acts.values.back();
}

// Returns this worker's mean squared error and writes the gradient to send.
//
// Gradient convention: Depot sums the W workers' gradients, so each worker
// sends (1/W) * d(its own mean loss)/d(output). With equal batch sizes the sum
// is then the gradient of the mean loss over the global batch of W * batch
// samples.
double MseLossAndGrad(const std::vector<float>& prediction,
                      const std::vector<float>& target, uint32_t num_workers,
                      std::vector<float>* output_grad) {
  const double count = static_cast<double>(prediction.size());
  const float scale = static_cast<float>(2.0 / (count * num_workers));
  output_grad->resize(prediction.size());
  double sum = 0.0;
  for (size_t k = 0; k < prediction.size(); ++k) {
    const float diff = prediction[k] - target[k];
    sum += static_cast<double>(diff) * diff;
    (*output_grad)[k] = scale * diff;
  }
  return sum / count;
}

absl::Status Train() {
  const uint32_t num_workers = absl::GetFlag(FLAGS_num_workers);
  const uint32_t rank = absl::GetFlag(FLAGS_worker_rank);
  const uint64_t steps = absl::GetFlag(FLAGS_steps);
  const size_t batch = absl::GetFlag(FLAGS_batch_size);
  const double lr = absl::GetFlag(FLAGS_lr);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  if (steps == 0 || batch == 0) {
    return absl::InvalidArgumentError("--steps and --batch_size must be > 0");
  }

  ClientOptions options;
  options.servers = absl::GetFlag(FLAGS_servers);
  // This process is the trainer's own: let Depot tune malloc so that gRPC's
  // receive buffers are reused (a third less CPU per transfer; opt-in, as it
  // applies to the whole process).
  options.retain_transport_buffers = true;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) return client.status();
  absl::Status up = (*client)->WaitForServers(absl::Seconds(30));
  if (!up.ok()) return up;

  JobConfig config;
  config.name = absl::GetFlag(FLAGS_job_name);
  config.tensors = MlpTensors(kWidths);
  config.num_workers = num_workers;
  config.optimizer.kind = OptimizerKind::kAdamW;
  config.optimizer.lr = lr;
  config.optimizer.weight_decay = kWeightDecay;
  config.chunk_elems = kChunkElems;
  absl::StatusOr<std::unique_ptr<Job>> job = (*client)->OpenJob(config, rank);
  if (!job.ok()) return job.status();

  const Mlp model(kWidths, (*job)->layout());
  const uint64_t n = (*job)->total_elems();
  // scripts/demo.sh reads this line to check the servers' byte counters.
  absl::PrintF("[worker %d] job %s: %d elements, %d gradient bytes each\n",
               rank, config.name, n, DTypeSize(config.grad_dtype));
  std::vector<float> weights(n, 0.0f);
  std::vector<float> teacher(n, 0.0f);
  model.InitParams(seed, weights.data());
  model.InitParams(seed ^ kTeacherSeedSalt, teacher.data());
  absl::Status init = InitOrJoin(**job, weights);
  if (!init.ok()) return init;

  // Biases are not decayed: the group override shows per-step hyperparameters
  // (a schedule would change lr here; every worker passes the same list).
  StepOptions step_options;
  step_options.group_hparams = {{kWeightGroup, lr, kWeightDecay},
                                {kBiasGroup, lr, 0.0}};
  std::mt19937_64 data_rng(seed ^ (kDataSeedSalt * (uint64_t{rank} + 1)));
  std::vector<float> input, target, output_grad, grads(n);
  Mlp::Activations acts;
  double first_loss = 0.0;
  double loss = 0.0;
  for (uint64_t step = 1; step <= steps; ++step) {
    const absl::Time start = absl::Now();
    DrawBatch(model, teacher, batch, data_rng, &input, &target);
    model.Forward(weights.data(), input.data(), batch, &acts);
    loss =
        MseLossAndGrad(acts.values.back(), target, num_workers, &output_grad);
    std::fill(grads.begin(), grads.end(), 0.0f);
    model.Backward(weights.data(), output_grad.data(), acts, grads.data());
    StepResult result;
    absl::Status stepped =
        (*job)->Step(step, grads.data(), weights.data(), &result, step_options);
    if (!stepped.ok()) return stepped;
    if (step == 1) first_loss = loss;
    // The progress line: Step is synchronous, so all of its time is what the
    // trainer waited on Depot (exposed), beside the bytes moved and the
    // servers' update time.
    absl::PrintF(
        "[worker %d] step %d loss %.6f step_seconds %.4f depot_seconds %.4f "
        "sent_mb %.2f received_mb %.2f server_update_seconds %.4f\n",
        rank, step, loss, absl::ToDoubleSeconds(absl::Now() - start),
        result.wall_seconds, result.bytes_sent / 1e6,
        result.bytes_received / 1e6, result.update_seconds);
    std::fflush(stdout);
  }
  absl::PrintF("[worker %d] final loss %.6f (first %.6f)\n", rank, loss,
               first_loss);
  if (!(loss < first_loss)) {
    return absl::InternalError("the loss did not fall");
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace depot::examples

int main(int argc, char** argv) {
  depot::SetFlagsUsage(
      "examples/train_mlp.cc",
      "Trains a small MLP against a random teacher with Depot as the "
      "optimizer.\n"
      "Run one process per worker (--worker_rank 0 .. --num_workers - 1) "
      "against\n"
      "the same --servers.");
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = depot::examples::Train();
  if (!status.ok()) {
    std::fprintf(stderr, "depot-train-mlp: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
