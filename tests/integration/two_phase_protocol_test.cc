// The wire rules of a step's numerics, driven with the raw stub against one
// server holding a W = 2 job: malformed numerics and commits fail with their
// documented codes and leave the state as it was (GetJob's checksum), and a
// two-phase stream acks, reports GradStats and waits for identical commits.
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "depot/shard_plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "raw_driver.h"
#include "server_process.h"
#include "training_data.h"
#include "wire/wire.h"

namespace depot::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kSeed = 17;

// A Step stream driven message by message from the test's thread.
class RawStream {
 public:
  explicit RawStream(v1::Depot::Stub& stub) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Minutes(2)));
    stream_ = stub.Step(&context_);
  }

  bool Write(const v1::StepRequest& request) { return stream_->Write(request); }
  bool WriteCommit(double clip_coef, bool skip) {
    v1::StepRequest request;
    request.mutable_commit()->set_clip_coef(clip_coef);
    request.mutable_commit()->set_skip(skip);
    return Write(request);
  }

  // Reads until the GradStats, counting the acks on the way; nullopt if the
  // stream ends first.
  std::optional<v1::GradStats> ReadUntilGradStats() {
    v1::StepResponse response;
    while (stream_->Read(&response)) {
      if (response.has_ack()) ++acks_;
      if (response.has_chunk()) ++weights_;
      if (response.has_grad_stats()) return response.grad_stats();
    }
    return std::nullopt;
  }

  // Reads until one weights chunk; false if the stream ends first.
  bool ReadWeights() {
    v1::StepResponse response;
    while (stream_->Read(&response)) {
      if (response.has_chunk()) {
        ++weights_;
        return true;
      }
    }
    return false;
  }

  // Half-closes, reads everything left and returns the final status.
  grpc::Status Finish() {
    stream_->WritesDone();
    v1::StepResponse response;
    while (stream_->Read(&response)) {
      if (response.has_chunk()) ++weights_;
    }
    return stream_->Finish();
  }

  int acks() const { return acks_; }
  int weights() const { return weights_; }

 private:
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::StepRequest, v1::StepResponse>>
      stream_;
  int acks_ = 0;
  int weights_ = 0;
};

class TwoPhaseProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = NewDepotStub(server_->grpc_address());
    config_ = SmallJobConfig("two-phase-wire", /*num_workers=*/2, 1);
    v1::JobSpec spec;
    JobConfigToProto(config_, &spec);
    v1::CreateJobResponse created;
    grpc::Status status = RawCreateJob(*stub_, spec, 0, &created);
    ASSERT_TRUE(status.ok()) << status.error_message();
    job_id_ = created.job_id();
    fingerprint_ = created.fingerprint();
    layout_.emplace(*Layout::Create(config_.tensors, config_.alignment_elems));
    plan_.emplace(
        *ShardPlan::Create(layout_->total_elems(), 1, config_.chunk_elems));
    ASSERT_NO_FATAL_FAILURE(state_before_.Record(*stub_, job_id_));
  }

  v1::StepHeader Header(uint32_t rank) const {
    return MakeStepHeader(job_id_, fingerprint_, 1, rank, {});
  }
  v1::StepHeader TwoPhaseHeader(uint32_t rank) const {
    v1::StepHeader header = Header(rank);
    header.set_two_phase(true);
    return header;
  }

  // Worker `rank`'s step-1 gradient chunks, all of them.
  std::vector<v1::Chunk> Chunks(uint32_t rank) const {
    const std::string grads =
        MakeGradients(*layout_, DType::kFloat32, kSeed, 1, rank);
    return MakeChunks(*plan_, 0, plan_->num_chunks(), grads.data(),
                      DType::kFloat32);
  }

  // Writes `header` and every chunk of worker `rank` on `stream`.
  void SendAll(RawStream& stream, const v1::StepHeader& header) {
    for (const v1::StepRequest& message :
         MakeStepPlan(header, Chunks(header.worker_rank())).messages) {
      ASSERT_TRUE(stream.Write(message));
    }
  }

  grpc::Status RunStream(std::vector<v1::StepRequest> messages) {
    StepStreamPlan plan;
    plan.messages = std::move(messages);
    return RunStepStreams(*stub_, {plan}).front().status;
  }

  static v1::StepRequest Commit(double clip_coef, bool skip) {
    v1::StepRequest request;
    request.mutable_commit()->set_clip_coef(clip_coef);
    request.mutable_commit()->set_skip(skip);
    return request;
  }

  void ExpectStateUnchanged() {
    ASSERT_NO_FATAL_FAILURE(state_before_.ExpectUnchanged(*stub_, job_id_));
  }

  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::Depot::Stub> stub_;
  JobConfig config_;
  uint64_t job_id_ = 0;
  uint64_t fingerprint_ = 0;
  std::optional<Layout> layout_;
  std::optional<ShardPlan> plan_;
  StateChecksumWatch state_before_;
};

TEST_F(TwoPhaseProtocolTest, LossScaleMustBeFiniteAndPositive) {
  for (double scale :
       {0.0, -2.0, std::numeric_limits<double>::infinity(), std::nan("")}) {
    v1::StepHeader header = Header(0);
    header.set_loss_scale(scale);
    grpc::Status status = RunStream(MakeStepPlan(header, Chunks(0)).messages);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << scale;
    EXPECT_THAT(status.error_message(), HasSubstr("loss_scale"));
  }
  ExpectStateUnchanged();
}

TEST_F(TwoPhaseProtocolTest, KnownClipCoefficientMustBeInZeroToOne) {
  for (double coef : {0.0, -0.5, 1.5}) {
    v1::StepHeader header = Header(0);
    header.mutable_commit()->set_clip_coef(coef);
    grpc::Status status = RunStream(MakeStepPlan(header, Chunks(0)).messages);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << coef;
    EXPECT_THAT(status.error_message(), HasSubstr("clip_coef"));
  }
  ExpectStateUnchanged();
}

TEST_F(TwoPhaseProtocolTest, HeaderWithTwoPhaseAndACommitIsInvalidArgument) {
  v1::StepHeader header = TwoPhaseHeader(0);
  header.mutable_commit()->set_clip_coef(1.0);
  grpc::Status status = RunStream(MakeStepPlan(header, Chunks(0)).messages);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectStateUnchanged();
}

TEST_F(TwoPhaseProtocolTest, CommitOnAOnePhaseStreamIsInvalidArgument) {
  std::vector<v1::StepRequest> messages =
      MakeStepPlan(Header(0), Chunks(0)).messages;
  messages.push_back(Commit(1.0, false));
  grpc::Status status = RunStream(messages);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("one-phase"));
  ExpectStateUnchanged();
}

TEST_F(TwoPhaseProtocolTest,
       CommitBeforeEveryChunkIsSummedIsFailedPrecondition) {
  // Worker 1 never sends, so no chunk can be summed.
  std::vector<v1::StepRequest> messages =
      MakeStepPlan(TwoPhaseHeader(0), Chunks(0)).messages;
  messages.push_back(Commit(1.0, false));
  grpc::Status status = RunStream(messages);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("summed"));
  ExpectStateUnchanged();
}

TEST_F(TwoPhaseProtocolTest, EveryChunkIsAckedBeforeTheGradStatsAndNoWeights) {
  RawStream worker0(*stub_);
  RawStream worker1(*stub_);
  ASSERT_NO_FATAL_FAILURE(SendAll(worker0, TwoPhaseHeader(0)));
  ASSERT_NO_FATAL_FAILURE(SendAll(worker1, TwoPhaseHeader(1)));
  for (RawStream* stream : {&worker0, &worker1}) {
    std::optional<v1::GradStats> stats = stream->ReadUntilGradStats();
    ASSERT_TRUE(stats.has_value());
    EXPECT_GT(stats->sum_squares(), 0.0);
    EXPECT_EQ(stream->acks(), static_cast<int>(plan_->num_chunks()));
    EXPECT_EQ(stream->weights(), 0);
  }
  ASSERT_TRUE(worker0.WriteCommit(1.0, false));
  ASSERT_TRUE(worker1.WriteCommit(1.0, false));
  for (RawStream* stream : {&worker0, &worker1}) {
    grpc::Status status = stream->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(stream->weights(), static_cast<int>(plan_->num_chunks()));
  }
}

TEST_F(TwoPhaseProtocolTest, CommitDifferentFromTheFirstIsFailedPrecondition) {
  RawStream worker0(*stub_);
  RawStream worker1(*stub_);
  ASSERT_NO_FATAL_FAILURE(SendAll(worker0, TwoPhaseHeader(0)));
  ASSERT_NO_FATAL_FAILURE(SendAll(worker1, TwoPhaseHeader(1)));
  ASSERT_TRUE(worker0.ReadUntilGradStats().has_value());
  ASSERT_TRUE(worker1.ReadUntilGradStats().has_value());
  ASSERT_TRUE(worker0.WriteCommit(1.0, false));
  // Once weights flow, worker 0's commit has decided.
  ASSERT_TRUE(worker0.ReadWeights());
  ASSERT_TRUE(worker1.WriteCommit(0.5, false));
  grpc::Status status = worker1.Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("differs"));
  status = worker0.Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(worker0.weights(), static_cast<int>(plan_->num_chunks()));
}

TEST_F(TwoPhaseProtocolTest, ChunkAfterTheCommitIsInvalidArgument) {
  RawStream worker0(*stub_);
  RawStream worker1(*stub_);
  ASSERT_NO_FATAL_FAILURE(SendAll(worker0, TwoPhaseHeader(0)));
  ASSERT_NO_FATAL_FAILURE(SendAll(worker1, TwoPhaseHeader(1)));
  ASSERT_TRUE(worker0.ReadUntilGradStats().has_value());
  ASSERT_TRUE(worker0.WriteCommit(1.0, false));
  v1::StepRequest chunk;
  *chunk.mutable_chunk() = Chunks(0).front();
  worker0.Write(chunk);
  grpc::Status status = worker0.Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("after the commit"));
  worker1.WriteCommit(1.0, false);
  EXPECT_TRUE(worker1.Finish().ok());
}

TEST_F(TwoPhaseProtocolTest, HalfCloseWithoutACommitIsFailedPrecondition) {
  RawStream worker0(*stub_);
  RawStream worker1(*stub_);
  ASSERT_NO_FATAL_FAILURE(SendAll(worker0, TwoPhaseHeader(0)));
  ASSERT_NO_FATAL_FAILURE(SendAll(worker1, TwoPhaseHeader(1)));
  ASSERT_TRUE(worker0.ReadUntilGradStats().has_value());
  grpc::Status status = worker0.Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("without its commit"));
  ExpectStateUnchanged();
  // The other worker's commit still completes the step.
  ASSERT_TRUE(worker1.ReadUntilGradStats().has_value());
  worker1.WriteCommit(1.0, false);
  EXPECT_TRUE(worker1.Finish().ok());
}

}  // namespace
}  // namespace depot::testing
