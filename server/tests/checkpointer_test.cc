// Checkpoint captures (ShardState::EnableCaptures), the Checkpointer that
// writes them in the background, and RestoreJobs, on real shards and a real
// directory.
#include "server/checkpointer.h"

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/job_store.h"
#include "server/metrics.h"
#include "server/tests/checkpoint_test_util.h"
#include "server/tests/test_util.h"
#include "server/thread_pool.h"

namespace depot {
namespace {

using ::depot::testing::ExpectSameCheckpoint;
using ::depot::testing::Fp32Payload;
using ::depot::testing::PlainSgdConfig;
using ::depot::testing::RecordingSink;
using ::depot::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

namespace fs = std::filesystem;

// AdamW, one worker, two chunks of 8: tensor "a" [0, 5), "b" [8, 14).
JobConfig TwoChunkConfig(const std::string& name = "job") {
  JobConfig config = PlainSgdConfig({{"a", 5, 0}, {"b", 6, 1}}, 1,
                                    /*chunk_elems=*/8, /*alignment_elems=*/4);
  config.name = name;
  config.optimizer.kind = OptimizerKind::kAdamW;
  config.optimizer.lr = 0.01;
  return config;
}

// Runs step `step` on both chunks with gradient `value`, the header's
// sum-only tensors `sum_only`, and waits until both are updated (captures
// are handed on before the weights go out). Returns what the worker
// received.
std::vector<ChunkWeights> RunStep(ShardState& shard, uint64_t step, float value,
                                  SumOnlyTensors sum_only = {}) {
  auto sink = std::make_shared<RecordingSink>();
  EXPECT_TRUE(
      shard.BeginStep(step, 0, {}, {}, {}, {}, {}, std::move(sum_only)).ok());
  for (uint64_t chunk = 0; chunk < 2; ++chunk) {
    Contribution c;
    c.step = step;
    c.chunk_index = chunk;
    c.payload = Fp32Payload(std::vector<float>(8, value * (chunk + 1)));
    c.sink = sink;
    EXPECT_TRUE(shard.Contribute(std::move(c)).ok());
  }
  sink->WaitFor(2);
  return sink->received();
}

void InitShard(ShardState& shard) {
  for (uint64_t chunk = 0; chunk < 2; ++chunk) {
    std::vector<float> w(8);
    for (int i = 0; i < 8; ++i) w[i] = 0.5f * static_cast<float>(chunk * 8 + i);
    ASSERT_TRUE(shard.InitChunk(chunk, DType::kFloat32, Fp32Payload(w)).ok());
  }
}

// The shard's state now, as a checkpoint of `step`.
ShardCheckpoint ExportAt(const ShardState& shard, uint64_t step) {
  ShardCheckpoint checkpoint;
  checkpoint.config = shard.shape().config();
  checkpoint.fingerprint = shard.shape().fingerprint();
  checkpoint.server_index = shard.shape().server_index();
  checkpoint.step = step;
  EXPECT_TRUE(shard
                  .ExportChunks([&](ChunkSnapshot chunk) {
                    checkpoint.chunks.push_back(std::move(chunk));
                    return true;
                  })
                  .ok());
  return checkpoint;
}

// Captures handed on, and steps skipped, as the hooks see them.
class CaptureRecorder {
 public:
  CaptureHooks Hooks(uint64_t every_steps) {
    CaptureHooks hooks;
    hooks.every_steps = every_steps;
    hooks.on_captured = [this](std::unique_ptr<ShardCheckpoint> capture) {
      absl::MutexLock lock(&mu_);
      captures_.push_back(std::move(capture));
    };
    hooks.on_skipped = [this](uint64_t step) {
      absl::MutexLock lock(&mu_);
      skipped_.push_back(step);
    };
    return hooks;
  }
  std::unique_ptr<ShardCheckpoint> Take(size_t i) {
    absl::MutexLock lock(&mu_);
    return std::move(captures_.at(i));
  }
  size_t captures() {
    absl::MutexLock lock(&mu_);
    return captures_.size();
  }
  std::vector<uint64_t> skipped() {
    absl::MutexLock lock(&mu_);
    return skipped_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::unique_ptr<ShardCheckpoint>> captures_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> skipped_ ABSL_GUARDED_BY(mu_);
};

class CaptureTest : public ::testing::Test {
 protected:
  std::shared_ptr<ShardState> MakeShard() {
    auto shard =
        ShardState::Create(1, JobShape::Create(TwoChunkConfig(), 0).value(),
                           &pool_, PayloadPool::Create(1 << 20), &metrics_)
            .value();
    InitShard(*shard);
    return shard;
  }

  prometheus::Registry registry_;
  ServerMetrics metrics_{registry_};
  ThreadPool pool_{2};
};

TEST_F(CaptureTest, CaptureIsTheStateAtTheCaptureStep) {
  auto shard = MakeShard();
  CaptureRecorder recorder;
  shard->EnableCaptures(recorder.Hooks(2));
  RunStep(*shard, 1, 0.25f);
  EXPECT_EQ(recorder.captures(), 0u);
  RunStep(*shard, 2, -0.5f);
  ASSERT_EQ(recorder.captures(), 1u);
  std::unique_ptr<ShardCheckpoint> capture = recorder.Take(0);
  EXPECT_EQ(capture->step, 2u);
  EXPECT_EQ(capture->config.name, "job");
  ExpectSameCheckpoint(*capture, ExportAt(*shard, 2));
  EXPECT_THAT(capture->chunks[1].tensor_steps, ElementsAre(2u));
}

// Steps that run while a capture is out do not change it, and the capture
// steps meanwhile are skipped, each reported once.
TEST_F(CaptureTest, CaptureStepsAreSkippedWhileTheLastCaptureIsOut) {
  auto shard = MakeShard();
  CaptureRecorder recorder;
  shard->EnableCaptures(recorder.Hooks(1));
  RunStep(*shard, 1, 0.25f);
  const ShardCheckpoint at_step_1 = ExportAt(*shard, 1);
  RunStep(*shard, 2, 0.5f);
  RunStep(*shard, 3, 0.75f);
  ASSERT_EQ(recorder.captures(), 1u);
  EXPECT_THAT(recorder.skipped(), ElementsAre(2u, 3u));
  std::unique_ptr<ShardCheckpoint> capture = recorder.Take(0);
  ExpectSameCheckpoint(*capture, at_step_1);

  shard->ReleaseCapture(std::move(capture));
  RunStep(*shard, 4, 1.0f);
  ASSERT_EQ(recorder.captures(), 2u);
  ExpectSameCheckpoint(*recorder.Take(1), ExportAt(*shard, 4));
  EXPECT_THAT(recorder.skipped(), ElementsAre(2u, 3u));
}

// --checkpoint_max_lag_steps: while the capture of step 2 is out, a step
// more than max_lag_steps after it may not finish; giving the capture back
// opens the gate and calls those that waited. Without max_lag_steps nothing
// waits.
TEST_F(CaptureTest, StepsBeyondTheLagWaitForTheCaptureToComeBack) {
  auto shard = MakeShard();
  CaptureRecorder recorder;
  CaptureHooks hooks = recorder.Hooks(2);
  hooks.max_lag_steps = 1;
  shard->EnableCaptures(std::move(hooks));
  int opened = 0;
  auto on_open = [&opened] { ++opened; };
  RunStep(*shard, 1, 0.25f);
  EXPECT_TRUE(shard->MayFinishStep(1, on_open));
  RunStep(*shard, 2, 0.5f);
  ASSERT_EQ(recorder.captures(), 1u);
  EXPECT_TRUE(shard->MayFinishStep(2, on_open));
  EXPECT_TRUE(shard->MayFinishStep(3, on_open));   // within the lag
  EXPECT_FALSE(shard->MayFinishStep(4, on_open));  // beyond it: waits
  EXPECT_FALSE(shard->MayFinishStep(5, on_open));
  EXPECT_EQ(opened, 0);
  shard->ReleaseCapture(recorder.Take(0));
  EXPECT_EQ(opened, 2);
  EXPECT_TRUE(shard->MayFinishStep(4, on_open));
}

TEST_F(CaptureTest, WithoutAMaxLagNoStepWaits) {
  auto shard = MakeShard();
  CaptureRecorder recorder;
  shard->EnableCaptures(recorder.Hooks(1));
  RunStep(*shard, 1, 0.25f);
  ASSERT_EQ(recorder.captures(), 1u);  // out, not given back
  EXPECT_TRUE(shard->MayFinishStep(5, [] { FAIL() << "nothing waits"; }));
}

TEST_F(CaptureTest, NoCapturesWithoutEnableCaptures) {
  auto shard = MakeShard();
  CaptureRecorder recorder;
  shard->EnableCaptures(recorder.Hooks(0));
  for (uint64_t step = 1; step <= 3; ++step) RunStep(*shard, step, 0.5f);
  EXPECT_EQ(recorder.captures(), 0u);
  EXPECT_THAT(recorder.skipped(), IsEmpty());
}

// RunStep with tensor "a" (chunk 0's) sum-only, the worker filling
// captures when `fills`.
std::vector<ChunkWeights> RunSumOnlyStep(ShardState& shard, uint64_t step,
                                         float value, bool fills) {
  return RunStep(
      shard, step, value,
      SumOnlyTensors(std::string(1, '\x01'), /*omit_sums=*/true, fills));
}

// Chunk 0 of `shard` at `step` as a worker sends its state: `value` in
// every element and slot, count `count` for its one segment.
ChunkSnapshot WorkerStateOfChunk0(const ShardState& shard, uint64_t step,
                                  float value, uint64_t count) {
  ChunkSnapshot snapshot;
  snapshot.index = 0;
  snapshot.applied_step = step;
  snapshot.tensor_steps = {count};
  snapshot.master = Fp32Payload(std::vector<float>(8, value));
  for (int k = 0; k < shard.shape().slots(); ++k) {
    snapshot.slots.push_back(Fp32Payload(std::vector<float>(8, value)));
  }
  return snapshot;
}

// A step whose workers fill captures: the capture of step 2 waits for the
// state of chunk 0 (tensor "a" is sum-only), which only worker 0's answer
// asks for; the patch brings only a's elements and count, and the capture
// goes on whole. Nothing else of the capture, nor the shard, changes.
TEST_F(CaptureTest, ACaptureWaitsForTheWorkersStateOfItsSumOnlyTensors) {
  auto shard = MakeShard();
  CaptureRecorder recorder;
  shard->EnableCaptures(recorder.Hooks(2));
  RunSumOnlyStep(*shard, 1, 0.25f, true);
  const std::vector<ChunkWeights> answers =
      RunSumOnlyStep(*shard, 2, 0.5f, true);
  ASSERT_EQ(answers.size(), 2u);
  for (const ChunkWeights& w : answers) {
    EXPECT_EQ(w.capture_wanted, w.chunk_index == 0) << w.chunk_index;
  }
  EXPECT_EQ(recorder.captures(), 0u);  // waits
  const ShardCheckpoint live = ExportAt(*shard, 2);
  EXPECT_TRUE(live.chunks[0].lacks_worker_state);
  EXPECT_FALSE(live.chunks[1].lacks_worker_state);

  // Refused, with nothing changed: a chunk it does not wait for, another
  // step, a chunk of another step than the capture's.
  std::vector<ChunkSnapshot> chunk1 = {ExportAt(*shard, 2).chunks[1]};
  EXPECT_EQ(shard->PatchCapture(2, chunk1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      shard->PatchCapture(3, {WorkerStateOfChunk0(*shard, 3, 1, 1)}).code(),
      absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      shard->PatchCapture(2, {WorkerStateOfChunk0(*shard, 1, 1, 1)}).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(recorder.captures(), 0u);

  ASSERT_TRUE(
      shard->PatchCapture(2, {WorkerStateOfChunk0(*shard, 2, 7.0f, 2)}).ok());
  ASSERT_EQ(recorder.captures(), 1u);
  std::unique_ptr<ShardCheckpoint> capture = recorder.Take(0);
  EXPECT_EQ(capture->step, 2u);
  EXPECT_FALSE(capture->LacksWorkerState());
  ShardCheckpoint expected = ExportAt(*shard, 2);  // the shard is unchanged
  expected.chunks[0].lacks_worker_state = false;
  expected.chunks[0].tensor_steps = {2};
  expected.chunks[0].optimizer_step = 2;
  for (int i = 0; i < 5; ++i) {  // a's elements; padding [5, 8) stays
    std::memcpy(expected.chunks[0].master.data() + 4 * i, "\0\0\xe0\x40", 4);
    for (std::string& slot : expected.chunks[0].slots) {
      std::memcpy(slot.data() + 4 * i, "\0\0\xe0\x40", 4);  // 7.0f
    }
  }
  ExpectSameCheckpoint(*capture, expected);
  EXPECT_TRUE(ExportAt(*shard, 2).chunks[0].lacks_worker_state);
  // Handed on: a second patch finds no capture waiting.
  EXPECT_EQ(
      shard->PatchCapture(2, {WorkerStateOfChunk0(*shard, 2, 1, 1)}).code(),
      absl::StatusCode::kFailedPrecondition);
}

// The workers' state of step 1 never comes: at the next capture step the
// capture goes as it is, chunk 0 marked as lacking it, and step 2 is
// skipped. Without fills_captures a capture goes at once, also marked.
TEST_F(CaptureTest, ACaptureWhoseWorkersStateNeverComesGoesWithoutIt) {
  auto shard = MakeShard();
  CaptureRecorder recorder;
  shard->EnableCaptures(recorder.Hooks(1));
  RunSumOnlyStep(*shard, 1, 0.25f, true);
  EXPECT_EQ(recorder.captures(), 0u);
  RunSumOnlyStep(*shard, 2, 0.5f, true);
  ASSERT_EQ(recorder.captures(), 1u);
  EXPECT_THAT(recorder.skipped(), ElementsAre(2u));
  std::unique_ptr<ShardCheckpoint> capture = recorder.Take(0);
  EXPECT_EQ(capture->step, 1u);
  EXPECT_TRUE(capture->chunks[0].lacks_worker_state);
  EXPECT_FALSE(capture->chunks[1].lacks_worker_state);
  shard->ReleaseCapture(std::move(capture));

  const std::vector<ChunkWeights> answers =
      RunSumOnlyStep(*shard, 3, 0.75f, false);
  for (const ChunkWeights& w : answers) EXPECT_FALSE(w.capture_wanted);
  ASSERT_EQ(recorder.captures(), 2u);
  capture = recorder.Take(1);
  EXPECT_EQ(capture->step, 3u);
  EXPECT_TRUE(capture->chunks[0].lacks_worker_state);
  EXPECT_FALSE(capture->chunks[1].lacks_worker_state);
}

// A patch of the shard's own state (the workers' state written between
// steps) clears the flag; an on-demand capture then holds the whole state,
// and it takes the place of a periodic capture that only waits.
TEST_F(CaptureTest,
       APatchClearsTheFlagAndAnOnDemandCaptureReplacesAWaitingOne) {
  auto shard = MakeShard();
  CaptureRecorder recorder;
  shard->EnableCaptures(recorder.Hooks(2));
  RunSumOnlyStep(*shard, 1, 0.25f, true);
  RunSumOnlyStep(*shard, 2, 0.5f, true);
  EXPECT_EQ(recorder.captures(), 0u);  // waits
  absl::StatusOr<std::unique_ptr<ShardCheckpoint>> now = shard->CaptureNow();
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_TRUE((*now)->chunks[0].lacks_worker_state);
  shard->ReleaseCapture(*std::move(now));

  ASSERT_TRUE(
      shard->PatchChunks({WorkerStateOfChunk0(*shard, 2, 3.0f, 2)}).ok());
  EXPECT_FALSE(ExportAt(*shard, 2).chunks[0].lacks_worker_state);
  now = shard->CaptureNow();
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_FALSE((*now)->LacksWorkerState());
  // The waiting capture was dropped: its patch is refused, nothing handed on.
  EXPECT_EQ(
      shard->PatchCapture(2, {WorkerStateOfChunk0(*shard, 2, 1, 1)}).code(),
      absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(recorder.captures(), 0u);
}

// --checkpoint_max_lag_steps covers a capture that waits for the workers'
// state: later steps may not finish until it is written and given back, or
// until an import drops it.
TEST_F(CaptureTest, AWaitingCaptureHoldsTheGateUntilGivenBackOrDropped) {
  auto shard = MakeShard();
  CaptureRecorder recorder;
  CaptureHooks hooks = recorder.Hooks(2);
  hooks.max_lag_steps = 0;
  shard->EnableCaptures(std::move(hooks));
  int opened = 0;
  auto on_open = [&opened] { ++opened; };
  RunSumOnlyStep(*shard, 1, 0.25f, true);
  RunSumOnlyStep(*shard, 2, 0.5f, true);
  EXPECT_EQ(recorder.captures(), 0u);  // waits
  EXPECT_FALSE(shard->MayFinishStep(3, on_open));
  ASSERT_TRUE(
      shard->PatchCapture(2, {WorkerStateOfChunk0(*shard, 2, 7.0f, 2)}).ok());
  ASSERT_EQ(recorder.captures(), 1u);
  EXPECT_EQ(opened, 0);  // handed on, not yet written
  shard->ReleaseCapture(recorder.Take(0));
  EXPECT_EQ(opened, 1);

  RunSumOnlyStep(*shard, 3, 0.75f, true);
  RunSumOnlyStep(*shard, 4, 1.0f, true);
  EXPECT_FALSE(shard->MayFinishStep(5, on_open));
  const ShardCheckpoint state = ExportAt(*shard, 4);
  ASSERT_TRUE(shard->ImportChunks(state.chunks).ok());
  EXPECT_EQ(opened, 2);
  EXPECT_TRUE(shard->MayFinishStep(5, on_open));
  EXPECT_EQ(recorder.captures(), 1u);  // dropped, never handed on
}

// A store with a checkpointer on a real directory, as the daemon wires them.
class CheckpointerTest : public ::testing::Test {
 protected:
  CheckpointerTest() { Start(); }
  ~CheckpointerTest() override { Stop(); }

  void Start(FileSyncFn sync = SystemFileSync(), uint64_t every_steps = 2,
             int keep = 2, uint64_t write_bytes_per_second = 0) {
    dir_ = CheckpointDirectory::Open(temp_.path() + "/ckpt", std::move(sync))
               .value();
    store_ = std::make_unique<JobStore>(/*memory_limit_bytes=*/1 << 20, &pool_,
                                        &metrics_);
    CheckpointPolicy policy;
    policy.every_steps = every_steps;
    policy.keep = keep;
    policy.write_bytes_per_second = write_bytes_per_second;
    checkpointer_ = std::make_unique<Checkpointer>(
        dir_.get(), policy, &metrics_, [this](const std::string& line) {
          absl::MutexLock lock(&log_mu_);
          log_.push_back(line);
        });
    store_->SetListener(checkpointer_.get(), every_steps);
  }

  // The daemon's order: jobs first, then the checkpointer, then the lock.
  void Stop() {
    if (checkpointer_ != nullptr) checkpointer_->Stop();
    store_.reset();
    checkpointer_.reset();
    dir_.reset();
  }

  std::shared_ptr<ShardState> Create(const std::string& name = "job") {
    absl::StatusOr<OpenedJob> opened =
        store_->CreateOrAttach(TwoChunkConfig(name), 0);
    EXPECT_TRUE(opened.ok()) << opened.status();
    InitShard(*opened->shard);
    return opened->shard;
  }

  // Stops the store and the checkpointer, starts new ones on the same
  // directory and restores from it, as a restarted server does; returns the
  // number of jobs restored, and the restore's log lines in `lines`.
  int RestartAndRestore(std::vector<std::string>* lines) {
    Stop();
    Start();
    return RestoreJobs(*dir_, *store_, metrics_, [&](const std::string& line) {
      lines->push_back(line);
    });
  }

  std::string Log() {
    absl::MutexLock lock(&log_mu_);
    std::string all;
    for (const std::string& line : log_) all += line + "\n";
    return all;
  }

  TempDir temp_;
  prometheus::Registry registry_;
  ServerMetrics metrics_{registry_};
  ThreadPool pool_{2};
  std::unique_ptr<CheckpointDirectory> dir_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<Checkpointer> checkpointer_;
  absl::Mutex log_mu_;
  std::vector<std::string> log_ ABSL_GUARDED_BY(log_mu_);
};

TEST_F(CheckpointerTest, WritesEachCaptureStepAndKeepsTheLastK) {
  auto shard = Create();
  for (uint64_t step = 1; step <= 6; ++step) {
    RunStep(*shard, step, 0.125f * static_cast<float>(step));
    checkpointer_->Flush();
  }
  EXPECT_THAT(dir_->CompleteSteps(JobKey{"", "job"}), ElementsAre(6u, 4u));
  absl::StatusOr<ShardCheckpoint> loaded = dir_->Load(JobKey{"", "job"}, 6);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ExpectSameCheckpoint(*loaded, ExportAt(*shard, 6));
  EXPECT_EQ(metrics_.checkpoints_written.Value(), 3.0);
  EXPECT_GT(metrics_.checkpoint_bytes.Value(), 0.0);
  EXPECT_GT(metrics_.checkpoint_last_success.Value(), 0.0);
  EXPECT_EQ(metrics_.checkpoint_failures.Value(), 0.0);
  EXPECT_THAT(Log(), HasSubstr("checkpoint of job \"job\" at step 6 written"));
}

// A shutdown that cannot wait: Abandon wakes a write from its pacing and
// stops it; its Checkpoint call gets UNAVAILABLE, nothing of its step looks
// complete, the older checkpoint stays, and later captures are not written.
TEST_F(CheckpointerTest, AbandonStopsAPacedWriteAndKeepsTheOlderCheckpoint) {
  Stop();
  // A few hundred bytes a second: the write of a capture takes seconds.
  Start(SystemFileSync(), /*every_steps=*/2, /*keep=*/2,
        /*write_bytes_per_second=*/256);
  auto shard = Create();
  RunStep(*shard, 1, 0.5f);
  RunStep(*shard, 2, 0.25f);
  checkpointer_->Flush();
  ASSERT_THAT(dir_->CompleteSteps(JobKey{"", "job"}), ElementsAre(2u));
  RunStep(*shard, 3, 0.125f);

  absl::StatusOr<uint64_t> taken;
  std::thread call([&] { taken = checkpointer_->CheckpointNow(shard); });
  while (checkpointer_->Pending() == 0) std::this_thread::yield();
  EXPECT_FALSE(checkpointer_->FlushUntil(absl::Now() + absl::Milliseconds(50)))
      << "the paced write ended early";
  checkpointer_->Abandon();
  call.join();
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kUnavailable)
      << taken.status();
  EXPECT_THAT(taken.status().message(), HasSubstr("shutting down"));
  RunStep(*shard, 4, 0.0625f);  // a capture step after the abandonment
  checkpointer_->Flush();
  EXPECT_THAT(dir_->CompleteSteps(JobKey{"", "job"}), ElementsAre(2u));
  EXPECT_EQ(metrics_.checkpoint_failures.Value(), 0.0)
      << "an abandoned write is not the disk's failure";
  EXPECT_THAT(Log(), HasSubstr("at step 3 not written: the server is "
                               "shutting down"));
  for (const auto& entry : fs::recursive_directory_iterator(dir_->root())) {
    EXPECT_THAT(entry.path().string(), ::testing::Not(HasSubstr(".tmp-")));
  }
}

TEST_F(CheckpointerTest, ChecksumOfRestoredJobEqualsTheCheckpointedOne) {
  auto shard = Create();
  for (uint64_t step = 1; step <= 4; ++step) {
    RunStep(*shard, step, 0.3f);
    checkpointer_->Flush();
  }
  const uint64_t checksum = shard->Checksum();
  shard.reset();
  std::vector<std::string> lines;
  EXPECT_EQ(RestartAndRestore(&lines), 1);
  EXPECT_EQ(metrics_.jobs_restored.Value(), 1.0);
  std::vector<std::shared_ptr<ShardState>> jobs = store_->Jobs();
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0]->completed_step(), 4u);
  EXPECT_EQ(jobs[0]->Checksum(), checksum);

  // CreateJob with the same name and config attaches to it.
  absl::StatusOr<OpenedJob> attached =
      store_->CreateOrAttach(TwoChunkConfig(), 0);
  ASSERT_TRUE(attached.ok()) << attached.status();
  EXPECT_FALSE(attached->created);
  EXPECT_EQ(attached->shard, jobs[0]);
  JobConfig other = TwoChunkConfig();
  other.optimizer.lr = 0.02;
  EXPECT_EQ(store_->CreateOrAttach(other, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // And it goes on: the next checkpoint step is written as before.
  RunStep(*jobs[0], 5, 0.1f);
  RunStep(*jobs[0], 6, 0.1f);  // the restored job's capture step 4 is over
  checkpointer_->Flush();
  EXPECT_THAT(dir_->CompleteSteps(JobKey{"", "job"}), ElementsAre(6u, 4u));
}

TEST_F(CheckpointerTest, RestoreSkipsDamagedNewestCheckpoint) {
  auto shard = Create();
  uint64_t checksum_at_2 = 0;
  for (uint64_t step = 1; step <= 4; ++step) {
    RunStep(*shard, step, 0.3f);
    checkpointer_->Flush();
    if (step == 2) checksum_at_2 = shard->Checksum();
  }
  checkpointer_->Flush();
  const std::string file =
      dir_->StepDirectory(JobKey{"", "job"}, 4) + "/shard-0-of-1.ckpt";
  std::string bytes = testing::ReadFileBytes(file);
  bytes[bytes.size() - 10] ^= 0x08;
  testing::WriteFileBytes(file, bytes);
  shard.reset();
  std::vector<std::string> lines;
  EXPECT_EQ(RestartAndRestore(&lines), 1);
  ASSERT_EQ(store_->Jobs().size(), 1u);
  EXPECT_EQ(store_->Jobs()[0]->completed_step(), 2u);
  EXPECT_EQ(store_->Jobs()[0]->Checksum(), checksum_at_2);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[0], HasSubstr("step 4 cannot be used"));
  EXPECT_THAT(lines[0], HasSubstr("DATA_LOSS"));
  EXPECT_THAT(lines[1], HasSubstr("at step 2"));
}

TEST_F(CheckpointerTest, UnrestorableJobIsCountedAndLogged) {
  auto shard = Create();
  RunStep(*shard, 1, 0.3f);
  RunStep(*shard, 2, 0.3f);
  checkpointer_->Flush();
  fs::remove(dir_->StepDirectory(JobKey{"", "job"}, 2) + "/shard-0-of-1.ckpt");
  shard.reset();
  std::vector<std::string> lines;
  EXPECT_EQ(RestartAndRestore(&lines), 0);
  EXPECT_EQ(metrics_.job_restore_failures.Value(), 1.0);
  EXPECT_THAT(store_->Jobs(), IsEmpty());
  ASSERT_FALSE(lines.empty());
  EXPECT_THAT(lines.back(), HasSubstr("job \"job\" NOT restored"));

  // A job of that name created afresh moves the leftovers aside.
  Create();
  checkpointer_->Flush();
  EXPECT_THAT(dir_->Jobs(), IsEmpty());
  EXPECT_THAT(Log(), HasSubstr("were moved to"));
}

TEST_F(CheckpointerTest, DeletingAJobRemovesItsCheckpoints) {
  auto shard = Create();
  RunStep(*shard, 1, 0.3f);
  RunStep(*shard, 2, 0.3f);
  checkpointer_->Flush();
  ASSERT_THAT(dir_->CompleteSteps(JobKey{"", "job"}), ElementsAre(2u));
  ASSERT_TRUE(
      store_->Delete(shard->job_id(), shard->shape().fingerprint()).ok());
  checkpointer_->Flush();
  EXPECT_FALSE(fs::exists(dir_->JobDirectory(JobKey{"", "job"})));
}

// After ImportState the job's checkpoints describe a history it has left: a
// crash must not bring that back, so they go, and the next capture step
// writes the imported history's first one.
TEST_F(CheckpointerTest, ReplacedStateRemovesTheCheckpoints) {
  auto shard = Create();
  for (uint64_t step = 1; step <= 4; ++step) {
    RunStep(*shard, step, 0.3f);
    checkpointer_->Flush();
  }
  ASSERT_THAT(dir_->CompleteSteps(JobKey{"", "job"}), ElementsAre(4u, 2u));
  std::vector<ChunkSnapshot> earlier = ExportAt(*shard, 4).chunks;
  for (ChunkSnapshot& chunk : earlier) chunk.applied_step = 1;
  for (ChunkSnapshot& chunk : earlier) {
    for (uint64_t& count : chunk.tensor_steps) count = 1;
  }
  ASSERT_TRUE(shard->ImportChunks(std::move(earlier)).ok());
  store_->NoteStateReplaced(shard);
  checkpointer_->Flush();
  EXPECT_THAT(dir_->CompleteSteps(JobKey{"", "job"}), IsEmpty());
  EXPECT_THAT(Log(), HasSubstr("replaced by ImportState"));

  RunStep(*shard, 2, 0.3f);
  checkpointer_->Flush();
  EXPECT_THAT(dir_->CompleteSteps(JobKey{"", "job"}), ElementsAre(2u));
  ExpectSameCheckpoint(dir_->Load(JobKey{"", "job"}, 2).value(),
                       ExportAt(*shard, 2));
}

TEST_F(CheckpointerTest,
       FailedFsyncFailsThatCheckpointLoudlyAndTheNextIsWritten) {
  Stop();
  int shard_file_syncs = 0;
  Start([&](int fd) {
    const std::string path =
        fs::read_symlink("/proc/self/fd/" + std::to_string(fd)).string();
    if (path.find("shard-0-of-1.ckpt.tmp-") != std::string::npos &&
        ++shard_file_syncs == 1) {
      errno = EIO;
      return -1;
    }
    return ::fsync(fd);
  });
  auto shard = Create();
  RunStep(*shard, 1, 0.3f);
  RunStep(*shard, 2, 0.3f);
  checkpointer_->Flush();
  EXPECT_EQ(metrics_.checkpoint_failures.Value(), 1.0);
  EXPECT_THAT(Log(), HasSubstr("CHECKPOINT FAILED: job \"job\" step 2"));
  EXPECT_THAT(Log(), HasSubstr("fsync failed"));
  EXPECT_THAT(dir_->CompleteSteps(JobKey{"", "job"}), IsEmpty());

  RunStep(*shard, 3, 0.3f);
  RunStep(*shard, 4, 0.3f);
  checkpointer_->Flush();
  EXPECT_EQ(shard_file_syncs, 2);
  EXPECT_THAT(dir_->CompleteSteps(JobKey{"", "job"}), ElementsAre(4u));
  EXPECT_EQ(metrics_.checkpoints_written.Value(), 1.0);
}

TEST_F(CheckpointerTest, EachJobCountsTwiceItsStateAgainstTheBudget) {
  Stop();
  TempDir temp;
  auto dir = CheckpointDirectory::Open(temp.path() + "/c").value();
  const JobShape shape = JobShape::Create(TwoChunkConfig(), 0).value();
  const uint64_t state = shape.state_bytes();
  // Besides the state, each job counts the weights kept for pulls at a step
  // and its bookkeeping.
  const uint64_t kept =
      shape.kept_weights_bytes() + ShardState::BookkeepingBytes(shape);
  JobStore store(/*memory_limit_bytes=*/state * 3 + kept, &pool_, &metrics_);
  CheckpointPolicy policy;
  policy.every_steps = 1;
  Checkpointer checkpointer(dir.get(), policy, &metrics_,
                            [](const std::string&) {});
  store.SetListener(&checkpointer, policy.every_steps);
  ASSERT_TRUE(store.CreateOrAttach(TwoChunkConfig("one"), 0).ok());
  EXPECT_EQ(store.state_bytes(), 2 * state + kept);
  absl::StatusOr<OpenedJob> second =
      store.CreateOrAttach(TwoChunkConfig("two"), 0);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(second.status().message(), HasSubstr("checkpoints are on"));
  checkpointer.Stop();
}

// A job's own checkpoint_every_steps: checkpointed at its interval on a
// server whose --checkpoint_every_steps is 0, counted twice in the budget
// there, and refused by a server without --checkpoint_dir.
TEST_F(CheckpointerTest, AJobsOwnIntervalOverridesTheServers) {
  Stop();
  Start(SystemFileSync(), /*every_steps=*/0);
  JobConfig config = TwoChunkConfig("own");
  config.checkpoint_every_steps = 3;
  absl::StatusOr<OpenedJob> opened = store_->CreateOrAttach(config, 0);
  ASSERT_TRUE(opened.ok()) << opened.status();
  const JobShape& shape = opened->shard->shape();
  EXPECT_EQ(store_->state_bytes(),
            2 * shape.state_bytes() + shape.kept_weights_bytes() +
                ShardState::BookkeepingBytes(shape));
  InitShard(*opened->shard);
  // A job without its own interval on the same server is not checkpointed.
  std::shared_ptr<ShardState> plain = Create("plain");
  for (uint64_t step = 1; step <= 6; ++step) {
    RunStep(*opened->shard, step, 0.125f * static_cast<float>(step));
    RunStep(*plain, step, 0.125f * static_cast<float>(step));
    checkpointer_->Flush();
  }
  EXPECT_THAT(dir_->CompleteSteps(JobKey{"", "own"}), ElementsAre(6u, 3u));
  EXPECT_THAT(dir_->CompleteSteps(JobKey{"", "plain"}), IsEmpty());
  // Attaching with another interval attaches (not part of the identity).
  JobConfig other = config;
  other.checkpoint_every_steps = 5;
  absl::StatusOr<OpenedJob> attached = store_->CreateOrAttach(other, 0);
  ASSERT_TRUE(attached.ok()) << attached.status();
  EXPECT_FALSE(attached->created);

  JobStore no_dir(/*memory_limit_bytes=*/1 << 20, &pool_, &metrics_);
  absl::StatusOr<OpenedJob> refused = no_dir.CreateOrAttach(config, 0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("--checkpoint_dir"));
}

}  // namespace
}  // namespace depot
