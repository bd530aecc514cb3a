// Malformed and out-of-protocol requests, sent with the raw stub: each must
// fail with its documented status code and a message naming what was wrong, and
// must leave the job's state exactly as it was (GetJob's state checksum).
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "depot/shard_plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics_scrape.h"
#include "raw_driver.h"
#include "server_process.h"
#include "training_data.h"
#include "wire/wire.h"

namespace depot::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kSeed = 99;
constexpr uint64_t kAppliedSteps = 2;
constexpr uint64_t kNextStep = kAppliedSteps + 1;

// One server holding a small W=2 job with kAppliedSteps steps applied.
class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = NewDepotStub(server_->grpc_address());

    config_ = SmallJobConfig("bad-input", /*num_workers=*/2, /*num_servers=*/1);
    JobConfigToProto(config_, &spec_);
    v1::CreateJobResponse created;
    grpc::Status status = RawCreateJob(*stub_, spec_, 0, &created);
    ASSERT_TRUE(status.ok()) << status.error_message();
    job_id_ = created.job_id();
    fingerprint_ = created.fingerprint();
    layout_.emplace(*Layout::Create(config_.tensors, config_.alignment_elems));
    plan_.emplace(
        *ShardPlan::Create(layout_->total_elems(), 1, config_.chunk_elems));

    const std::string weights =
        MakeInitialWeights(*layout_, DType::kFloat32, kSeed);
    status = RawInitWeights(
        *stub_, MakeInitHeader(job_id_, fingerprint_, v1::DTYPE_FP32),
        AllChunks(weights));
    ASSERT_TRUE(status.ok()) << status.error_message();
    for (uint64_t step = 1; step <= kAppliedSteps; ++step) {
      std::vector<StepStreamPlan> plans;
      for (uint32_t rank = 0; rank < 2; ++rank) {
        plans.push_back(
            MakeStepPlan(Header(step, rank),
                         AllChunks(MakeGradients(*layout_, DType::kFloat32,
                                                 kSeed, step, rank))));
      }
      for (const StepStreamResult& result : RunStepStreams(*stub_, plans)) {
        ASSERT_TRUE(result.status.ok()) << result.status.error_message();
      }
    }
    next_grads_ = MakeGradients(*layout_, DType::kFloat32, kSeed, kNextStep, 0);
    v1::JobStatus applied;
    ASSERT_NO_FATAL_FAILURE(state_before_.Record(*stub_, job_id_, &applied));
    EXPECT_EQ(applied.step(), kAppliedSteps);
  }

  std::vector<v1::Chunk> AllChunks(const std::string& flat) const {
    return MakeChunks(*plan_, 0, plan_->num_chunks(), flat.data(),
                      DType::kFloat32);
  }

  v1::StepHeader Header(uint64_t step, uint32_t rank) const {
    return MakeStepHeader(job_id_, fingerprint_, step, rank,
                          StepHyperParams(step));
  }

  // Worker 0's gradient of chunk `index` for the next step.
  v1::Chunk NextGradChunk(uint64_t index) const {
    return MakeChunk(*plan_, index, next_grads_.data(), DType::kFloat32);
  }

  // Runs one Step stream carrying exactly `messages`.
  grpc::Status RunStream(std::vector<v1::StepRequest> messages) {
    StepStreamPlan plan;
    plan.messages = std::move(messages);
    return RunStepStreams(*stub_, {plan}).front().status;
  }

  grpc::Status RunStream(const v1::StepHeader& header,
                         const std::vector<v1::Chunk>& chunks) {
    return RunStream(MakeStepPlan(header, chunks).messages);
  }

  grpc::Status Pull(uint64_t begin, uint64_t end, v1::DType dtype) {
    std::string payload;
    return RawPull(*stub_,
                   MakePullRequest(job_id_, fingerprint_, begin, end, dtype),
                   &payload);
  }

  // Every chunk of the shard, as ExportState sends it.
  std::vector<v1::StateChunk> ExportState() {
    grpc::ClientContext context;
    v1::ExportStateRequest request;
    request.set_job_id(job_id_);
    request.set_fingerprint(fingerprint_);
    std::unique_ptr<grpc::ClientReader<v1::StateChunk>> reader =
        stub_->ExportState(&context, request);
    std::vector<v1::StateChunk> chunks;
    v1::StateChunk chunk;
    while (reader->Read(&chunk)) chunks.push_back(chunk);
    const grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    return chunks;
  }

  // Runs one ImportState stream: a header with `fingerprint` (unless
  // `header` is false), then `chunks`.
  grpc::Status ImportState(const std::vector<v1::StateChunk>& chunks,
                           uint64_t fingerprint, bool header = true) {
    grpc::ClientContext context;
    v1::ImportStateResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::ImportStateRequest>> writer =
        stub_->ImportState(&context, &response);
    v1::ImportStateRequest request;
    bool writing = true;
    if (header) {
      request.mutable_header()->set_job_id(job_id_);
      request.mutable_header()->set_fingerprint(fingerprint);
      writing = writer->Write(request);
    }
    for (const v1::StateChunk& chunk : chunks) {
      if (!writing) break;
      *request.mutable_chunk() = chunk;
      writing = writer->Write(request);
    }
    if (writing) writer->WritesDone();
    return writer->Finish();
  }

  void ExpectStateUnchanged() {
    v1::JobStatus status;
    ASSERT_NO_FATAL_FAILURE(
        state_before_.ExpectUnchanged(*stub_, job_id_, &status));
    EXPECT_EQ(status.step(), kAppliedSteps);
  }

  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::Depot::Stub> stub_;
  JobConfig config_;
  v1::JobSpec spec_;
  uint64_t job_id_ = 0;
  uint64_t fingerprint_ = 0;
  std::optional<Layout> layout_;
  std::optional<ShardPlan> plan_;
  std::string next_grads_;
  StateChecksumWatch state_before_;
};

TEST_F(BadInputTest, UnknownJobIdIsNotFound) {
  const uint64_t unknown = job_id_ + 1000;
  v1::JobStatus job_status;
  grpc::Status status = RawGetJob(*stub_, unknown, false, &job_status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat(unknown)));

  v1::StepHeader header = Header(kNextStep, 0);
  header.set_job_id(unknown);
  status = RunStream(header, {NextGradChunk(0)});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat(unknown)));
  ExpectStateUnchanged();
}

TEST_F(BadInputTest, WrongFingerprintIsFailedPreconditionNamingBothValues) {
  const uint64_t wrong = fingerprint_ ^ 0x5a5a5a5a00000000ULL;
  v1::StepHeader header = Header(kNextStep, 0);
  header.set_fingerprint(wrong);
  grpc::Status status = RunStream(header, {NextGradChunk(0)});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  const std::string message = absl::AsciiStrToLower(status.error_message());
  EXPECT_THAT(message, HasSubstr(absl::StrFormat("%x", fingerprint_)));
  EXPECT_THAT(message, HasSubstr(absl::StrFormat("%x", wrong)));
  ExpectStateUnchanged();
}

TEST_F(BadInputTest, WrongPayloadSizeIsInvalidArgumentNamingBothSizes) {
  v1::Chunk chunk = NextGradChunk(0);
  const size_t expected = chunk.payload().size();
  chunk.mutable_payload()->resize(expected - sizeof(float));
  grpc::Status status = RunStream(Header(kNextStep, 0), {chunk});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat(expected)));
  EXPECT_THAT(status.error_message(),
              HasSubstr(absl::StrCat(expected - sizeof(float))));
  ExpectStateUnchanged();
}

TEST_F(BadInputTest, ChunkOutsideTheShardIsOutOfRange) {
  v1::Chunk chunk = NextGradChunk(0);
  const uint64_t outside = plan_->num_chunks();
  chunk.set_index(outside);
  grpc::Status status = RunStream(Header(kNextStep, 0), {chunk});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat(outside)));
  ExpectStateUnchanged();
}

TEST_F(BadInputTest, DuplicateContributionOnAnOpenStreamIsAlreadyExists) {
  grpc::Status status =
      RunStream(Header(kNextStep, 0), {NextGradChunk(1), NextGradChunk(1)});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(status.error_message(), HasSubstr("duplicate"));
  ExpectStateUnchanged();
}

TEST_F(BadInputTest, FutureStepIsAborted) {
  grpc::Status status = RunStream(Header(kNextStep + 1, 0), {NextGradChunk(0)});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat(kNextStep + 1)));
  ExpectStateUnchanged();
}

TEST_F(BadInputTest, StaleStepIsAborted) {
  grpc::Status status =
      RunStream(Header(kAppliedSteps - 1, 0), {NextGradChunk(0)});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat(kAppliedSteps)));
  ExpectStateUnchanged();
}

TEST_F(BadInputTest, StepZeroIsInvalidArgument) {
  grpc::Status status = RunStream(Header(0, 0), {NextGradChunk(0)});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectStateUnchanged();
}

TEST_F(BadInputTest, ChunkBeforeTheHeaderIsInvalidArgument) {
  v1::StepRequest chunk_first;
  *chunk_first.mutable_chunk() = NextGradChunk(0);
  grpc::Status status = RunStream({chunk_first});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectStateUnchanged();
}

TEST_F(BadInputTest, WorkerRankNotBelowNumWorkersIsInvalidArgument) {
  grpc::Status status = RunStream(Header(kNextStep, 2), {NextGradChunk(0)});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectStateUnchanged();
}

TEST_F(BadInputTest, HyperParamsForAnUnknownParamGroupAreInvalidArgument) {
  v1::StepHeader header = Header(kNextStep, 0);
  GroupHyperParamsToProto({{7, 1e-3, 0.0}}, &header);
  grpc::Status status = RunStream(header, {NextGradChunk(0)});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectStateUnchanged();
}

TEST_F(BadInputTest, NoGradBitmapOfTheWrongSizeIsInvalidArgument) {
  v1::StepHeader header = Header(kNextStep, 0);
  const size_t bytes = (config_.tensors.size() + 7) / 8;
  header.set_no_grad_tensors(std::string(bytes + 1, '\0'));
  grpc::Status status = RunStream(header, {NextGradChunk(0)});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("no_grad_tensors"));
  ExpectStateUnchanged();
}

TEST_F(BadInputTest, WeightsOverridePastItsChunkIsOutOfRange) {
  v1::StepRequest header;
  *header.mutable_header() = Header(kNextStep, 0);
  v1::StepRequest override_request;
  v1::WeightsOverride* piece = override_request.mutable_weights_override();
  piece->set_chunk_index(0);
  piece->set_offset(config_.chunk_elems - 1);
  piece->set_payload(std::string(2 * sizeof(float), '\0'));
  grpc::Status status = RunStream({header, override_request});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_THAT(status.error_message(), HasSubstr("weights override"));
  ExpectStateUnchanged();
}

TEST_F(BadInputTest, WeightsOverrideAfterItsChunkIsFailedPrecondition) {
  v1::StepRequest header;
  *header.mutable_header() = Header(kNextStep, 0);
  v1::StepRequest chunk;
  *chunk.mutable_chunk() = NextGradChunk(0);
  v1::StepRequest override_request;
  v1::WeightsOverride* piece = override_request.mutable_weights_override();
  piece->set_chunk_index(0);
  piece->set_offset(0);
  piece->set_payload(std::string(sizeof(float), '\0'));
  grpc::Status status = RunStream({header, chunk, override_request});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("before the chunk"));
}

TEST_F(BadInputTest, UnsupportedDtypeInJobSpecIsInvalidArgument) {
  v1::JobSpec unspecified = spec_;
  unspecified.set_name("unspecified-grad-dtype");
  unspecified.set_grad_dtype(v1::DTYPE_UNSPECIFIED);
  v1::CreateJobResponse response;
  grpc::Status status = RawCreateJob(*stub_, unspecified, 0, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("grad_dtype"));

  v1::JobSpec unknown = spec_;
  unknown.set_name("unknown-weight-dtype");
  unknown.set_weight_dtype(static_cast<v1::DType>(9));
  status = RawCreateJob(*stub_, unknown, 0, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("weight_dtype"));

  absl::StatusOr<std::string> metrics =
      ScrapeMetrics(server_->metrics_address());
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(MetricValue(*metrics, "depot_jobs").value_or(-1), 1)
      << "a rejected CreateJob created a job";
  ExpectStateUnchanged();
}

TEST_F(BadInputTest, UnsupportedPullDtypeIsInvalidArgument) {
  grpc::Status status =
      Pull(0, plan_->chunk_elems(), static_cast<v1::DType>(9));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  status = Pull(0, plan_->chunk_elems(), v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectStateUnchanged();
}

TEST_F(BadInputTest, PullBeyondTheShardIsOutOfRange) {
  const uint64_t n = layout_->total_elems();
  grpc::Status status = Pull(0, n + 1, v1::DTYPE_FP32);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat(n)));
  ExpectStateUnchanged();
}

TEST_F(BadInputTest, SameNameWithDifferentConfigIsFailedPrecondition) {
  v1::JobSpec changed = spec_;
  changed.mutable_optimizer()->set_lr(0.25);
  changed.set_grad_dtype(v1::DTYPE_FP16);
  v1::CreateJobResponse response;
  grpc::Status status = RawCreateJob(*stub_, changed, 0, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // SmallJobConfig: lr 1e-3, fp32 gradients.
  EXPECT_THAT(status.error_message(),
              HasSubstr("optimizer.lr: 0.001 (existing job) vs 0.25 (this "
                        "request); grad_dtype: fp32 (existing job) vs fp16 "
                        "(this request)"));
  ExpectStateUnchanged();
}

TEST_F(BadInputTest, SameNameWithSameConfigAttachesToTheJob) {
  v1::CreateJobResponse response;
  grpc::Status status = RawCreateJob(*stub_, spec_, 0, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_FALSE(response.created());
  EXPECT_EQ(response.job_id(), job_id_);
  EXPECT_EQ(response.fingerprint(), fingerprint_);
  ExpectStateUnchanged();
}

TEST_F(BadInputTest, InitWeightsAfterAStepIsFailedPrecondition) {
  grpc::Status status = RawInitWeights(
      *stub_, MakeInitHeader(job_id_, fingerprint_, v1::DTYPE_FP32),
      {NextGradChunk(0)});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  ExpectStateUnchanged();
}

// A server whose budget holds two small jobs but not a large one.
TEST(MemoryBudgetTest, JobOverTheBudgetIsResourceExhaustedAndAllocatesNothing) {
  const JobConfig small = SmallJobConfig("small-1", 1, 1);
  const Layout layout = *Layout::Create(small.tensors, small.alignment_elems);
  // State bytes per job: N elements * 4 bytes * (master + 2 AdamW moments);
  // the budget also counts the fp32 weights kept of two steps (2 * 4 bytes).
  const uint64_t small_state = layout.total_elems() * 4 * 3;
  const uint64_t small_bytes = small_state + layout.total_elems() * 4 * 2;
  const uint64_t limit = small_bytes * 5 / 2;
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start({absl::StrCat("--memory_limit_bytes=", limit)});
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<v1::Depot::Stub> stub =
      NewDepotStub((*server)->grpc_address());

  v1::JobSpec spec;
  JobConfigToProto(small, &spec);
  v1::CreateJobResponse first;
  grpc::Status status = RawCreateJob(*stub, spec, 0, &first);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(first.state_bytes(), small_state);
  v1::JobStatus before;
  ASSERT_TRUE(RawGetJob(*stub, first.job_id(), true, &before).ok());

  JobConfig large =
      LargeJobConfig("large", DType::kFloat32, DType::kFloat32, 1);
  large.num_servers = 1;
  JobConfigToProto(large, &spec);
  v1::CreateJobResponse response;
  status = RawCreateJob(*stub, spec, 0, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat(limit)));

  // Had the rejected job reserved anything, this one would not fit.
  JobConfigToProto(SmallJobConfig("small-2", 1, 1), &spec);
  status = RawCreateJob(*stub, spec, 0, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();

  v1::JobStatus after;
  ASSERT_TRUE(RawGetJob(*stub, first.job_id(), true, &after).ok());
  EXPECT_EQ(after.state_checksum(), before.state_checksum());
}

TEST_F(BadInputTest, ImportStateOfTheExportedStateKeepsItAsItWas) {
  std::vector<v1::StateChunk> chunks = ExportState();
  ASSERT_EQ(chunks.size(), plan_->num_chunks());
  grpc::Status status = ImportState(chunks, fingerprint_);
  EXPECT_TRUE(status.ok()) << status.error_message();
  ExpectStateUnchanged();
}

TEST_F(BadInputTest, ImportStateMissingAChunkIsInvalidArgument) {
  std::vector<v1::StateChunk> chunks = ExportState();
  ASSERT_GE(chunks.size(), 2u);
  chunks.front().mutable_master()->assign(chunks.front().master().size(), 0);
  chunks.pop_back();
  grpc::Status status = ImportState(chunks, fingerprint_);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("every chunk"));
  ExpectStateUnchanged();
}

TEST_F(BadInputTest, ImportStateChunkBeforeTheHeaderIsInvalidArgument) {
  grpc::Status status =
      ImportState(ExportState(), fingerprint_, /*header=*/false);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ExpectStateUnchanged();
}

TEST_F(BadInputTest, ImportStateWithAWrongFingerprintIsFailedPrecondition) {
  grpc::Status status = ImportState(ExportState(), fingerprint_ ^ 1);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  ExpectStateUnchanged();
}

}  // namespace
}  // namespace depot::testing
