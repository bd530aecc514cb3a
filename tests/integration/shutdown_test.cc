// SIGTERM under load (issue 12 part 7, issue 13's "shutdown never hangs"):
// a real depot-server is stopped while an export, a checkpoint write or a step
// is in flight. Each test checks that the server exits within its grace
// period plus a small bound, that the client sees a retryable UNAVAILABLE
// saying the server is shutting down (or its call completed), and, where a
// checkpoint was being written, that a server restarted on the same
// directory restores the newest complete checkpoint: never a half-written
// one.
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client_training.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "raw_driver.h"
#include "server_process.h"
#include "training_data.h"
#include "wire/wire.h"

namespace depot::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr uint64_t kSeed = 5;
// What depot-server allows itself after the grace period (main.cc's
// kShutdownOverrun), plus time for the process to be reaped on a loaded
// machine.
constexpr absl::Duration kExitBound = absl::Seconds(7);

// Waits until the server's log holds `text` (the log is written line by line
// as things happen); its log on failure.
absl::Status WaitForLog(const ServerProcess& server, const std::string& text,
                        absl::Duration timeout = absl::Seconds(60)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!absl::StrContains(server.Log(), text)) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no \"", text, "\" in the server's log:\n", server.Log()));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return absl::OkStatus();
}

// SIGTERMs `server` and expects it to exit 0 within `grace` + kExitBound.
void ExpectExitWithinBound(ServerProcess& server, absl::Duration grace) {
  const absl::Time start = absl::Now();
  ASSERT_TRUE(server.Signal(SIGTERM).ok());
  absl::StatusOr<ProcessExit> exit = server.Wait(grace + kExitBound);
  ASSERT_TRUE(exit.ok()) << "still running " << absl::Now() - start
                         << " after SIGTERM:\n"
                         << server.Log();
  EXPECT_EQ(exit->exit_code, 0) << "signal " << exit->signal << "\n"
                                << server.Log();
}

class ShutdownTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") +
                          "/depot-shutdown-test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
  }
  void TearDown() override {
    server_.reset();
    training_.reset();
    fs::remove_all(root_);
  }

  void StartServer(absl::Duration grace, std::vector<std::string> flags = {}) {
    flags.push_back(absl::StrCat("--shutdown_grace_seconds=",
                                 absl::ToDoubleSeconds(grace)));
    flags.push_back("--threads=2");
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::Start(flags);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::string CheckpointDir() const { return root_ + "/checkpoints"; }

  // Flags of a server checkpointing into CheckpointDir() at `bytes_per_second`
  // (slow enough that a test can signal it mid-write).
  std::vector<std::string> CheckpointFlags(uint64_t bytes_per_second,
                                           uint64_t every_steps = 0) const {
    return {
        absl::StrCat("--checkpoint_dir=", CheckpointDir()),
        absl::StrCat("--checkpoint_every_steps=", every_steps),
        absl::StrCat("--checkpoint_write_bytes_per_second=", bytes_per_second)};
  }

  // One worker training `config` on the server.
  std::unique_ptr<ClientTraining> Open(
      const JobConfig& config, absl::Duration step_timeout = absl::Minutes(2)) {
    absl::StatusOr<std::unique_ptr<ClientTraining>> training =
        ClientTraining::Open({server_->grpc_address()}, config, step_timeout,
                             ClientOptions().connections_per_server,
                             /*unavailable_retry=*/absl::ZeroDuration());
    EXPECT_TRUE(training.ok()) << training.status();
    return training.ok() ? *std::move(training) : nullptr;
  }

  // Opens SmallJobConfig("ckpt") for one worker into training_ and
  // initialises it.
  void OpenSmallJob() {
    training_ = Open(SmallJobConfig("ckpt", 1, 1));
    ASSERT_NE(training_, nullptr);
    ASSERT_TRUE(training_->InitWeights(kSeed, DType::kFloat32).ok());
  }

  void Train(uint64_t first, uint64_t last) {
    for (uint64_t step = first; step <= last; ++step) {
      const absl::Status status = training_->RunStep(kSeed, step, 0).status;
      ASSERT_TRUE(status.ok()) << "step " << step << ": " << status;
    }
  }

  // Waits until a temporary file of a checkpoint write exists: a write is
  // under way.
  absl::Status WaitForWriteInProgress() {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      std::error_code error;
      for (fs::recursive_directory_iterator it(CheckpointDir(), error), end;
           !error && it != end; it.increment(error)) {
        if (absl::StrContains(it->path().filename().string(), ".tmp-")) {
          return absl::OkStatus();
        }
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    return absl::DeadlineExceededError(
        absl::StrCat("no checkpoint write began:\n", server_->Log()));
  }

  // No temporary file is left in the checkpoint directory.
  void ExpectNoTemporaryFiles() {
    for (const auto& entry :
         fs::recursive_directory_iterator(CheckpointDir())) {
      EXPECT_THAT(entry.path().filename().string(),
                  ::testing::Not(HasSubstr(".tmp-")));
    }
  }

  // Restarts the server on CheckpointDir() and expects it to restore job
  // `name` at step `step`.
  void ExpectRestoredAt(const std::string& name, uint64_t step) {
    StartServer(absl::Seconds(10),
                {absl::StrCat("--checkpoint_dir=", CheckpointDir())});
    ASSERT_NO_FATAL_FAILURE();
    EXPECT_THAT(server_->Log(),
                HasSubstr(absl::StrCat(
                    "\"", name, "\" (server 0 of 1) at step ", step, " from")));
  }

  std::string root_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<ClientTraining> training_;
};

// A job whose exported state (AdamW: 12 bytes a parameter, 96 MiB) is far
// more than gRPC buffers, so that an export whose reader pauses stays in
// flight on the server.
JobConfig BigJobConfig(const std::string& name) {
  JobConfig config = SmallJobConfig(name, 1, 1);
  config.tensors = {{"big", uint64_t{8} << 20, 0}, {"bias", 1000, 1}};
  config.chunk_elems = uint64_t{1} << 16;
  return config;
}

// Starts an ExportState of `job_id` and reads its first chunk.
struct PausedExport {
  PausedExport(const std::string& address, const v1::CreateJobResponse& job)
      : stub(NewDepotStub(address)) {
    v1::ExportStateRequest request;
    request.set_job_id(job.job_id());
    request.set_fingerprint(job.fingerprint());
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(2)));
    reader = stub->ExportState(&context, request);
    EXPECT_TRUE(reader->Read(&chunk)) << reader->Finish().error_message();
    chunks = 1;
  }
  // Reads the rest; the call's status.
  grpc::Status ReadToTheEnd() {
    while (reader->Read(&chunk)) ++chunks;
    return reader->Finish();
  }

  std::unique_ptr<v1::Depot::Stub> stub;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::StateChunk>> reader;
  v1::StateChunk chunk;
  uint64_t chunks = 0;
};

v1::CreateJobResponse CreateRawJob(const std::string& address,
                                   const JobConfig& config) {
  v1::CreateJobRequest request;
  JobConfigToProto(config, request.mutable_spec());
  v1::CreateJobResponse response;
  grpc::Status s =
      RawCreateJob(*NewDepotStub(address), request.spec(), 0, &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return response;
}

TEST_F(ShutdownTest, ExportInFlightAtSigtermRunsToItsEnd) {
  const absl::Duration grace = absl::Seconds(60);
  ASSERT_NO_FATAL_FAILURE(StartServer(grace));
  const v1::CreateJobResponse job =
      CreateRawJob(server_->grpc_address(), BigJobConfig("export"));
  PausedExport paused(server_->grpc_address(), job);

  ASSERT_TRUE(server_->Signal(SIGTERM).ok());
  ASSERT_TRUE(WaitForLog(*server_, "draining").ok());
  EXPECT_THAT(server_->Log(), HasSubstr("0 Step stream(s), 1 other RPC(s)"))
      << "the export should have been in flight when the drain began";
  const grpc::Status status = paused.ReadToTheEnd();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(paused.chunks, job.end_chunk() - job.first_chunk());
  // Nothing else holds it: it exits now, long before its grace ends.
  absl::StatusOr<ProcessExit> exit = server_->Wait(kExitBound);
  ASSERT_TRUE(exit.ok()) << server_->Log();
  EXPECT_EQ(exit->exit_code, 0) << server_->Log();
}

TEST_F(ShutdownTest, ExportStillRunningAfterTheGraceFailsWithUnavailable) {
  const absl::Duration grace = absl::Seconds(1);
  ASSERT_NO_FATAL_FAILURE(StartServer(grace));
  const v1::CreateJobResponse job =
      CreateRawJob(server_->grpc_address(), BigJobConfig("export"));
  PausedExport paused(server_->grpc_address(), job);

  const absl::Time start = absl::Now();
  ASSERT_TRUE(server_->Signal(SIGTERM).ok());
  ASSERT_TRUE(WaitForLog(*server_, "grace period over").ok());
  const grpc::Status status = paused.ReadToTheEnd();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << status.error_code() << " " << status.error_message();
  EXPECT_LT(paused.chunks, job.end_chunk() - job.first_chunk());
  absl::StatusOr<ProcessExit> exit =
      server_->Wait(grace + kExitBound - (absl::Now() - start));
  ASSERT_TRUE(exit.ok()) << server_->Log();
  EXPECT_EQ(exit->exit_code, 0) << server_->Log();
}

// The client library's SaveState against a server that is shutting down: a
// retryable UNAVAILABLE naming the shutdown, not a crash or a hang.
TEST_F(ShutdownTest, SaveStateDuringTheDrainIsUnavailable) {
  const absl::Duration grace = absl::Seconds(60);
  ASSERT_NO_FATAL_FAILURE(StartServer(grace));
  const v1::CreateJobResponse job =
      CreateRawJob(server_->grpc_address(), BigJobConfig("export"));
  std::unique_ptr<ClientTraining> training = Open(BigJobConfig("export"));
  ASSERT_NE(training, nullptr);
  // The paused export keeps the server draining while the client saves.
  PausedExport paused(server_->grpc_address(), job);
  ASSERT_TRUE(server_->Signal(SIGTERM).ok());
  ASSERT_TRUE(WaitForLog(*server_, "draining").ok());

  absl::StatusOr<std::string> saved = training->job(0).SaveState();
  EXPECT_EQ(saved.status().code(), absl::StatusCode::kUnavailable)
      << saved.status();
  EXPECT_THAT(saved.status().message(), HasSubstr("shutting down"));
  EXPECT_TRUE(paused.ReadToTheEnd().ok());
  absl::StatusOr<ProcessExit> exit = server_->Wait(kExitBound);
  ASSERT_TRUE(exit.ok()) << server_->Log();
  EXPECT_EQ(exit->exit_code, 0);
}

// A Checkpoint call whose write is under way at SIGTERM: with time enough,
// the write completes, the call succeeds and a restart restores it.
TEST_F(ShutdownTest, CheckpointWriteInFlightAtSigtermCompletes) {
  const absl::Duration grace = absl::Seconds(60);
  // SmallJobConfig's shard file is about 33 KB: some 2 s at 16 KB/s.
  ASSERT_NO_FATAL_FAILURE(StartServer(grace, CheckpointFlags(16 << 10)));
  ASSERT_NO_FATAL_FAILURE(OpenSmallJob());
  ASSERT_NO_FATAL_FAILURE(Train(1, 1));

  absl::StatusOr<uint64_t> taken;
  std::thread call([&] { taken = training_->job(0).Checkpoint(); });
  ASSERT_TRUE(WaitForWriteInProgress().ok());
  ASSERT_TRUE(server_->Signal(SIGTERM).ok());
  call.join();
  ASSERT_TRUE(taken.ok()) << taken.status() << "\n" << server_->Log();
  EXPECT_EQ(*taken, 1u);
  absl::StatusOr<ProcessExit> exit = server_->Wait(kExitBound);
  ASSERT_TRUE(exit.ok()) << server_->Log();
  EXPECT_EQ(exit->exit_code, 0) << server_->Log();
  ExpectNoTemporaryFiles();
  ExpectRestoredAt("ckpt", 1);
}

// ... without time enough, the write is abandoned: the call fails with a
// retryable UNAVAILABLE, the server exits within its bound, and a restart
// restores the previous complete checkpoint.
TEST_F(ShutdownTest, CheckpointWriteCutOffByTheGraceLeavesThePreviousOne) {
  const absl::Duration grace = absl::Seconds(1);
  // Step 2's periodic checkpoint, then a Checkpoint call at step 3 whose
  // write (about 33 KB at 8 KB/s) outlasts the grace by far.
  ASSERT_NO_FATAL_FAILURE(StartServer(grace, CheckpointFlags(8 << 10, 2)));
  ASSERT_NO_FATAL_FAILURE(OpenSmallJob());
  ASSERT_NO_FATAL_FAILURE(Train(1, 3));
  ASSERT_TRUE(WaitForLog(*server_, "at step 2 written").ok());

  absl::StatusOr<uint64_t> taken;
  std::thread call([&] { taken = training_->job(0).Checkpoint(); });
  ASSERT_TRUE(WaitForWriteInProgress().ok());
  ASSERT_NO_FATAL_FAILURE(ExpectExitWithinBound(*server_, grace));
  call.join();
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kUnavailable)
      << taken.status();
  EXPECT_THAT(taken.status().message(), HasSubstr("shutting down"));
  EXPECT_THAT(server_->Log(), HasSubstr("at step 3 not written"));
  ExpectNoTemporaryFiles();
  ExpectRestoredAt("ckpt", 2);
}

// The same for a periodic checkpoint written in the background.
TEST_F(ShutdownTest, BackgroundCheckpointCutOffByTheGraceLeavesThePreviousOne) {
  const absl::Duration grace = absl::Seconds(1);
  ASSERT_NO_FATAL_FAILURE(StartServer(grace, CheckpointFlags(8 << 10, 2)));
  ASSERT_NO_FATAL_FAILURE(OpenSmallJob());
  ASSERT_NO_FATAL_FAILURE(Train(1, 2));
  ASSERT_TRUE(WaitForLog(*server_, "at step 2 written").ok());
  ASSERT_NO_FATAL_FAILURE(Train(3, 4));
  ASSERT_TRUE(WaitForWriteInProgress().ok());
  ASSERT_NO_FATAL_FAILURE(ExpectExitWithinBound(*server_, grace));
  EXPECT_THAT(server_->Log(), HasSubstr("at step 4 not written"));
  ExpectNoTemporaryFiles();
  ExpectRestoredAt("ckpt", 2);
}

// A step waiting for a worker that never comes is failed with UNAVAILABLE
// at the end of the grace, not waited on.
TEST_F(ShutdownTest, StepWaitingForAnAbsentWorkerIsFailedAfterTheGrace) {
  const absl::Duration grace = absl::Seconds(1);
  ASSERT_NO_FATAL_FAILURE(StartServer(grace));
  std::unique_ptr<ClientTraining> training =
      Open(SmallJobConfig("waiting", 2, 1));
  ASSERT_NE(training, nullptr);
  ASSERT_TRUE(training->InitWeights(kSeed, DType::kFloat32).ok());
  BackgroundStep step(*training, kSeed, 1, /*rank=*/0);
  // Every one of worker 0's streams is open once GetJob reports the step
  // waiting for worker 1.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (true) {
    absl::StatusOr<std::vector<ServerJobStatus>> status =
        training->job(0).Status(false);
    ASSERT_TRUE(status.ok()) << status.status();
    if ((*status)[0].pending_step == 1 &&
        (*status)[0].missing_workers == std::vector<uint32_t>{1}) {
      break;
    }
    ASSERT_LT(absl::Now(), deadline) << server_->Log();
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_NO_FATAL_FAILURE(ExpectExitWithinBound(*server_, grace));
  const absl::Status outcome = step.Join().status;
  EXPECT_EQ(outcome.code(), absl::StatusCode::kUnavailable) << outcome;
  EXPECT_THAT(outcome.message(), HasSubstr("shutting down"));
}

// A second SIGTERM does not wait for the grace period.
TEST_F(ShutdownTest, SecondSigtermExitsAtOnce) {
  ASSERT_NO_FATAL_FAILURE(StartServer(absl::Seconds(600)));
  const v1::CreateJobResponse job =
      CreateRawJob(server_->grpc_address(), BigJobConfig("export"));
  PausedExport paused(server_->grpc_address(), job);
  ASSERT_TRUE(server_->Signal(SIGTERM).ok());
  ASSERT_TRUE(WaitForLog(*server_, "draining").ok());
  ASSERT_TRUE(server_->Signal(SIGTERM).ok());
  absl::StatusOr<ProcessExit> exit = server_->Wait(kExitBound);
  ASSERT_TRUE(exit.ok()) << server_->Log();
  EXPECT_EQ(exit->exit_code, 1);
  EXPECT_THAT(server_->Log(), HasSubstr("second SIGTERM"));
  EXPECT_FALSE(paused.ReadToTheEnd().ok());
}

// Issue 13: a job of 2^31 workers, whose bookkeeping could not be
// allocated, and a step that ran into its deadline: SIGTERM never ended the
// server. Such a job is refused now (num_workers is at most 2^16); one of the
// most workers allowed, whose step runs into its deadline for want of the
// others, still fails cleanly and lets SIGTERM end the server within its
// bound.
TEST_F(ShutdownTest, HugeWorkerCountAfterAStepsDeadlineStillShutsDown) {
  const absl::Duration grace = absl::Seconds(1);
  ASSERT_NO_FATAL_FAILURE(StartServer(grace));
  JobConfig config = SmallJobConfig("huge", 1, 1);
  config.num_workers = uint32_t{1} << 31;
  ClientOptions options;
  options.servers = {server_->grpc_address()};
  options.step_timeout = absl::Seconds(3);
  options.unavailable_retry = absl::ZeroDuration();
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<std::unique_ptr<Job>> job = (*client)->OpenJob(config, 0);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument)
      << job.status();
  config.num_workers = kMaxWorkers;
  job = (*client)->OpenJob(config, 0);
  ASSERT_TRUE(job.ok()) << job.status();
  const Layout& layout = (*job)->layout();
  const std::string weights =
      MakeInitialWeights(layout, DType::kFloat32, kSeed);
  ASSERT_TRUE((*job)->InitWeights(weights.data(), DType::kFloat32).ok());
  const std::string grads = MakeGradients(layout, DType::kFloat32, kSeed, 1, 0);
  std::string out(weights.size(), '\0');
  StepResult result;
  const absl::Status step =
      (*job)->Step(1, grads.data(), out.data(), &result, StepOptions());
  EXPECT_FALSE(step.ok());
  ASSERT_NO_FATAL_FAILURE(ExpectExitWithinBound(*server_, grace));
}

}  // namespace
}  // namespace depot::testing
