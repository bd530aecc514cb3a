// The service end to end, in-process: a DepotDaemon on an ephemeral loopback
// port and the generated stubs.
#include "server/daemon.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "depot/v1/depot.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "server/tests/checkpoint_test_util.h"
#include "server/tests/test_util.h"
#include "wire/wire.h"

namespace depot {
namespace {

using ::depot::testing::Fp32Payload;
using ::depot::testing::Fp32Values;
using ::depot::testing::PlainSgdConfig;
using StepCall = grpc::ClientReaderWriter<v1::StepRequest, v1::StepResponse>;

// 16 elements in two chunks of 8: tensor "a" [0, 5), tensor "b" [8, 14).
JobConfig TestConfig(uint32_t num_workers) {
  return PlainSgdConfig({{"a", 5, 0}, {"b", 6, 1}}, num_workers, 8, 4);
}

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(absl::Seconds(10)); }

  void Start(absl::Duration grace) {
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "";
    options.threads = 2;
    options.memory_limit_bytes = 1 << 20;
    options.shutdown_grace = grace;
    daemon_ = DepotDaemon::Start(ResolveServerOptions(options).value()).value();
    channel_ = grpc::CreateChannel(daemon_->address(),
                                   grpc::InsecureChannelCredentials());
    stub_ = v1::Depot::NewStub(channel_);
  }

  v1::CreateJobResponse CreateJob(const JobConfig& config) {
    v1::CreateJobRequest request;
    JobConfigToProto(config, request.mutable_spec());
    v1::CreateJobResponse response;
    grpc::ClientContext context;
    grpc::Status s = stub_->CreateJob(&context, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response;
  }

  // Sets chunk c's weights to all `value` (padding then stored as 0).
  void InitWeights(const v1::CreateJobResponse& job, float value) {
    grpc::ClientContext context;
    v1::InitWeightsResponse response;
    auto writer = stub_->InitWeights(&context, &response);
    v1::InitWeightsRequest request;
    request.mutable_header()->set_job_id(job.job_id());
    request.mutable_header()->set_fingerprint(job.fingerprint());
    request.mutable_header()->set_dtype(v1::DTYPE_FP32);
    ASSERT_TRUE(writer->Write(request));
    for (uint64_t c = job.first_chunk(); c < job.end_chunk(); ++c) {
      request.mutable_chunk()->set_index(c);
      request.mutable_chunk()->set_payload(
          Fp32Payload(std::vector<float>(8, value)));
      ASSERT_TRUE(writer->Write(request));
    }
    ASSERT_TRUE(writer->WritesDone());
    grpc::Status s = writer->Finish();
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(response.chunks(), job.end_chunk() - job.first_chunk());
  }

  friend class WaitingStep;

  static void SendHeader(StepCall* call, const v1::CreateJobResponse& job,
                         uint64_t step, uint32_t worker) {
    v1::StepRequest request;
    v1::StepHeader* header = request.mutable_header();
    header->set_job_id(job.job_id());
    header->set_fingerprint(job.fingerprint());
    header->set_step(step);
    header->set_worker_rank(worker);
    ASSERT_TRUE(call->Write(request));
  }

  static void SendGrad(StepCall* call, uint64_t chunk, float value) {
    v1::StepRequest request;
    request.mutable_chunk()->set_index(chunk);
    request.mutable_chunk()->set_payload(
        Fp32Payload(std::vector<float>(8, value)));
    ASSERT_TRUE(call->Write(request));
  }

  std::unique_ptr<DepotDaemon> daemon_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Depot::Stub> stub_;
};

TEST_F(DaemonTest, HealthServiceReportsServing) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  for (const char* service : {"", "depot.v1.Depot"}) {
    grpc::ClientContext context;
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    grpc::health::v1::HealthCheckResponse response;
    ASSERT_TRUE(health->Check(&context, request, &response).ok());
    EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING)
        << service;
  }
}

TEST_F(DaemonTest, StepSendsUpdatedWeightsThenStats) {
  const v1::CreateJobResponse job = CreateJob(TestConfig(1));
  InitWeights(job, 1.0f);
  grpc::ClientContext context;
  std::unique_ptr<StepCall> call = stub_->Step(&context);
  SendHeader(call.get(), job, 1, 0);
  SendGrad(call.get(), 0, 2.0f);
  SendGrad(call.get(), 1, 4.0f);
  ASSERT_TRUE(call->WritesDone());

  std::vector<v1::StepResponse> responses;
  v1::StepResponse response;
  while (call->Read(&response)) responses.push_back(response);
  grpc::Status s = call->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(responses.size(), 3u);
  std::vector<float> weights(16);
  for (int i = 0; i < 2; ++i) {
    const v1::Chunk& chunk = responses[i].chunk();
    std::vector<float> values = Fp32Values(chunk.payload());
    std::copy(values.begin(), values.end(),
              weights.begin() + 8 * chunk.index());
  }
  // w = 1 - 0.5 * g, padding 0.
  EXPECT_EQ(weights, (std::vector<float>{0, 0, 0, 0, 0, 0, 0, 0,  //
                                         -1, -1, -1, -1, -1, -1, 0, 0}));
  EXPECT_EQ(responses[2].stats().step(), 1u);
  EXPECT_EQ(responses[2].stats().chunks(), 2u);

  grpc::ClientContext get_context;
  v1::GetJobRequest get;
  get.set_job_id(job.job_id());
  v1::JobStatus status;
  ASSERT_TRUE(stub_->GetJob(&get_context, get, &status).ok());
  EXPECT_EQ(status.step(), 1u);
}

TEST_F(DaemonTest, StepStreamWithoutHeaderIsInvalidArgument) {
  grpc::ClientContext context;
  std::unique_ptr<StepCall> call = stub_->Step(&context);
  SendGrad(call.get(), 0, 1.0f);
  call->WritesDone();
  EXPECT_EQ(call->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(DaemonTest, UnknownJobIsNotFound) {
  grpc::ClientContext context;
  v1::GetJobRequest request;
  request.set_job_id(7);
  v1::JobStatus status;
  grpc::Status s = stub_->GetJob(&context, request, &status);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "job 7 not found");
}

TEST_F(DaemonTest, PullWeightsStreamsOnePiecePerChunk) {
  const v1::CreateJobResponse job = CreateJob(TestConfig(1));
  InitWeights(job, 3.0f);
  grpc::ClientContext context;
  v1::PullRequest request;
  request.set_job_id(job.job_id());
  request.set_fingerprint(job.fingerprint());
  request.set_begin(2);
  request.set_end(10);
  request.set_dtype(v1::DTYPE_FP32);
  auto reader = stub_->PullWeights(&context, request);
  std::vector<std::pair<uint64_t, std::vector<float>>> pieces;
  v1::PullResponse piece;
  while (reader->Read(&piece)) {
    pieces.emplace_back(piece.offset(), Fp32Values(piece.payload()));
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0],
            (std::pair<uint64_t, std::vector<float>>{2, {3, 3, 3, 0, 0, 0}}));
  EXPECT_EQ(pieces[1], (std::pair<uint64_t, std::vector<float>>{8, {3, 3}}));
}

// Opens worker 0's and worker 1's step 1 streams of a W=2 job and returns once
// both have received chunk 0's weights: the step is under way and waits for
// chunk 1.
class WaitingStep {
 public:
  WaitingStep(v1::Depot::Stub* stub, const v1::CreateJobResponse& job) {
    for (uint32_t worker = 0; worker < 2; ++worker) {
      calls_[worker] = stub->Step(&contexts_[worker]);
      DaemonTest::SendHeader(calls_[worker].get(), job, 1, worker);
      DaemonTest::SendGrad(calls_[worker].get(), 0, 1.0f);
    }
    for (auto& call : calls_) {
      v1::StepResponse response;
      EXPECT_TRUE(call->Read(&response));
    }
  }

  // Reads to the end of worker `worker`'s stream and returns its status.
  grpc::Status Finish(uint32_t worker) {
    v1::StepResponse response;
    while (calls_[worker]->Read(&response)) {
    }
    return calls_[worker]->Finish();
  }

 private:
  grpc::ClientContext contexts_[2];
  std::unique_ptr<StepCall> calls_[2];
};

TEST_F(DaemonTest, DeleteJobEndsItsWaitingStepStreamsWithAborted) {
  const v1::CreateJobResponse job = CreateJob(TestConfig(2));
  WaitingStep step(stub_.get(), job);
  grpc::ClientContext context;
  v1::DeleteJobRequest request;
  request.set_job_id(job.job_id());
  request.set_fingerprint(job.fingerprint());
  v1::DeleteJobResponse response;
  ASSERT_TRUE(stub_->DeleteJob(&context, request, &response).ok());
  for (uint32_t worker = 0; worker < 2; ++worker) {
    grpc::Status s = step.Finish(worker);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << s.error_message();
    EXPECT_EQ(s.error_message(), "job 1 was deleted");
  }
}

TEST_F(DaemonTest,
       ShutdownEndsStepStreamsStillWaitingAfterTheGraceWithUnavailable) {
  daemon_.reset();
  Start(absl::ZeroDuration());
  const v1::CreateJobResponse job = CreateJob(TestConfig(2));
  WaitingStep step(stub_.get(), job);
  daemon_->Shutdown();
  for (uint32_t worker = 0; worker < 2; ++worker) {
    grpc::Status s = step.Finish(worker);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE)
        << s.error_message();
    EXPECT_EQ(s.error_message(), "server is shutting down");
  }
}

// During the grace period new RPCs are refused, while a step already under way
// runs to completion and its streams end OK.
TEST_F(DaemonTest, ShutdownRefusesNewRpcsButLetsOpenStepsFinish) {
  const v1::CreateJobResponse job = CreateJob(TestConfig(2));
  grpc::ClientContext context0;
  std::unique_ptr<StepCall> worker0 = stub_->Step(&context0);
  SendHeader(worker0.get(), job, 1, 0);
  SendGrad(worker0.get(), 0, 1.0f);
  SendGrad(worker0.get(), 1, 1.0f);
  ASSERT_TRUE(worker0->WritesDone());
  grpc::ClientContext context1;
  std::unique_ptr<StepCall> worker1 = stub_->Step(&context1);
  SendHeader(worker1.get(), job, 1, 1);
  SendGrad(worker1.get(), 0, 1.0f);
  v1::StepResponse response;
  // Chunk 0's weights: both streams are being served.
  ASSERT_TRUE(worker1->Read(&response));

  std::thread shutdown([this] { daemon_->Shutdown(); });
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext watch_context;
  grpc::health::v1::HealthCheckRequest watch;
  watch.set_service("depot.v1.Depot");
  auto statuses = health->Watch(&watch_context, watch);
  grpc::health::v1::HealthCheckResponse health_status;
  while (statuses->Read(&health_status) &&
         health_status.status() !=
             grpc::health::v1::HealthCheckResponse::NOT_SERVING) {
  }
  EXPECT_EQ(health_status.status(),
            grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  watch_context.TryCancel();

  grpc::ClientContext get_context;
  v1::GetJobRequest get;
  get.set_job_id(job.job_id());
  v1::JobStatus status;
  grpc::Status refused = stub_->GetJob(&get_context, get, &status);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(refused.error_message(), "server is shutting down");

  SendGrad(worker1.get(), 1, 1.0f);
  ASSERT_TRUE(worker1->WritesDone());
  for (StepCall* call : {worker0.get(), worker1.get()}) {
    while (call->Read(&response)) {
    }
    EXPECT_TRUE(response.has_stats());
    grpc::Status s = call->Finish();
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  shutdown.join();
}

// Two servers writing one directory would overwrite each other's
// checkpoints: the second one does not start.
TEST(DaemonCheckpointDirTest, SecondServerOnOneDirectoryFailsToStart) {
  testing::TempDir temp;
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "";
  options.threads = 1;
  options.memory_limit_bytes = 1 << 20;
  options.checkpoint_dir = temp.path() + "/ckpt";
  options.checkpoint_every_steps = 1;
  const ServerOptions resolved = ResolveServerOptions(options).value();
  absl::StatusOr<std::unique_ptr<DepotDaemon>> first =
      DepotDaemon::Start(resolved);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<DepotDaemon>> second =
      DepotDaemon::Start(resolved);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("its own --checkpoint_dir"),
            absl::string_view::npos)
      << second.status();
  (*first)->Shutdown();
}

}  // namespace
}  // namespace depot
