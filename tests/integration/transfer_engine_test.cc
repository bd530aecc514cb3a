// The GPU transfer engine (client/src/gpu/transfer_engine.h) on HostDevice
// and HostCollective, against real depot-server processes: node workers of
// several local ranks give bit for bit the weights of the same job run by
// one process per node through Job::Step, and deliberate engine bugs
// (EngineFaults) are caught by the HostDevice's checks or by that comparison.
#include "gpu/transfer_engine.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "depot/client.h"
#include "gpu/device_optimizer.h"
#include "gpu/host_collective.h"
#include "gpu/host_device.h"
#include "gtest/gtest.h"
#include "server/tests/temp_dir.h"
#include "training_data.h"
#include "two_servers.h"

namespace depot::testing {
namespace {

using gpu::EngineFaults;
using gpu::HostCollectiveGroup;
using gpu::HostDevice;
using gpu::TransferEngine;
using gpu::TransferEngineOptions;

constexpr uint64_t kSeed = 11;
constexpr uint64_t kSteps = 3;
// The largest step a job may reach (2^62, server/shard_state.h kMaxStep).
constexpr uint64_t kMaxStepForTests = uint64_t{1} << 62;

// Local rank g of node n's gradient at `step`: fp32, N elements.
std::vector<float> LocalGradient(const Layout& layout, uint64_t step,
                                 uint32_t node, uint32_t local_rank,
                                 uint32_t local_ranks) {
  const std::string bytes = MakeGradients(layout, DType::kFloat32, kSeed, step,
                                          node * local_ranks + local_rank);
  std::vector<float> values(layout.total_elems());
  std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

// The node's contribution: its local gradients summed in fp32, rank order
// (what HostCollective's reduce-scatter computes).
std::vector<float> NodeGradient(const Layout& layout, uint64_t step,
                                uint32_t node, uint32_t local_ranks) {
  std::vector<float> sum = LocalGradient(layout, step, node, 0, local_ranks);
  for (uint32_t g = 1; g < local_ranks; ++g) {
    const std::vector<float> part =
        LocalGradient(layout, step, node, g, local_ranks);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = sum[i] + part[i];
  }
  return sum;
}

struct RankRun {
  absl::Status status;
  // Per step, the weights (weight dtype bytes, N elements) the rank's
  // forward would read after WaitWeights of every bucket.
  std::vector<std::string> weights;
  std::vector<std::string> violations;
  uint64_t compute_waits = 0;
  uint64_t wait_weights_calls = 0;
  uint64_t pinned_bytes = 0;
  uint64_t chunk_bytes = 0;
  std::vector<StepResult> results;  // FinishStep's, per step
  // The kept state's sends into the servers' captures, as reported: by
  // FinishStep, then WaitCaptures after the last step.
  std::vector<gpu::CaptureReport> captures;
  std::vector<uint32_t> gpu_tensors;
  uint64_t gpu_state_bytes = 0;
  // With an offload fraction, after the last step: the servers' state with
  // ReadGpuState's over it (every local rank reads it, a collective).
  FlatState state;
};

// The engine's view of `state`'s arrays.
gpu::StateArrays ArraysOf(FlatState& state) {
  gpu::StateArrays arrays;
  arrays.master = state.master.data();
  for (size_t k = 0; k < state.slots.size(); ++k) {
    arrays.slots[k] = state.slots[k].data();
  }
  arrays.num_slots = state.slots.size();
  arrays.tensor_steps = state.tensor_steps.data();
  arrays.applied_step = state.applied_step;
  return arrays;
}

class TransferEngineTest : public TwoServers {
 protected:
  // Every step's options, for both runs (none by default).
  std::function<StepOptions(uint64_t step)> step_options_ =
      [](uint64_t) { return StepOptions(); };

  // Initialises job `config`, then runs body(job, node) for every node of
  // it at once, each on its own thread with its own client; expects every
  // one to succeed.
  void RunNodes(const JobConfig& config,
                const std::function<absl::Status(Job& job, uint32_t node)>&
                    body) {
    if (!InitJob(config)) return;
    std::vector<std::thread> nodes;
    std::vector<absl::Status> statuses(config.num_workers);
    for (uint32_t n = 0; n < config.num_workers; ++n) {
      nodes.emplace_back([&, n] {
        ClientOptions options;
        options.servers = Addresses();
        auto client = Client::Connect(options);
        if (!client.ok()) {
          statuses[n] = client.status();
          return;
        }
        auto job = (*client)->OpenJob(config, n);
        statuses[n] = job.ok() ? body(**job, n) : job.status();
      });
    }
    for (std::thread& t : nodes) t.join();
    for (const absl::Status& s : statuses) EXPECT_TRUE(s.ok()) << s;
  }

  // The reference: every node one process calling Job::Step with the node's
  // summed gradient. Returns node 0's weights after each step; its state
  // after the last is in reference_state_.
  std::vector<std::string> ReferenceRun(JobConfig config, uint32_t local_ranks) {
    config.name += "-reference";
    std::vector<std::string> weights(kSteps);
    reference_states_.assign(kSteps, FlatState());
    RunNodes(config, [&](Job& job, uint32_t n) -> absl::Status {
      const Layout& layout = job.layout();
      const size_t wsize = DTypeSize(config.weight_dtype);
      for (uint64_t step = 1; step <= kSteps; ++step) {
        const std::vector<float> grads =
            NodeGradient(layout, step, n, local_ranks);
        std::string out(layout.total_elems() * wsize, '\0');
        if (absl::Status s = job.Step(step, grads.data(), out.data(), nullptr,
                                      step_options_(step));
            !s.ok()) {
          return s;
        }
        if (n == 0) weights[step - 1] = std::move(out);
        // One node: nothing else is in flight, the state is at `step`.
        if (config.num_workers == 1) {
          if (absl::Status s = ReadState(job, reference_states_[step - 1]);
              !s.ok()) {
            return s;
          }
        }
      }
      if (n > 0) return absl::OkStatus();
      return ReadState(job, reference_state_);
    });
    return weights;
  }

  static absl::Status ReadState(Job& job, FlatState& state) {
    absl::StatusOr<std::string> blob = job.SaveState();
    if (!blob.ok()) return blob.status();
    absl::StatusOr<FlatState> decoded = job.DecodeState(*blob);
    if (!decoded.ok()) return decoded.status();
    state = *std::move(decoded);
    return absl::OkStatus();
  }

  FlatState reference_state_;
  // A job of one node: its state after each step.
  std::vector<FlatState> reference_states_;

  // Opens `config` and sets its initial weights; false on failure.
  bool InitJob(const JobConfig& config) {
    ClientOptions options;
    options.servers = Addresses();
    auto client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return false;
    auto job = (*client)->OpenJob(config, 0);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return false;
    const std::string init =
        MakeInitialWeights((*job)->layout(), DType::kFloat32, kSeed);
    const absl::Status s = (*job)->InitWeights(init.data(), DType::kFloat32);
    EXPECT_TRUE(s.ok()) << s;
    return s.ok();
  }

  // config.num_workers nodes of `local_ranks` ranks, each rank one thread
  // with its own client, HostDevice and engine.
  std::vector<RankRun> EngineRun(JobConfig config, uint32_t local_ranks,
                                 TransferEngineOptions engine_options,
                                 HostDevice::Options device_options = {}) {
    config.name += "-engine";
    const uint32_t nodes = config.num_workers;
    std::vector<RankRun> runs(nodes * local_ranks);
    if (!InitJob(config)) return runs;
    std::vector<std::shared_ptr<HostCollectiveGroup>> groups;
    for (uint32_t n = 0; n < nodes; ++n) {
      groups.push_back(HostCollectiveGroup::Create(local_ranks));
    }
    std::vector<std::thread> threads;
    for (uint32_t n = 0; n < nodes; ++n) {
      for (uint32_t g = 0; g < local_ranks; ++g) {
        threads.emplace_back([&, n, g] {
          RankRun& run = runs[n * local_ranks + g];
          HostDevice device(device_options);
          std::unique_ptr<gpu::Collective> collective;
          if (local_ranks > 1) collective = groups[n]->Join(g, device);
          run.status = RunRank(config, n, g, local_ranks, engine_options,
                               device, collective.get(), run);
          run.violations = device.violations();
        });
      }
    }
    for (std::thread& t : threads) t.join();
    return runs;
  }

  absl::Status RunRank(const JobConfig& config, uint32_t node,
                       uint32_t local_rank, uint32_t local_ranks,
                       TransferEngineOptions engine_options, HostDevice& device,
                       gpu::Collective* collective, RankRun& run) {
    ClientOptions options;
    options.servers = Addresses();
    // Steps take milliseconds here. A deliberately broken engine can leave a
    // stream waiting on an error path (under load, see the issue 11 note);
    // it then fails by this deadline instead of the client's 5 minutes.
    options.step_timeout = absl::Seconds(30);
    auto client = Client::Connect(options);
    if (!client.ok()) return client.status();
    auto job = (*client)->OpenJob(config, node);
    if (!job.ok()) return job.status();
    engine_options.local_rank = local_rank;
    engine_options.local_ranks = local_ranks;
    std::unique_ptr<gpu::DeviceOptimizer> optimizer;
    if (engine_options.offload_fraction < 1.0) {
      auto made = gpu::MakeHostDeviceOptimizer(config, device);
      if (!made.ok()) return made.status();
      optimizer = *std::move(made);
      engine_options.device_optimizer = optimizer.get();
    }
    auto engine =
        TransferEngine::Create(**job, device, collective, engine_options);
    if (!engine.ok()) return engine.status();
    run.pinned_bytes = (*engine)->pinned_bytes();
    run.gpu_tensors = (*engine)->gpu_tensors();
    run.gpu_state_bytes = (*engine)->gpu_state_bytes();
    run.chunk_bytes = config.chunk_elems;
    auto compute = device.CreateStream();
    if (!compute.ok()) return compute.status();
    const Layout& layout = (*job)->layout();
    const uint64_t n = layout.total_elems();
    const uint64_t buckets = (*engine)->partition().num_buckets();
    const size_t wsize = DTypeSize(config.weight_dtype);
    auto snapshot = device.Allocate(n * wsize);
    if (!snapshot.ok()) return snapshot.status();
    for (uint64_t step = 1; step <= kSteps; ++step) {
      if (absl::Status s = (*engine)->BeginStep(step, step_options_(step));
          !s.ok()) {
        return s;
      }
      // "Backward": the gradient lands in the device buffer on the compute
      // stream, and the buckets are named last to first.
      const std::vector<float> grads =
          LocalGradient(layout, step, node, local_rank, local_ranks);
      if (absl::Status s = device.CopyAsync(
              **compute, (*engine)->grads(), grads.data(), n * sizeof(float),
              gpu::CopyKind::kHostToDevice);
          !s.ok()) {
        return s;
      }
      for (uint64_t b = buckets; b-- > 0;) {
        if (absl::Status s = (*engine)->GradientsReady(b, **compute);
            !s.ok()) {
          return s;
        }
      }
      // "Forward": each bucket's weights, first to last, read on the compute
      // stream right after its wait (a device-to-device copy, which the
      // HostDevice does not slow down) into a snapshot.
      for (uint64_t b = 0; b < buckets; ++b) {
        if (absl::Status s = (*engine)->WaitWeights(b, **compute); !s.ok()) {
          return s;
        }
        ++run.wait_weights_calls;
        const ChunkSpan span = (*engine)->partition().bucket(b);
        const uint64_t begin = span.first * config.chunk_elems;
        const uint64_t end = std::min(n, span.end * config.chunk_elems);
        if (absl::Status s = device.CopyAsync(
                **compute, static_cast<char*>((*snapshot)->data()) + begin * wsize,
                static_cast<const char*>((*engine)->weights()) + begin * wsize,
                (end - begin) * wsize, gpu::CopyKind::kDeviceToDevice);
            !s.ok()) {
          return s;
        }
      }
      std::string out(n * wsize, '\0');
      if (absl::Status s = device.CopyAsync(**compute, out.data(),
                                            (*snapshot)->data(), out.size(),
                                            gpu::CopyKind::kDeviceToHost);
          !s.ok()) {
        return s;
      }
      absl::StatusOr<StepResult> result = (*engine)->FinishStep();
      if (!result.ok()) return result.status();
      run.results.push_back(*result);
      if (result->capture_step != 0) {
        run.captures.push_back({result->capture_step, result->capture_chunks,
                                result->capture_error});
      }
      if (absl::Status s = device.SynchronizeStream(**compute); !s.ok()) {
        return s;
      }
      run.weights.push_back(std::move(out));
    }
    run.compute_waits = device.waits_queued(**compute);
    if (gpu::CaptureReport last = (*engine)->WaitCaptures(); last.step != 0) {
      run.captures.push_back(std::move(last));
    }
    if (engine_options.offload_fraction == 1.0) return absl::OkStatus();
    if (absl::Status s = ReadState(**job, run.state); !s.ok()) return s;
    if (absl::Status s = (*engine)->ReadGpuState(ArraysOf(run.state));
        !s.ok()) {
      return s;
    }
    // And into the servers' own arrays (each rank its part): the test reads
    // the servers' state alone once every rank is done.
    return (*engine)->StoreGpuState();
  }

 public:
  // The job `config` of EngineRun, opened as node 0 by a new client.
  absl::StatusOr<std::unique_ptr<Job>> OpenEngineJob(JobConfig config) {
    config.name += "-engine";
    ClientOptions options;
    options.servers = Addresses();
    auto client = Client::Connect(options);
    if (!client.ok()) return client.status();
    clients_.push_back(*std::move(client));
    return clients_.back()->OpenJob(config, 0);
  }

 private:
  std::vector<std::unique_ptr<Client>> clients_;
};

// The first element where two weight buffers differ, or "" when equal.
std::string FirstDifference(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) {
    return absl::StrCat("sizes ", a.size(), " and ", b.size());
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return absl::StrCat("byte ", i);
  }
  return "";
}

std::string Bytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(float));
}

TEST_F(TransferEngineTest, TwoNodesOfTwoRanksEqualTheOneProcessRunBitForBit) {
  for (const DType weight_dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(std::string(DTypeName(weight_dtype)));
    JobConfig config = SmallJobConfig(
        absl::StrCat("nodes-", std::string(DTypeName(weight_dtype))), 2, 2);
    config.weight_dtype = weight_dtype;
    const std::vector<std::string> reference = ReferenceRun(config, 2);
    TransferEngineOptions options;
    options.bucket_chunks = 4;  // the last bucket is padded with a phantom
    options.d2h_slots = 2;
    options.h2d_slots = 2;
    options.streams_per_server = 2;
    const std::vector<RankRun> runs = EngineRun(config, 2, options);
    ASSERT_EQ(runs.size(), 4u);
    for (size_t r = 0; r < runs.size(); ++r) {
      SCOPED_TRACE(absl::StrCat("node ", r / 2, " local rank ", r % 2));
      ASSERT_TRUE(runs[r].status.ok()) << runs[r].status;
      EXPECT_TRUE(runs[r].violations.empty())
          << absl::StrJoin(runs[r].violations, "\n");
      ASSERT_EQ(runs[r].weights.size(), kSteps);
      for (uint64_t s = 0; s < kSteps; ++s) {
        EXPECT_EQ(FirstDifference(runs[r].weights[s], reference[s]), "")
            << "step " << s + 1;
      }
      // The compute stream waited only where the trainer asked it to.
      EXPECT_EQ(runs[r].compute_waits, runs[r].wait_weights_calls);
      // Pinned memory: 2 + 2 slots of one chunk each.
      EXPECT_EQ(runs[r].pinned_bytes,
                2 * config.chunk_elems * 4 +
                    2 * config.chunk_elems * DTypeSize(weight_dtype));
    }
  }
}

// A config that clips runs two phases: every rank opens a stream to every
// server, also where it owns no chunk (bucket_chunks 16 gives local rank 1
// no chunk of server 0), receives each server's GradStats and commits; the
// weights equal the one-process run's bit for bit.
TEST_F(TransferEngineTest, TwoPhaseClippedStepsEqualTheOneProcessRunBitForBit) {
  for (const uint64_t bucket_chunks : {uint64_t{4}, uint64_t{16}}) {
    SCOPED_TRACE(absl::StrCat("bucket_chunks ", bucket_chunks));
    JobConfig config =
        SmallJobConfig(absl::StrCat("clip-", bucket_chunks), 2, 2);
    config.optimizer.clip_grad = 0.5;  // the summed gradients' norm is ~4
    const std::vector<std::string> reference = ReferenceRun(config, 2);
    TransferEngineOptions options;
    options.bucket_chunks = bucket_chunks;
    const std::vector<RankRun> runs = EngineRun(config, 2, options);
    for (size_t r = 0; r < runs.size(); ++r) {
      SCOPED_TRACE(absl::StrCat("node ", r / 2, " local rank ", r % 2));
      ASSERT_TRUE(runs[r].status.ok()) << runs[r].status;
      EXPECT_TRUE(runs[r].violations.empty())
          << absl::StrJoin(runs[r].violations, "\n");
      ASSERT_EQ(runs[r].weights.size(), kSteps);
      for (uint64_t s = 0; s < kSteps; ++s) {
        EXPECT_EQ(FirstDifference(runs[r].weights[s], reference[s]), "")
            << "step " << s + 1;
      }
      for (const StepResult& result : runs[r].results) {
        EXPECT_TRUE(result.two_phase);
        EXPECT_LT(result.clip_coef, 1.0);  // the step did clip
        EXPECT_GT(result.grad_norm, 0.5);
      }
    }
  }
}

// The offload fraction: half the parameters' optimizer stays on the GPU
// (tensors chosen from the last), one node and two, each of 1 and of 2 local
// ranks (with two nodes the servers sum the kept tensors' gradients and send
// the sums back: sum-only tensors), a per-group lr and weight decay
// schedule, and at step 2 a kept tensor without a gradient: every step's
// weights equal bit for bit those of the same job with everything on the
// servers. A static loss scale, and also clipped by the global norm
// (two-phase steps: the servers' norm covers the kept tensors, whose sums
// come back unscaled, with the decision), where every step must clip.
// Bit for bit: master weights, every slot and every tensor's step count.
void ExpectSameState(const FlatState& got, const FlatState& want,
                     const char* what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(got.tensor_steps, want.tensor_steps);
  EXPECT_EQ(FirstDifference(Bytes(got.master), Bytes(want.master)), "")
      << "master weights";
  ASSERT_EQ(got.slots.size(), want.slots.size());
  for (size_t k = 0; k < got.slots.size(); ++k) {
    EXPECT_EQ(FirstDifference(Bytes(got.slots[k]), Bytes(want.slots[k])), "")
        << "slot " << k;
  }
}

// StoreGpuState (every rank of every node stored its part after the last
// step, RunRank): the servers' state alone is now the whole job's, bit for bit
// the fully offloaded run's, so that the servers' checkpoints hold it. Then,
// with one local rank, an engine made anew on the job (its kept state
// missing: BeginStep refused) restores it from the servers: the state read
// through it is again the reference's. Both fail without the store (the
// servers' arrays hold the initial master weights and zero slots there).
void ExpectStoredStateIsWhole(TransferEngineTest& test, const JobConfig& config,
                              TransferEngineOptions options,
                              uint32_t local_ranks, const FlatState& want) {
  absl::StatusOr<std::unique_ptr<Job>> job = test.OpenEngineJob(config);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<std::string> blob = (*job)->SaveState();
  ASSERT_TRUE(blob.ok()) << blob.status();
  absl::StatusOr<FlatState> decoded = (*job)->DecodeState(*blob);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ExpectSameState(*decoded, want, "the servers' state after StoreGpuState");
  if (local_ranks != 1) return;
  HostDevice device;
  auto optimizer = gpu::MakeHostDeviceOptimizer(config, device);
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  options.device_optimizer = optimizer->get();
  auto engine = TransferEngine::Create(**job, device, nullptr, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->BeginStep(kSteps + 1, StepOptions()).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*engine)->RestoreGpuState().ok());
  FlatState overlay = *decoded;
  // The servers' values everywhere but the kept elements, which the engine
  // writes: poison those first.
  for (const uint32_t t : (*engine)->gpu_tensors()) {
    const uint64_t begin = (*job)->layout().offset(t);
    const uint64_t end = begin + (*job)->layout().tensors()[t].numel;
    std::fill(overlay.master.begin() + begin, overlay.master.begin() + end,
              -1.0f);
    for (std::vector<float>& slot : overlay.slots) {
      std::fill(slot.begin() + begin, slot.begin() + end, -1.0f);
    }
    overlay.tensor_steps[t] = 0;
  }
  ASSERT_TRUE((*engine)->ReadGpuState(ArraysOf(overlay)).ok());
  ExpectSameState(overlay, want, "restored by a new engine");
}

TEST_F(TransferEngineTest, OffloadFractionEqualsTheFullyOffloadedRunBitForBit) {
  for (const auto& [nodes, local_ranks, clip] :
       {std::tuple{1u, 1u, 0.0}, std::tuple{1u, 2u, 0.0},
        std::tuple{2u, 1u, 0.0}, std::tuple{2u, 2u, 0.0},
        std::tuple{1u, 1u, 0.5}, std::tuple{1u, 2u, 0.5},
        std::tuple{2u, 2u, 0.5}}) {
    SCOPED_TRACE(absl::StrCat(nodes, " nodes of ", local_ranks,
                              " local ranks, clip_grad ", clip));
    JobConfig config =
        SmallJobConfig(absl::StrCat("offload-", nodes, "-", local_ranks,
                                    clip > 0 ? "-clip" : ""),
                       nodes, 2);
    config.optimizer.clip_grad = clip;
    const Layout layout = Layout::Create(config.tensors,
                                         config.alignment_elems).value();
    const std::vector<uint32_t> kept = gpu::ChooseGpuTensors(layout, 0.5);
    ASSERT_FALSE(kept.empty());
    step_options_ = [kept](uint64_t step) {
      StepOptions options;
      options.group_hparams = StepHyperParams(step);
      options.loss_scale = 2.0;  // divided out on the GPU in one phase only
      if (step == 2) options.no_grad_tensors = {kept.back()};
      return options;
    };
    const std::vector<std::string> reference =
        ReferenceRun(config, local_ranks);
    TransferEngineOptions options;
    options.bucket_chunks = 2 * local_ranks;
    options.offload_fraction = 0.5;
    const std::vector<RankRun> runs = EngineRun(config, local_ranks, options);
    ASSERT_EQ(runs.size(), nodes * local_ranks);
    for (size_t r = 0; r < runs.size(); ++r) {
      SCOPED_TRACE(absl::StrCat("node ", r / local_ranks, " local rank ",
                                r % local_ranks));
      ASSERT_TRUE(runs[r].status.ok()) << runs[r].status;
      EXPECT_TRUE(runs[r].violations.empty())
          << absl::StrJoin(runs[r].violations, "\n");
      EXPECT_EQ(runs[r].gpu_tensors, kept);
      EXPECT_GT(runs[r].gpu_state_bytes, 0u);
      ASSERT_EQ(runs[r].weights.size(), kSteps);
      for (uint64_t s = 0; s < kSteps; ++s) {
        EXPECT_EQ(FirstDifference(runs[r].weights[s], reference[s]), "")
            << "step " << s + 1;
      }
      for (const StepResult& result : runs[r].results) {
        EXPECT_EQ(result.two_phase, clip > 0);
        if (clip > 0) {
          EXPECT_LT(result.clip_coef, 1.0);
        }
      }
      // The state read is the whole job's on every rank (gathered over the
      // node's ranks), bit for bit the fully offloaded run's.
      ExpectSameState(runs[r].state, reference_state_, "the state read");
    }
    ExpectStoredStateIsWhole(*this, config, options, local_ranks,
                             reference_state_);
  }
}

// Both servers checkpoint every second step, each into a directory of its
// own.
class TransferEngineCaptureTest : public TransferEngineTest {
 protected:
  std::vector<std::string> ServerAFlags() const override {
    return {"--checkpoint_dir=" + dir_.path() + "/a",
            "--checkpoint_every_steps=2"};
  }
  std::vector<std::string> ServerBFlags() const override {
    return {"--checkpoint_dir=" + dir_.path() + "/b",
            "--checkpoint_every_steps=2"};
  }

  // One step of a one-rank engine on node 0's gradient (the sum of
  // `local_ranks` local ones, as a node's reduce-scatter gives it).
  static absl::StatusOr<StepResult> RunOneRankStep(
      TransferEngine& engine, HostDevice& device, const Layout& layout,
      uint64_t step, uint32_t local_ranks, const StepOptions& options) {
    auto compute = device.CreateStream();
    if (!compute.ok()) return compute.status();
    if (absl::Status s = engine.BeginStep(step, options); !s.ok()) return s;
    const std::vector<float> grads = NodeGradient(layout, step, 0, local_ranks);
    if (absl::Status s = device.CopyAsync(
            **compute, engine.grads(), grads.data(),
            grads.size() * sizeof(float), gpu::CopyKind::kHostToDevice);
        !s.ok()) {
      return s;
    }
    for (uint64_t b = engine.partition().num_buckets(); b-- > 0;) {
      if (absl::Status s = engine.GradientsReady(b, **compute); !s.ok()) {
        return s;
      }
    }
    absl::StatusOr<StepResult> result = engine.FinishStep();
    if (absl::Status s = device.SynchronizeStream(**compute); !s.ok()) {
      return s;
    }
    return result;
  }

  TempDir dir_{"depot-engine-capture"};
};

// The kept state goes into the servers' periodic checkpoints by itself: the
// engine fills the capture of step 2 (each rank its chunks), so a rollback
// to it brings back the whole state, bit for bit the fully offloaded run's
// at step 2, and a step from there ends as that run's step 3. After a step
// the servers only summed, their arrays say they lack it, and a restore is
// refused.
TEST_F(TransferEngineCaptureTest, PeriodicCheckpointsHoldTheKeptState) {
  for (const uint32_t local_ranks : {1u, 2u}) {
    SCOPED_TRACE(absl::StrCat(local_ranks, " local ranks"));
    const JobConfig config =
        SmallJobConfig(absl::StrCat("capture-", local_ranks), 1, 2);
    const Layout layout =
        Layout::Create(config.tensors, config.alignment_elems).value();
    const std::vector<uint32_t> kept = gpu::ChooseGpuTensors(layout, 0.5);
    ASSERT_FALSE(kept.empty());
    step_options_ = [](uint64_t step) {
      StepOptions options;
      options.group_hparams = StepHyperParams(step);
      return options;
    };
    ReferenceRun(config, local_ranks);
    ASSERT_EQ(reference_states_.size(), kSteps);
    TransferEngineOptions options;
    options.bucket_chunks = 2 * local_ranks;
    options.offload_fraction = 0.5;
    const std::vector<RankRun> runs = EngineRun(config, local_ranks, options);
    // Every chunk with kept elements was sent once, for step 2 only, in
    // the background: FinishStep of step 2 does not report it.
    uint64_t kept_chunks = 0;
    const ShardPlan plan =
        ShardPlan::Create(layout.total_elems(), 2, config.chunk_elems).value();
    for (uint64_t c = 0; c < plan.num_chunks(); ++c) {
      for (const Segment& segment :
           layout.SegmentsIn(plan.chunk(c).begin, plan.chunk(c).end)) {
        if (std::count(kept.begin(), kept.end(), segment.tensor_index) > 0) {
          ++kept_chunks;
          break;
        }
      }
    }
    uint64_t sent = 0;
    for (const RankRun& run : runs) {
      ASSERT_TRUE(run.status.ok()) << run.status;
      ASSERT_EQ(run.results.size(), kSteps);
      EXPECT_EQ(run.results[1].capture_step, 0u);
      ASSERT_EQ(run.captures.size(), 1u);
      EXPECT_EQ(run.captures[0].step, 2u);
      EXPECT_EQ(run.captures[0].error, "");
      sent += run.captures[0].chunks;
    }
    EXPECT_EQ(sent, kept_chunks);

    absl::StatusOr<std::unique_ptr<Job>> job = OpenEngineJob(config);
    ASSERT_TRUE(job.ok()) << job.status();
    // The checkpoint is written in the background.
    absl::StatusOr<uint64_t> whole = absl::NotFoundError("not yet");
    for (int i = 0; i < 500 && !whole.ok(); ++i) {
      whole = (*job)->NewestCheckpointWithWorkerState(kSteps);
      if (!whole.ok())
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_EQ(*whole, 2u);
    absl::StatusOr<std::vector<ServerCheckpoints>> listed =
        (*job)->ListCheckpoints();
    ASSERT_TRUE(listed.ok()) << listed.status();
    for (const ServerCheckpoints& on : *listed) {
      EXPECT_EQ(on.steps, std::vector<uint64_t>{2}) << on.server;
      EXPECT_TRUE(on.steps_lacking_worker_state.empty()) << on.server;
    }

    ASSERT_TRUE((*job)->RollBack(2).ok());
    HostDevice device;
    auto optimizer = gpu::MakeHostDeviceOptimizer(config, device);
    ASSERT_TRUE(optimizer.ok()) << optimizer.status();
    TransferEngineOptions one_rank = options;
    one_rank.bucket_chunks = 2;
    one_rank.device_optimizer = optimizer->get();
    auto engine = TransferEngine::Create(**job, device, nullptr, one_rank);
    ASSERT_TRUE(engine.ok()) << engine.status();
    ASSERT_TRUE((*engine)->RestoreGpuState().ok());
    FlatState state;
    ASSERT_TRUE(ReadState(**job, state).ok());
    ASSERT_TRUE((*engine)->ReadGpuState(ArraysOf(state)).ok());
    ExpectSameState(state, reference_states_[1], "restored at step 2");

    absl::StatusOr<StepResult> step3 = RunOneRankStep(
        **engine, device, layout, 3, local_ranks, step_options_(3));
    ASSERT_TRUE(step3.ok()) << step3.status();
    EXPECT_EQ(step3->capture_step, 0u);  // no capture at step 3
    EXPECT_EQ((*engine)->WaitCaptures().step, 0u);
    ASSERT_TRUE(ReadState(**job, state).ok());
    ASSERT_TRUE((*engine)->ReadGpuState(ArraysOf(state)).ok());
    ExpectSameState(state, reference_states_[2], "step 3 after the restore");
    EXPECT_TRUE(device.violations().empty());

    // The servers only summed the kept tensors in step 3.
    auto again = TransferEngine::Create(**job, device, nullptr, one_rank);
    ASSERT_TRUE(again.ok()) << again.status();
    const absl::Status refused = (*again)->RestoreGpuState();
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    EXPECT_NE(refused.message().find("do not hold the state"),
              std::string::npos)
        << refused;
  }
}

// The kept state's send runs behind the steps, so a send the servers refuse
// is reported later, not by the step that started it, and the steps stand:
// here an on-demand checkpoint of step 2, taken by another handle once the
// servers applied step 2 and before the engine's FinishStep, replaced the
// capture the send was to fill.
TEST_F(TransferEngineCaptureTest, ARefusedSendIsReportedLaterAndTheStepsStand) {
  const JobConfig config = SmallJobConfig("capture-refused", 1, 2);
  const Layout layout =
      Layout::Create(config.tensors, config.alignment_elems).value();
  step_options_ = [](uint64_t step) {
    StepOptions options;
    options.group_hparams = StepHyperParams(step);
    return options;
  };
  ReferenceRun(config, 1);
  ASSERT_EQ(reference_states_.size(), kSteps);
  JobConfig named = config;
  named.name += "-engine";
  ASSERT_TRUE(InitJob(named));
  absl::StatusOr<std::unique_ptr<Job>> job = OpenEngineJob(config);
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<std::unique_ptr<Job>> other = OpenEngineJob(config);
  ASSERT_TRUE(other.ok()) << other.status();
  HostDevice device;
  auto optimizer = gpu::MakeHostDeviceOptimizer(config, device);
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  TransferEngineOptions options;
  options.bucket_chunks = 2;
  options.offload_fraction = 0.5;
  options.device_optimizer = optimizer->get();
  auto engine = TransferEngine::Create(**job, device, nullptr, options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE(
      RunOneRankStep(**engine, device, layout, 1, 1, step_options_(1)).ok());

  // Step 2, up to its FinishStep.
  auto compute = device.CreateStream();
  ASSERT_TRUE(compute.ok()) << compute.status();
  ASSERT_TRUE((*engine)->BeginStep(2, step_options_(2)).ok());
  const std::vector<float> grads = NodeGradient(layout, 2, 0, 1);
  ASSERT_TRUE(device
                  .CopyAsync(**compute, (*engine)->grads(), grads.data(),
                             grads.size() * sizeof(float),
                             gpu::CopyKind::kHostToDevice)
                  .ok());
  for (uint64_t b = (*engine)->partition().num_buckets(); b-- > 0;) {
    ASSERT_TRUE((*engine)->GradientsReady(b, **compute).ok());
  }
  // Once every server applied it, its capture waits for the kept state;
  // the checkpoint taken now replaces it (retried while a server still
  // writes the capture of a shard without kept elements).
  bool applied = false;
  for (int i = 0; i < 500 && !applied; ++i) {
    absl::StatusOr<std::vector<ServerJobStatus>> status =
        (*other)->Status(/*with_checksum=*/false);
    ASSERT_TRUE(status.ok()) << status.status();
    applied = std::all_of(status->begin(), status->end(),
                          [](const ServerJobStatus& s) { return s.step == 2; });
    if (!applied) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(applied);
  absl::StatusOr<uint64_t> taken = absl::UnavailableError("not yet");
  for (int i = 0; i < 500 && absl::IsUnavailable(taken.status()); ++i) {
    taken = (*other)->Checkpoint();
    if (!taken.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(*taken, 2u);

  absl::StatusOr<StepResult> step2 = (*engine)->FinishStep();
  ASSERT_TRUE(step2.ok()) << step2.status();
  EXPECT_EQ(step2->capture_step, 0u);
  ASSERT_TRUE(device.SynchronizeStream(**compute).ok());
  const gpu::CaptureReport refused = (*engine)->WaitCaptures();
  EXPECT_EQ(refused.step, 2u);
  EXPECT_EQ(refused.chunks, 0u);
  EXPECT_NE(refused.error.find("no checkpoint capture of step 2 waits"),
            std::string::npos)
      << refused.error;
  EXPECT_EQ((*engine)->WaitCaptures().step, 0u);  // reported once

  absl::StatusOr<StepResult> step3 =
      RunOneRankStep(**engine, device, layout, 3, 1, step_options_(3));
  ASSERT_TRUE(step3.ok()) << step3.status();
  EXPECT_EQ(step3->capture_step, 0u);
  FlatState state;
  ASSERT_TRUE(ReadState(**job, state).ok());
  ASSERT_TRUE((*engine)->ReadGpuState(ArraysOf(state)).ok());
  ExpectSameState(state, reference_states_[2], "step 3");
  EXPECT_TRUE(device.violations().empty());
}

// Its rule: the largest set of whole tensors, from the last, within the
// GPU's share; 1 keeps none, 0 keeps all.
TEST(ChooseGpuTensorsTest, KeepsWholeTensorsFromTheLastWithinTheShare) {
  const Layout layout =
      Layout::Create({{"a", 100, 0}, {"b", 50, 0}, {"c", 30, 1}, {"d", 20, 1}},
                     1)
          .value();
  EXPECT_TRUE(gpu::ChooseGpuTensors(layout, 1.0).empty());
  EXPECT_EQ(gpu::ChooseGpuTensors(layout, 0.0),
            (std::vector<uint32_t>{0, 1, 2, 3}));
  // 25% of 200 = 50 elements: d (20) and c (30).
  EXPECT_EQ(gpu::ChooseGpuTensors(layout, 0.75),
            (std::vector<uint32_t>{2, 3}));
  // 40% = 80: d, c, then b (50) does not fit; a does not either.
  EXPECT_EQ(gpu::ChooseGpuTensors(layout, 0.6),
            (std::vector<uint32_t>{2, 3}));
  // 60% = 120: d, c, b (100 in all), not a.
  EXPECT_EQ(gpu::ChooseGpuTensors(layout, 0.4),
            (std::vector<uint32_t>{1, 2, 3}));
}

// One process per node (local_ranks 1, no collective), one slot per ring:
// every chunk waits for the previous one's send and copy.
TEST_F(TransferEngineTest, OneRankNodesWithOneSlotPerRing) {
  const JobConfig config = SmallJobConfig("single", 2, 2);
  const std::vector<std::string> reference = ReferenceRun(config, 1);
  TransferEngineOptions options;
  options.bucket_chunks = 3;
  options.d2h_slots = 1;
  options.h2d_slots = 1;
  const std::vector<RankRun> runs = EngineRun(config, 1, options);
  for (const RankRun& run : runs) {
    ASSERT_TRUE(run.status.ok()) << run.status;
    EXPECT_TRUE(run.violations.empty()) << absl::StrJoin(run.violations, "\n");
    for (uint64_t s = 0; s < kSteps; ++s) {
      EXPECT_EQ(FirstDifference(run.weights[s], reference[s]), "")
          << "step " << s + 1;
    }
  }
}

// The delayed update: the gradient of step s depends on the weights forward
// s read (g = local gradient + 0.5 * w), which are step s - 2's (the initial
// weights for s = 1, 2). The reference runs the same one-step-stale schedule
// through Job::Step; the weights every forward read, and so every gradient,
// must be equal bit for bit.
class DelayedUpdateTest : public TransferEngineTest {
 protected:
  static constexpr uint64_t kDpuSteps = 5;

  // Local rank g of node n's gradient at step s from the weights `seen`.
  static std::vector<float> StaleGradient(const Layout& layout, uint64_t step,
                                          uint32_t node, uint32_t g,
                                          uint32_t local_ranks,
                                          const std::vector<float>& seen) {
    std::vector<float> grad = LocalGradient(layout, step, node, g, local_ranks);
    for (size_t i = 0; i < grad.size(); ++i) grad[i] = grad[i] + 0.5f * seen[i];
    return grad;
  }

  static std::vector<float> Widen(const std::string& bytes, DType dtype) {
    std::vector<float> out(bytes.size() / DTypeSize(dtype));
    ConvertToFloat(dtype, bytes.data(), out.data(), out.size());
    return out;
  }

  // Per step, the weights forward s read (node 0's).
  std::vector<std::string> Reference(JobConfig config, uint32_t local_ranks) {
    config.name += "-reference";
    std::vector<std::string> seen(kDpuSteps);
    RunNodes(config, [&](Job& job, uint32_t n) -> absl::Status {
      const Layout& layout = job.layout();
      const DType wdtype = config.weight_dtype;
      const std::string init = InitialWeights(layout, wdtype);
      std::vector<std::string> out(kDpuSteps + 1);
      for (uint64_t step = 1; step <= kDpuSteps; ++step) {
        const std::string& forward = step <= 2 ? init : out[step - 2];
        if (n == 0) seen[step - 1] = forward;
        const std::vector<float> w = Widen(forward, wdtype);
        std::vector<float> grads =
            StaleGradient(layout, step, n, 0, local_ranks, w);
        for (uint32_t g = 1; g < local_ranks; ++g) {
          const std::vector<float> part =
              StaleGradient(layout, step, n, g, local_ranks, w);
          for (size_t i = 0; i < grads.size(); ++i) grads[i] = grads[i] + part[i];
        }
        out[step].assign(layout.total_elems() * DTypeSize(wdtype), '\0');
        if (absl::Status s =
                job.Step(step, grads.data(), out[step].data(), nullptr);
            !s.ok()) {
          return s;
        }
      }
      return absl::OkStatus();
    });
    return seen;
  }

  // The initial weights as the trainer holds them: weight dtype, padding
  // garbage included.
  static std::string InitialWeights(const Layout& layout, DType dtype) {
    return MakeInitialWeights(layout, dtype, kSeed);
  }

  // One rank's run; returns the weights each forward read.
  absl::Status Rank(const JobConfig& config, uint32_t node, uint32_t g,
                    uint32_t local_ranks, int d2h_slots, HostDevice& device,
                    gpu::Collective* collective, double offload_fraction,
                    std::vector<std::string>* seen) {
    ClientOptions options;
    options.servers = Addresses();
    auto client = Client::Connect(options);
    if (!client.ok()) return client.status();
    auto job = (*client)->OpenJob(config, node);
    if (!job.ok()) return job.status();
    TransferEngineOptions engine_options;
    engine_options.local_rank = g;
    engine_options.local_ranks = local_ranks;
    engine_options.bucket_chunks = 2 * local_ranks;
    engine_options.d2h_slots = d2h_slots;
    engine_options.h2d_slots = 2;
    engine_options.delayed_update = true;
    std::unique_ptr<gpu::DeviceOptimizer> optimizer;
    if (offload_fraction < 1.0) {
      auto made = gpu::MakeHostDeviceOptimizer(config, device);
      if (!made.ok()) return made.status();
      optimizer = *std::move(made);
      engine_options.offload_fraction = offload_fraction;
      engine_options.device_optimizer = optimizer.get();
    }
    auto engine =
        TransferEngine::Create(**job, device, collective, engine_options);
    if (!engine.ok()) return engine.status();
    auto compute = device.CreateStream();
    if (!compute.ok()) return compute.status();
    const Layout& layout = (*job)->layout();
    const uint64_t n = layout.total_elems();
    const DType wdtype = config.weight_dtype;
    const size_t wsize = DTypeSize(wdtype);
    const uint64_t buckets = (*engine)->partition().num_buckets();
    const std::string init = InitialWeights(layout, wdtype);
    std::deque<std::vector<float>> held;
    absl::Status s = device.CopyAsync(**compute, (*engine)->weights(),
                                      init.data(), init.size(),
                                      gpu::CopyKind::kHostToDevice);
    for (uint64_t step = 1; s.ok() && step <= kDpuSteps; ++step) {
      // Forward: every bucket's wait (which applies step - 2's weights).
      for (uint64_t b = 0; s.ok() && b < buckets; ++b) {
        s = (*engine)->WaitWeights(b, **compute);
      }
      std::string forward(n * wsize, '\0');
      if (s.ok()) {
        s = device.CopyAsync(**compute, forward.data(), (*engine)->weights(),
                             forward.size(), gpu::CopyKind::kDeviceToHost);
      }
      if (s.ok()) s = device.SynchronizeStream(**compute);
      if (!s.ok()) break;
      // Kept until the end: the copy reads it whenever the stream gets to it.
      const std::vector<float>& grads = held.emplace_back(StaleGradient(
          layout, step, node, g, local_ranks, Widen(forward, wdtype)));
      seen->push_back(std::move(forward));
      s = (*engine)->BeginStep(step, StepOptions());
      if (s.ok()) {
        s = device.CopyAsync(**compute, (*engine)->grads(), grads.data(),
                             n * sizeof(float), gpu::CopyKind::kHostToDevice);
      }
      for (uint64_t b = buckets; s.ok() && b-- > 0;) {
        s = (*engine)->GradientsReady(b, **compute);
      }
      if (s.ok() && step > 1) s = (*engine)->FinishStep().status();
    }
    if (s.ok()) s = (*engine)->FinishStep().status();
    if (s.ok()) s = device.SynchronizeStream(**compute);
    return s;
  }
};

TEST_F(DelayedUpdateTest, TwoNodesOfTwoRanksReadTheOneStepStaleWeights) {
  // fp32 and bf16 weights; the second bf16 run with host<->device copies
  // slowed to 5 MB/s (a chunk's copy about 0.1 ms), so that the two steps in
  // flight overlap more, and with one D2H slot, which the next step's D2H
  // thread must not hold while it waits for its turn (it deadlocked). The
  // last three keep half the parameters' optimizer on the GPU (the servers
  // send the kept tensors' sums, one buffer per step in flight), against
  // the same fully offloaded reference, the last also clipped (two-phase
  // steps, two in flight).
  for (const auto& [weight_dtype, rate, offload, clip] :
       {std::tuple{DType::kFloat32, 0.0, 1.0, 0.0},
        std::tuple{DType::kBFloat16, 0.0, 1.0, 0.0},
        std::tuple{DType::kBFloat16, 5e6, 1.0, 0.0},
        std::tuple{DType::kFloat32, 0.0, 0.5, 0.0},
        std::tuple{DType::kBFloat16, 5e6, 0.5, 0.0},
        std::tuple{DType::kFloat32, 0.0, 0.5, 0.5}}) {
    SCOPED_TRACE(absl::StrCat(std::string(DTypeName(weight_dtype)), " at ",
                              rate, " B/s, offload fraction ", offload,
                              ", clip_grad ", clip));
    JobConfig config = SmallJobConfig(
        absl::StrCat("dpu-", std::string(DTypeName(weight_dtype)), "-",
                     rate > 0 ? "slow" : "fast", offload < 1.0 ? "-kept" : "",
                     clip > 0 ? "-clip" : ""),
        2, 2);
    config.weight_dtype = weight_dtype;
    config.optimizer.clip_grad = clip;
    const std::vector<std::string> reference = Reference(config, 2);
    config.name += "-engine";
    ASSERT_TRUE(InitJob(config));
    std::vector<std::vector<std::string>> seen(4);
    std::vector<absl::Status> statuses(4);
    std::vector<std::vector<std::string>> violations(4);
    std::vector<std::shared_ptr<HostCollectiveGroup>> groups = {
        HostCollectiveGroup::Create(2), HostCollectiveGroup::Create(2)};
    std::vector<std::thread> threads;
    for (uint32_t r = 0; r < 4; ++r) {
      threads.emplace_back([&, r, rate = rate, offload = offload] {
        HostDevice::Options device_options;
        device_options.copy_bytes_per_second = rate;
        HostDevice device(device_options);
        std::unique_ptr<gpu::Collective> collective =
            groups[r / 2]->Join(r % 2, device);
        statuses[r] = Rank(config, r / 2, r % 2, 2, rate > 0 ? 1 : 2, device,
                           collective.get(), offload, &seen[r]);
        violations[r] = device.violations();
      });
    }
    for (std::thread& t : threads) t.join();
    for (uint32_t r = 0; r < 4; ++r) {
      SCOPED_TRACE(absl::StrCat("node ", r / 2, " local rank ", r % 2));
      ASSERT_TRUE(statuses[r].ok()) << statuses[r];
      EXPECT_TRUE(violations[r].empty()) << absl::StrJoin(violations[r], "\n");
      ASSERT_EQ(seen[r].size(), kDpuSteps);
      for (uint64_t s = 0; s < kDpuSteps; ++s) {
        EXPECT_EQ(FirstDifference(seen[r][s], reference[s]), "")
            << "forward " << s + 1 << " (equal to the reference's forward "
            << [&] {
                 std::string equal;
                 for (uint64_t t = 0; t < kDpuSteps; ++t) {
                   if (seen[r][s] == reference[t]) {
                     absl::StrAppend(&equal, t + 1, " ");
                   }
                 }
                 return equal.empty() ? std::string("none") : equal;
               }()
            << ")";
      }
    }
  }
}

// The engine's error paths: misuse is refused with the right code and the
// engine goes on; a server that dies mid-step fails the step, not the
// process, and nothing hangs.
class TransferEngineErrorTest : public TransferEngineTest {
 protected:
  struct Open {
    std::unique_ptr<Client> client;
    std::unique_ptr<Job> job;
    std::unique_ptr<HostDevice> device;
    std::unique_ptr<TransferEngine> engine;
    std::unique_ptr<gpu::Stream> compute;
  };

  // One worker, one rank, on a fresh job `name`.
  Open OpenEngine(const std::string& name, TransferEngineOptions options = {},
                  absl::Duration step_timeout = absl::Seconds(60)) {
    Open open;
    JobConfig config = SmallJobConfig(name, 1, 2);
    EXPECT_TRUE(InitJob(config));
    ClientOptions client_options;
    client_options.servers = Addresses();
    client_options.step_timeout = step_timeout;
    open.client = Client::Connect(client_options).value();
    open.job = open.client->OpenJob(config, 0).value();
    open.device = std::make_unique<HostDevice>();
    options.bucket_chunks = options.bucket_chunks == 0 ? 3 : options.bucket_chunks;
    open.engine =
        TransferEngine::Create(*open.job, *open.device, nullptr, options)
            .value();
    open.compute = open.device->CreateStream().value();
    return open;
  }

  // body(0) and body(1), each on a thread. A rank still running after 60 s
  // hangs: the test fails and the process exits (the thread cannot be
  // stopped, and it uses the test's objects).
  static void OnTwoRanks(const std::function<void(uint32_t)>& body) {
    std::atomic<int> done{0};
    std::vector<std::thread> threads;
    for (uint32_t g = 0; g < 2; ++g) {
      threads.emplace_back([&body, &done, g] {
        body(g);
        ++done;
      });
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (done.load() < 2 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    if (done.load() < 2) {
      std::fprintf(stderr, "FAILED: a local rank hangs\n");
      std::fflush(stderr);
      std::_Exit(1);
    }
    for (std::thread& t : threads) t.join();
  }

  // Local rank g of a node of two (threads, one HostCollectiveGroup) on
  // `config` (one worker), buckets of two chunks, after its step 1.
  struct NodeRank {
    std::unique_ptr<Client> client;
    std::unique_ptr<Job> job;
    std::unique_ptr<HostDevice> device;
    std::unique_ptr<gpu::Collective> collective;
    std::unique_ptr<gpu::DeviceOptimizer> optimizer;
    std::unique_ptr<TransferEngine> engine;
    std::unique_ptr<gpu::Stream> compute;
    absl::Status finished;
  };
  void OpenNodeRank(NodeRank& rank, uint32_t g, const JobConfig& config,
                    HostCollectiveGroup& group,
                    absl::Duration collective_timeout = absl::Minutes(10),
                    double offload_fraction = 1.0) {
    ClientOptions options;
    options.servers = Addresses();
    options.step_timeout = absl::Seconds(20);
    rank.client = Client::Connect(options).value();
    rank.job = rank.client->OpenJob(config, 0).value();
    rank.device = std::make_unique<HostDevice>();
    rank.collective = group.Join(static_cast<int>(g), *rank.device);
    TransferEngineOptions engine_options;
    engine_options.local_rank = g;
    engine_options.local_ranks = 2;
    engine_options.bucket_chunks = 2;
    engine_options.collective_timeout = collective_timeout;
    engine_options.offload_fraction = offload_fraction;
    if (offload_fraction < 1.0) {
      rank.optimizer =
          gpu::MakeHostDeviceOptimizer(config, *rank.device).value();
      engine_options.device_optimizer = rank.optimizer.get();
    }
    rank.engine = TransferEngine::Create(*rank.job, *rank.device,
                                         rank.collective.get(), engine_options)
                      .value();
    rank.compute = rank.device->CreateStream().value();
    ASSERT_TRUE(rank.engine->BeginStep(1, StepOptions()).ok());
    ASSERT_TRUE(NameAll(*rank.engine, *rank.compute).ok());
    ASSERT_TRUE(rank.engine->FinishStep().ok());
    EXPECT_TRUE(rank.engine->CheckNode().ok());
  }

  // A node of two ranks on a new job `name` of two chunks (one bucket, a
  // chunk per rank and per server), `offload_fraction` of it offloaded,
  // after step 1; the group.
  std::shared_ptr<HostCollectiveGroup> OpenNodeOfTwoChunks(
      const std::string& name, NodeRank (&ranks)[2], double offload_fraction) {
    JobConfig config = SmallJobConfig(name, 1, 2);
    config.tensors = {{"w", 2 * config.chunk_elems, 0}};
    EXPECT_TRUE(InitJob(config));
    std::shared_ptr<HostCollectiveGroup> group = HostCollectiveGroup::Create(2);
    OnTwoRanks([&](uint32_t g) {
      OpenNodeRank(ranks[g], g, config, *group, absl::Minutes(10),
                   offload_fraction);
      EXPECT_EQ(ranks[g].engine->partition().num_buckets(), 1u);
    });
    return group;
  }

  // A node of two ranks on a new job `name` of four chunks (two buckets),
  // each rank's collective timeout its own, after step 1; the group.
  std::shared_ptr<HostCollectiveGroup> OpenNodeOfTwoBuckets(
      const std::string& name, NodeRank (&ranks)[2],
      const std::array<absl::Duration, 2>& timeouts) {
    JobConfig config = SmallJobConfig(name, 1, 2);
    config.tensors = {{"w", 4 * config.chunk_elems, 0}};
    EXPECT_TRUE(InitJob(config));
    std::shared_ptr<HostCollectiveGroup> group = HostCollectiveGroup::Create(2);
    OnTwoRanks([&](uint32_t g) {
      OpenNodeRank(ranks[g], g, config, *group, timeouts[g]);
      EXPECT_EQ(ranks[g].engine->partition().num_buckets(), 2u);
    });
    return group;
  }

  // Every bucket, last first (backward's order).
  static absl::Status NameAll(TransferEngine& engine, gpu::Stream& compute) {
    const uint64_t buckets = engine.partition().num_buckets();
    for (uint64_t b = buckets; b-- > 0;) {
      if (absl::Status s = engine.GradientsReady(b, compute); !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }
  static absl::Status NameAll(Open& open) {
    return NameAll(*open.engine, *open.compute);
  }

  // The newest step some chunk of the job has applied, over its servers
  // (0 when they cannot say).
  static uint64_t NewestStep(Job& job) {
    const absl::StatusOr<std::vector<ServerCheckpoints>> servers =
        job.ListCheckpoints();
    EXPECT_TRUE(servers.ok()) << servers.status();
    uint64_t newest = 0;
    if (!servers.ok()) return newest;
    for (const ServerCheckpoints& server : *servers) {
      newest = std::max(newest, server.newest_step);
    }
    return newest;
  }
};

TEST_F(TransferEngineErrorTest, MisuseIsRefusedAndTheEngineGoesOn) {
  Open open = OpenEngine("misuse");
  TransferEngine& engine = *open.engine;
  gpu::Stream& compute = *open.compute;
  const uint64_t buckets = engine.partition().num_buckets();
  ASSERT_GE(buckets, 2u);
  EXPECT_EQ(engine.GradientsReady(0, compute).code(),
            absl::StatusCode::kFailedPrecondition);  // no step
  EXPECT_EQ(engine.FinishStep().status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine.BeginStep(0, StepOptions()).code(),
            absl::StatusCode::kInvalidArgument);
  StepOptions overrides;
  const float one = 1.0f;
  overrides.weight_overrides = {{0, &one}};
  EXPECT_EQ(engine.BeginStep(1, overrides).code(),
            absl::StatusCode::kInvalidArgument);

  ASSERT_TRUE(engine.BeginStep(1, StepOptions()).ok());
  EXPECT_EQ(engine.BeginStep(2, StepOptions()).code(),
            absl::StatusCode::kFailedPrecondition);  // 1 is in flight
  EXPECT_EQ(engine.GradientsReady(buckets, compute).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(engine.GradientsReady(1, compute).ok());
  EXPECT_EQ(engine.GradientsReady(1, compute).code(),
            absl::StatusCode::kInvalidArgument);  // named twice
  EXPECT_EQ(engine.WaitWeights(0, compute).code(),
            absl::StatusCode::kFailedPrecondition);  // not named
  // Finishing before every bucket is named fails the step, naming them.
  absl::StatusOr<StepResult> early = engine.FinishStep();
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(early.status().message().find("named buckets 0, 2"),
            absl::string_view::npos)
      << early.status();
  // The same step again, whole: it completes (the servers never applied it).
  ASSERT_TRUE(engine.BeginStep(1, StepOptions()).ok());
  ASSERT_TRUE(NameAll(open).ok());
  absl::StatusOr<StepResult> done = engine.FinishStep();
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->chunks, open.job->plan().num_chunks());
  EXPECT_TRUE(open.device->violations().empty());
}

TEST_F(TransferEngineErrorTest, BadOptionsAreInvalidArgument) {
  JobConfig config = SmallJobConfig("options", 2, 2);
  ASSERT_TRUE(InitJob(config));
  ClientOptions client_options;
  client_options.servers = Addresses();
  auto client = Client::Connect(client_options).value();
  auto job = client->OpenJob(config, 0).value();
  HostDevice device;
  const auto create = [&](TransferEngineOptions options) {
    return TransferEngine::Create(*job, device, nullptr, options).status();
  };
  TransferEngineOptions o;
  o.local_rank = 2;
  o.local_ranks = 2;
  EXPECT_EQ(create(o).code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.local_ranks = 2;  // no collective
  EXPECT_EQ(create(o).code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.d2h_slots = 0;
  EXPECT_EQ(create(o).code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.collective_timeout = absl::Seconds(-1);
  EXPECT_EQ(create(o).code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.bucket_chunks = 3;
  o.local_ranks = 1;
  EXPECT_TRUE(create(o).ok());
  o.offload_fraction = 1.5;
  EXPECT_EQ(create(o).code(), absl::StatusCode::kInvalidArgument);
  o.offload_fraction = 0.5;  // no device optimizer
  EXPECT_EQ(create(o).code(), absl::StatusCode::kInvalidArgument);
  auto optimizer = gpu::MakeHostDeviceOptimizer(config, device).value();
  o.device_optimizer = optimizer.get();
  // Two workers: the servers sum the kept tensors' gradients for them.
  EXPECT_TRUE(create(o).ok());
}

TEST_F(TransferEngineErrorTest, AServerThatDiesFailsTheStepWithoutAHang) {
  Open open = OpenEngine("dies", {}, absl::Seconds(20));
  TransferEngine& engine = *open.engine;
  ASSERT_TRUE(engine.BeginStep(1, StepOptions()).ok());
  ASSERT_TRUE(NameAll(open).ok());
  ASSERT_TRUE(engine.FinishStep().ok());
  ASSERT_TRUE(server(1).Kill().ok());
  const absl::Time start = absl::Now();
  ASSERT_TRUE(engine.BeginStep(2, StepOptions()).ok());
  // Naming may already see the failure; either way FinishStep reports it.
  (void)NameAll(open);
  absl::StatusOr<StepResult> failed = engine.FinishStep();
  EXPECT_FALSE(failed.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(15)) << failed.status();
  EXPECT_NE(failed.status().message().find(server(1).grpc_address()),
            absl::string_view::npos)
      << failed.status();
  // The engine is usable again (the step fails again for the same reason).
  ASSERT_TRUE(engine.BeginStep(2, StepOptions()).ok());
  (void)NameAll(open);
  EXPECT_FALSE(engine.FinishStep().ok());
}

TEST_F(TransferEngineErrorTest, AFailedStepWithGpuTensorsLeavesTheEngineUnusable) {
  JobConfig config = SmallJobConfig("kept-fail", 1, 2);
  ASSERT_TRUE(InitJob(config));
  ClientOptions client_options;
  client_options.servers = Addresses();
  auto client = Client::Connect(client_options).value();
  auto job = client->OpenJob(config, 0).value();
  HostDevice device;
  auto optimizer = gpu::MakeHostDeviceOptimizer(config, device).value();
  TransferEngineOptions options;
  options.bucket_chunks = 3;
  options.offload_fraction = 0.5;
  options.device_optimizer = optimizer.get();
  auto engine = TransferEngine::Create(*job, device, nullptr, options).value();
  auto compute = device.CreateStream().value();
  // The kept tensors' state as it starts (arrays over the whole job).
  const uint64_t n = job->layout().total_elems();
  std::vector<float> master(n, -1.0f), slot0(n), slot1(n);
  std::vector<uint64_t> counts(config.tensors.size(), 7);
  gpu::StateArrays state;
  state.master = master.data();
  state.slots[0] = slot0.data();
  state.slots[1] = slot1.data();
  state.tensor_steps = counts.data();
  EXPECT_EQ(engine->ReadGpuState(state).code(),
            absl::StatusCode::kInvalidArgument);  // AdamW keeps two slots
  state.num_slots = 2;
  ASSERT_TRUE(engine->ReadGpuState(state).ok());
  const std::vector<uint32_t>& kept = engine->gpu_tensors();
  const Layout& layout = job->layout();
  for (uint32_t t = 0; t < counts.size(); ++t) {
    const bool is_kept = std::count(kept.begin(), kept.end(), t) > 0;
    EXPECT_EQ(counts[t], is_kept ? 0u : 7u) << "tensor " << t;
    // Kept: the initial master (not -1); others: left as they were.
    EXPECT_EQ(master[layout.offset(t)] == -1.0f, !is_kept) << "tensor " << t;
  }
  ASSERT_TRUE(engine->BeginStep(1, StepOptions()).ok());
  EXPECT_EQ(engine->ReadGpuState(state).code(),
            absl::StatusCode::kFailedPrecondition);  // a step in flight
  ASSERT_TRUE(engine->GradientsReady(0, *compute).ok());
  EXPECT_FALSE(engine->FinishStep().ok());  // not every bucket named
  const absl::Status again = engine->BeginStep(1, StepOptions());
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(again.message().find("cannot replay"), absl::string_view::npos)
      << again;
  // Loading a state (here the one it started from) makes it usable again.
  ASSERT_TRUE(engine->WriteGpuState(state).ok());
  ASSERT_TRUE(engine->BeginStep(1, StepOptions()).ok());
  ASSERT_TRUE(NameAll(*engine, *compute).ok());
  ASSERT_TRUE(engine->FinishStep().ok());
  engine.reset();
  // An engine made on the job now (a trainer restarted on it): the kept
  // state is missing until loaded, and says so.
  engine = TransferEngine::Create(*job, device, nullptr, options).value();
  const absl::Status missing = engine->BeginStep(2, StepOptions());
  EXPECT_EQ(missing.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.message().find("has applied step 1"),
            absl::string_view::npos)
      << missing;
  EXPECT_EQ(engine->ReadGpuState(state).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(engine->WriteGpuState(state).ok());
  ASSERT_TRUE(engine->BeginStep(2, StepOptions()).ok());
  ASSERT_TRUE(NameAll(*engine, *compute).ok());
  EXPECT_TRUE(engine->FinishStep().ok());
}

// A node of two local ranks on a job of two chunks, one per server and per
// rank: a server that dies fails the step on the rank whose chunk it holds,
// while the other's goes through. Every collective still runs on both ranks,
// so neither waits for ever (before, the failed rank queued no all-gather
// and the other waited in its own); the rank whose part went through learns
// of the failure from the node's verdict (CheckNode, read once; BeginStep
// refuses the next step with it). A step that ends before every bucket is
// named leaves the node's collectives out of step: every later step is
// refused, saying so.
TEST_F(TransferEngineErrorTest, ARankWhoseStepFailsLeavesNoRankWaiting) {
  NodeRank ranks[2];
  std::shared_ptr<HostCollectiveGroup> group =
      OpenNodeOfTwoChunks("node-fail", ranks, /*offload_fraction=*/1.0);
  // Rank 1's only chunk lives on server 1.
  ASSERT_EQ(ranks[0].job->plan().ServerOfChunk(1), 1u);
  ASSERT_EQ(ranks[0].engine->partition().OwnerOfChunk(1), 1u);
  ASSERT_TRUE(server(1).Kill().ok());
  // Step 2 on both ranks: it fails on rank 1 and goes through on rank 0.
  const auto step_two = [&] {
    OnTwoRanks([&](uint32_t g) {
      NodeRank& rank = ranks[g];
      ASSERT_TRUE(rank.engine->BeginStep(2, StepOptions()).ok());
      // Also on the rank whose step fails: its buckets are still named.
      EXPECT_TRUE(rank.engine->GradientsReady(0, *rank.compute).ok());
      rank.finished = rank.engine->FinishStep().status();
    });
    EXPECT_FALSE(ranks[1].finished.ok());
    EXPECT_TRUE(ranks[0].finished.ok()) << ranks[0].finished;
  };
  step_two();
  // Rank 0's part went through; the verdict says the node's did not. (On
  // the ranks' threads: a verdict that never comes is a hang too.)
  OnTwoRanks([&](uint32_t g) {
    if (g == 1) {
      EXPECT_TRUE(ranks[1].engine->CheckNode().ok());  // it knew its failure
      return;
    }
    const absl::Status verdict = ranks[0].engine->CheckNode();
    EXPECT_EQ(verdict.code(), absl::StatusCode::kAborted) << verdict;
    EXPECT_NE(verdict.message().find("step 2 failed on 1 other local rank"),
              absl::string_view::npos)
        << verdict;
    EXPECT_TRUE(ranks[0].engine->CheckNode().ok());  // read once
  });
  // The same step again: rank 1 fails again, and rank 0's next BeginStep
  // finds the verdict itself.
  step_two();
  OnTwoRanks([&](uint32_t g) {
    if (g == 1) return;
    const absl::Status refused = ranks[0].engine->BeginStep(3, StepOptions());
    EXPECT_EQ(refused.code(), absl::StatusCode::kAborted) << refused;
  });
  // A step ended before its bucket was named: out of step for good.
  OnTwoRanks([&](uint32_t g) {
    NodeRank& rank = ranks[g];
    ASSERT_TRUE(rank.engine->BeginStep(2, StepOptions()).ok());
    // FAILED_PRECONDITION, or on rank 1 the dead server's error if it came
    // first.
    EXPECT_FALSE(rank.engine->FinishStep().ok());
    const absl::Status next = rank.engine->BeginStep(2, StepOptions());
    EXPECT_EQ(next.code(), absl::StatusCode::kFailedPrecondition) << next;
    EXPECT_NE(next.message().find("out of step"), absl::string_view::npos)
        << next;
  });
  EXPECT_TRUE(group->errors().empty()) << absl::StrJoin(group->errors(), "; ");
}

// StoreGpuState on a node of two ranks (everything kept on the GPU, one chunk
// per rank and per server) is a collective: each rank patches its own chunk,
// and every rank learns whether all did. With server 1, which holds only
// rank 1's chunk, killed, rank 1's store fails with its own error and rank
// 0's, whose patch went through, is ABORTED naming the other rank: a rank
// alone could not tell the servers' arrays are not whole, and neither waits
// for ever. (Without the agreement rank 0 returns OK: checked.) The same for
// RestoreGpuState: both ranks restore while both servers run; then rank 1's
// restore fails, and rank 0's is ABORTED and leaves its state missing, so
// that it cannot step from a node state that is not whole.
TEST_F(TransferEngineErrorTest,
       ANodesStoreAndRestoreFailOnEveryRankWhenOneRankCannot) {
  NodeRank ranks[2];
  std::shared_ptr<HostCollectiveGroup> group =
      OpenNodeOfTwoChunks("node-store", ranks, /*offload_fraction=*/0.0);
  for (const NodeRank& rank : ranks) {
    EXPECT_GT(rank.engine->gpu_state_bytes(), 0u);
  }
  ASSERT_EQ(ranks[0].job->plan().ServerOfChunk(1), 1u);
  ASSERT_EQ(ranks[0].engine->partition().OwnerOfChunk(1), 1u);
  absl::Status stored[2];
  OnTwoRanks([&](uint32_t g) { stored[g] = ranks[g].engine->StoreGpuState(); });
  EXPECT_TRUE(stored[0].ok()) << stored[0];
  EXPECT_TRUE(stored[1].ok()) << stored[1];
  absl::Status restored[2];
  OnTwoRanks(
      [&](uint32_t g) { restored[g] = ranks[g].engine->RestoreGpuState(); });
  EXPECT_TRUE(restored[0].ok()) << restored[0];
  EXPECT_TRUE(restored[1].ok()) << restored[1];
  ASSERT_TRUE(server(1).Kill().ok());
  OnTwoRanks([&](uint32_t g) { stored[g] = ranks[g].engine->StoreGpuState(); });
  EXPECT_FALSE(stored[1].ok());
  EXPECT_NE(stored[1].code(), absl::StatusCode::kAborted) << stored[1];
  EXPECT_EQ(stored[0].code(), absl::StatusCode::kAborted) << stored[0];
  EXPECT_NE(stored[0].message().find("another local rank"),
            absl::string_view::npos)
      << stored[0];
  OnTwoRanks(
      [&](uint32_t g) { restored[g] = ranks[g].engine->RestoreGpuState(); });
  EXPECT_FALSE(restored[1].ok());
  EXPECT_NE(restored[1].code(), absl::StatusCode::kAborted) << restored[1];
  EXPECT_EQ(restored[0].code(), absl::StatusCode::kAborted) << restored[0];
  const absl::Status next = ranks[0].engine->BeginStep(2, StepOptions());
  EXPECT_EQ(next.code(), absl::StatusCode::kFailedPrecondition) << next;
  EXPECT_NE(next.message().find("another local rank could not read"),
            absl::string_view::npos)
      << next;
  EXPECT_TRUE(group->errors().empty()) << absl::StrJoin(group->errors(), "; ");
}

// AgreeOnStep: every rank gets the least step any rank passed, also past
// 2^32 (each step goes as four 16-bit parts); one rank gets its own.
TEST_F(TransferEngineErrorTest, AgreeOnStepGivesEveryRankTheLeast) {
  NodeRank ranks[2];
  std::shared_ptr<HostCollectiveGroup> group =
      OpenNodeOfTwoChunks("node-agree", ranks, /*offload_fraction=*/1.0);
  for (const auto& [a, b] : {std::pair<uint64_t, uint64_t>{5, 3},
                             {0, 9},
                             {(uint64_t{1} << 40) + 9, (uint64_t{1} << 40) + 7},
                             {kMaxStepForTests, kMaxStepForTests - 65536}}) {
    absl::StatusOr<uint64_t> agreed[2] = {absl::UnknownError("not run"),
                                          absl::UnknownError("not run")};
    OnTwoRanks([&](uint32_t g) {
      agreed[g] = ranks[g].engine->AgreeOnStep(g ? b : a);
    });
    for (int g = 0; g < 2; ++g) {
      ASSERT_TRUE(agreed[g].ok()) << agreed[g].status();
      EXPECT_EQ(*agreed[g], std::min(a, b)) << "rank " << g;
    }
  }
  EXPECT_TRUE(group->errors().empty()) << absl::StrJoin(group->errors(), "; ");
}

// A rank that stops stepping (died, hung) no longer leaves its peer waiting
// for ever: rank 1 does nothing after step 1, and rank 0's step 2 waits in
// its first reduce-scatter until the collective timeout (1 s), then fails
// with DEADLINE_EXCEEDED; no chunk the aborted reduce-scatter left is sent
// (no server applies any of step 2), and the node is broken for good:
// CheckNode and BeginStep say why, every time.
TEST_F(TransferEngineErrorTest, ARankThatStopsFailsItsPeerAtTheTimeout) {
  NodeRank ranks[2];
  const std::shared_ptr<HostCollectiveGroup> group = OpenNodeOfTwoBuckets(
      "node-stop", ranks, {absl::Seconds(1), absl::Seconds(1)});
  ASSERT_EQ(NewestStep(*ranks[0].job), 1u);
  OnTwoRanks([&](uint32_t g) {
    if (g == 1) return;  // rank 1 stops here
    TransferEngine& engine = *ranks[0].engine;
    const absl::Time start = absl::Now();
    ASSERT_TRUE(engine.BeginStep(2, StepOptions()).ok());
    ASSERT_TRUE(NameAll(engine, *ranks[0].compute).ok());
    const absl::Status finished = engine.FinishStep().status();
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(finished.code(), absl::StatusCode::kDeadlineExceeded) << finished;
    EXPECT_NE(finished.message().find("a reduce-scatter of"),
              absl::string_view::npos)
        << finished;
    EXPECT_NE(finished.message().find("more than the collective timeout of "
                                      "1.0 s"),
              absl::string_view::npos)
        << finished;
    EXPECT_GE(took, absl::Seconds(1));
    EXPECT_LT(took, absl::Seconds(30));
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(engine.CheckNode().code(), absl::StatusCode::kDeadlineExceeded);
    }
    // No forward runs on the weights an aborted all-gather may leave.
    EXPECT_EQ(engine.WaitWeights(0, *ranks[0].compute).code(),
              absl::StatusCode::kDeadlineExceeded);
    const absl::Status next = engine.BeginStep(2, StepOptions());
    EXPECT_EQ(next.code(), absl::StatusCode::kFailedPrecondition) << next;
    EXPECT_NE(next.message().find("collective timeout"),
              absl::string_view::npos)
        << next;
  });
  EXPECT_EQ(NewestStep(*ranks[0].job), 1u);
  EXPECT_TRUE(group->errors().empty()) << absl::StrJoin(group->errors(), "; ");
}

// Rank 0 gives up on rank 1 (timeout 1 s) while rank 1, slow but alive,
// would wait a minute: rank 1 learns of it from the node's collectives and
// fails its step at once with FAILED_PRECONDITION, not at its own timeout.
TEST_F(TransferEngineErrorTest, ASlowRankIsToldWhenItsPeerGaveUp) {
  NodeRank ranks[2];
  const std::shared_ptr<HostCollectiveGroup> group = OpenNodeOfTwoBuckets(
      "node-slow", ranks, {absl::Seconds(1), absl::Minutes(1)});
  OnTwoRanks([&](uint32_t g) {
    NodeRank& rank = ranks[g];
    ASSERT_TRUE(rank.engine->BeginStep(2, StepOptions()).ok());
    ASSERT_TRUE(rank.engine->GradientsReady(1, *rank.compute).ok());
    // Rank 1's backward of bucket 0 takes 3 s.
    if (g == 1) absl::SleepFor(absl::Seconds(3));
    (void)rank.engine->GradientsReady(0, *rank.compute);
    const absl::Time start = absl::Now();
    rank.finished = rank.engine->FinishStep().status();
    if (g == 1) {
      EXPECT_LT(absl::Now() - start, absl::Seconds(20));
    }
  });
  EXPECT_EQ(ranks[0].finished.code(), absl::StatusCode::kDeadlineExceeded)
      << ranks[0].finished;
  EXPECT_EQ(ranks[1].finished.code(), absl::StatusCode::kFailedPrecondition)
      << ranks[1].finished;
  for (NodeRank& rank : ranks) {
    EXPECT_EQ(rank.engine->BeginStep(2, StepOptions()).code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

// SynchronizeNode returns on a rank only once every rank has called it (a
// node's ranks call it after their reconciles, so that none begins its next
// step while another's reconcile may still roll the servers back), refuses a
// step in flight, and steps go on after it.
TEST_F(TransferEngineErrorTest, SynchronizeNodeReturnsOnceEveryRankCalledIt) {
  NodeRank ranks[2];
  OpenNodeOfTwoBuckets("node-sync", ranks,
                       {absl::Minutes(1), absl::Minutes(1)});
  std::atomic<bool> rank1_called{false};
  OnTwoRanks([&](uint32_t g) {
    TransferEngine& engine = *ranks[g].engine;
    if (g == 1) {
      absl::SleepFor(absl::Milliseconds(300));
      rank1_called = true;
    }
    const absl::Status synced = engine.SynchronizeNode();
    EXPECT_TRUE(synced.ok()) << synced;
    if (g == 0) {
      EXPECT_TRUE(rank1_called);
    }
    ASSERT_TRUE(engine.BeginStep(2, StepOptions()).ok());
    const absl::Status in_flight = engine.SynchronizeNode();
    EXPECT_EQ(in_flight.code(), absl::StatusCode::kFailedPrecondition)
        << in_flight;
    EXPECT_NE(in_flight.message().find("step 2 is in flight"),
              absl::string_view::npos)
        << in_flight;
    ASSERT_TRUE(NameAll(engine, *ranks[g].compute).ok());
    const absl::Status finished = engine.FinishStep().status();
    EXPECT_TRUE(finished.ok()) << finished;
    EXPECT_TRUE(engine.CheckNode().ok());
    EXPECT_TRUE(engine.SynchronizeNode().ok());
  });
  EXPECT_EQ(NewestStep(*ranks[0].job), 2u);
}

// A rank that never comes: SynchronizeNode fails at the collective timeout,
// and the node is broken for good, as after any collective that expired.
TEST_F(TransferEngineErrorTest, SynchronizeNodeExpiresWhenARankNeverComes) {
  NodeRank ranks[2];
  OpenNodeOfTwoBuckets("node-sync-alone", ranks,
                       {absl::Seconds(1), absl::Seconds(1)});
  OnTwoRanks([&](uint32_t g) {
    if (g == 1) return;
    TransferEngine& engine = *ranks[0].engine;
    const absl::Time start = absl::Now();
    const absl::Status synced = engine.SynchronizeNode();
    EXPECT_EQ(synced.code(), absl::StatusCode::kDeadlineExceeded) << synced;
    EXPECT_GE(absl::Now() - start, absl::Seconds(1));
    const absl::Status again = engine.SynchronizeNode();
    EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
    EXPECT_NE(again.message().find("SynchronizeNode: "),
              absl::string_view::npos)
        << again;
    EXPECT_EQ(engine.BeginStep(2, StepOptions()).code(),
              absl::StatusCode::kFailedPrecondition);
  });
}

// Each deliberate engine bug is caught: by the HostDevice's host-access
// checks (an engine error), by a weights mismatch with the reference, or by
// a wait queued on the compute stream. Copies are throttled to 200 MB/s so
// that what a race needs to show happens.
class TransferEngineFaultTest : public TransferEngineTest {
 protected:
  // Whether the run with `faults` shows the bug somewhere.
  std::string Caught(const EngineFaults& faults,
                     double host_to_device_bytes_per_second = 0) {
    JobConfig config = LargeJobConfig("faults", DType::kFloat32,
                                      DType::kFloat32, 1);
    const std::vector<std::string> reference = ReferenceRun(config, 1);
    TransferEngineOptions options;
    options.bucket_chunks = 2;
    options.d2h_slots = 1;
    options.h2d_slots = 1;
    options.faults = faults;
    HostDevice::Options device;
    device.copy_bytes_per_second = 200e6;
    device.host_to_device_bytes_per_second = host_to_device_bytes_per_second;
    config.name += absl::StrCat("-", ++run_);
    const std::vector<RankRun> runs = EngineRun(config, 1, options, device);
    std::vector<std::string> signs;
    for (const RankRun& run : runs) {
      if (!run.status.ok()) signs.push_back(run.status.ToString());
      if (!run.violations.empty()) signs.push_back(run.violations.front());
      for (size_t s = 0; s < run.weights.size() && s < reference.size(); ++s) {
        const std::string diff = FirstDifference(run.weights[s], reference[s]);
        if (!diff.empty()) {
          signs.push_back(absl::StrCat("step ", s + 1, " weights differ at ",
                                       diff));
          break;
        }
      }
      if (run.status.ok() && run.compute_waits != run.wait_weights_calls) {
        signs.push_back(absl::StrCat("the compute stream got ",
                                     run.compute_waits, " waits for ",
                                     run.wait_weights_calls, " WaitWeights"));
      }
    }
    return absl::StrJoin(signs, "; ");
  }
  int run_ = 0;
};

TEST_F(TransferEngineFaultTest, ACorrectEngineShowsNothing) {
  EXPECT_EQ(Caught(EngineFaults()), "");
}

TEST_F(TransferEngineFaultTest, H2dSlotReusedBeforeItsCopyRanIsCaught) {
  EngineFaults faults;
  faults.h2d_slot_free_at_enqueue = true;
  // Host-to-device copies at 20 MB/s (13 ms a chunk), far slower than the
  // chunks arrive, so the next fill finds the freed slot's copy still queued.
  EXPECT_NE(Caught(faults, 20e6), "");
}

TEST_F(TransferEngineFaultTest, H2dCopyStartedBeforeItsWeightsArrivedIsCaught) {
  EngineFaults faults;
  faults.h2d_before_fill = true;
  EXPECT_NE(Caught(faults), "");
}

TEST_F(TransferEngineFaultTest, D2hCopyBeforeTheGradientsAreReadyIsCaught) {
  EngineFaults faults;
  faults.d2h_skip_ready_wait = true;
  EXPECT_NE(Caught(faults), "");
}

TEST_F(TransferEngineFaultTest, WeightsReadBeforeTheirEventIsCaught) {
  EngineFaults faults;
  faults.weights_event_early = true;
  EXPECT_NE(Caught(faults), "");
}

TEST_F(TransferEngineFaultTest, ComputeStreamMadeToWaitIsCaught) {
  EngineFaults faults;
  faults.wait_on_compute_stream = true;
  EXPECT_NE(Caught(faults), "");
}

TEST_F(TransferEngineFaultTest, D2hSlotReusedBeforeGrpcReleasedItIsCaught) {
  EngineFaults faults;
  faults.d2h_slot_free_at_handoff = true;
  EXPECT_NE(Caught(faults), "");
}

}  // namespace
}  // namespace depot::testing
