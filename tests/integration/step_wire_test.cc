// The server's Step method reads chunks by hand from the received bytes
// (wire/step_codec.h): any valid protobuf encoding of a StepRequest must step
// exactly as protobuf's own, and malformed bytes must fail with
// INVALID_ARGUMENT and change nothing.
#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "depot/shard_plan.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/rpc_method.h"
#include "gtest/gtest.h"
#include "protobuf_bytes.h"
#include "raw_driver.h"
#include "server_process.h"
#include "training_data.h"
#include "wire/wire.h"

namespace depot::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kSeed = 5;

// What a Step stream of raw messages got back.
struct RawStepResult {
  grpc::Status status;
  std::vector<v1::StepResponse> responses;
};

// One server holding two identical W=1 jobs (but for their names) with
// their weights initialised and no step applied.
class StepWireTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = NewDepotStub(server_->grpc_address());
    channel_ = grpc::CreateChannel(server_->grpc_address(),
                                   grpc::InsecureChannelCredentials());
    for (int j = 0; j < 2; ++j) {
      JobConfig config = SmallJobConfig(j == 0 ? "plain" : "odd",
                                        /*num_workers=*/1, /*num_servers=*/1);
      v1::JobSpec spec;
      JobConfigToProto(config, &spec);
      v1::CreateJobResponse created;
      grpc::Status status = RawCreateJob(*stub_, spec, 0, &created);
      ASSERT_TRUE(status.ok()) << status.error_message();
      job_ids_[j] = created.job_id();
      fingerprints_[j] = created.fingerprint();
      if (j == 0) {
        layout_.emplace(
            *Layout::Create(config.tensors, config.alignment_elems));
        plan_.emplace(
            *ShardPlan::Create(layout_->total_elems(), 1, config.chunk_elems));
      }
      const std::string weights =
          MakeInitialWeights(*layout_, DType::kFloat32, kSeed);
      status = RawInitWeights(
          *stub_, MakeInitHeader(job_ids_[j], fingerprints_[j], v1::DTYPE_FP32),
          MakeChunks(*plan_, 0, plan_->num_chunks(), weights.data(),
                     DType::kFloat32));
      ASSERT_TRUE(status.ok()) << status.error_message();
    }
    grads_ = MakeGradients(*layout_, DType::kFloat32, kSeed, 1, 0);
  }

  // Job j's step-1 header, serialized.
  std::string Header(int j) const {
    v1::StepRequest request;
    *request.mutable_header() =
        MakeStepHeader(job_ids_[j], fingerprints_[j], 1, 0, {});
    return request.SerializeAsString();
  }

  v1::Chunk GradChunk(uint64_t index) const {
    return MakeChunk(*plan_, index, grads_.data(), DType::kFloat32);
  }

  // Sends `messages` (serialized StepRequests) on one Step stream,
  // half-closes, and reads every answer.
  RawStepResult RunRawStep(const std::vector<std::string>& messages) {
    static const char kStep[] = "/depot.v1.Depot/Step";
    const grpc::internal::RpcMethod method(
        kStep, grpc::internal::RpcMethod::BIDI_STREAMING, channel_);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::minutes(1));
    std::unique_ptr<
        grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>>
        stream(grpc::internal::ClientReaderWriterFactory<
               grpc::ByteBuffer, grpc::ByteBuffer>::Create(channel_.get(),
                                                           method, &context));
    for (const std::string& message : messages) {
      grpc::Slice slice(message);
      if (!stream->Write(grpc::ByteBuffer(&slice, 1))) break;
    }
    stream->WritesDone();
    RawStepResult result;
    grpc::ByteBuffer buffer;
    while (stream->Read(&buffer)) {
      std::vector<grpc::Slice> slices;
      EXPECT_TRUE(buffer.Dump(&slices).ok());
      std::string bytes;
      for (const grpc::Slice& slice : slices) {
        bytes.append(reinterpret_cast<const char*>(slice.begin()),
                     slice.size());
      }
      EXPECT_TRUE(result.responses.emplace_back().ParseFromString(bytes));
    }
    result.status = stream->Finish();
    return result;
  }

  // The weights a successful step answered, concatenated in chunk order.
  static std::string Weights(const RawStepResult& result) {
    std::vector<const v1::Chunk*> chunks;
    for (const v1::StepResponse& response : result.responses) {
      if (response.has_chunk()) chunks.push_back(&response.chunk());
    }
    std::sort(chunks.begin(), chunks.end(),
              [](const v1::Chunk* a, const v1::Chunk* b) {
                return a->index() < b->index();
              });
    std::string weights;
    for (const v1::Chunk* chunk : chunks) weights += chunk->payload();
    return weights;
  }

  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::Depot::Stub> stub_;
  std::shared_ptr<grpc::Channel> channel_;
  uint64_t job_ids_[2] = {0, 0};
  uint64_t fingerprints_[2] = {0, 0};
  std::optional<Layout> layout_;
  std::optional<ShardPlan> plan_;
  std::string grads_;
};

TEST_F(StepWireTest, EveryValidEncodingOfAChunkStepsLikeProtobufsOwn) {
  ASSERT_GE(plan_->num_chunks(), 4u);
  std::vector<std::string> plain = {Header(0)};
  std::vector<std::string> odd = {Header(1)};
  for (uint64_t index = 0; index < plan_->num_chunks(); ++index) {
    const v1::Chunk chunk = GradChunk(index);
    v1::StepRequest request;
    *request.mutable_chunk() = chunk;
    plain.push_back(request.SerializeAsString());
    const std::string index_field = Tag(1, 0) + Varint(chunk.index());
    const std::string payload_field = LengthDelimited(2, chunk.payload());
    switch (index % 4) {
      case 0:  // the payload before the index, unknown fields around
        odd.push_back(Tag(15, 0) + Varint(1) +
                      LengthDelimited(
                          2, payload_field + Tag(9, 5) + "abcd" + index_field) +
                      LengthDelimited(16, "x"));
        break;
      case 1:  // the index and the payload in two occurrences of the chunk
        odd.push_back(LengthDelimited(2, index_field) +
                      LengthDelimited(2, payload_field));
        break;
      case 2:  // a header the chunk then replaces (protobuf's oneof rule)
        odd.push_back(Header(1) + request.SerializeAsString());
        break;
      default:  // a payload and an index that later occurrences replace
        odd.push_back(LengthDelimited(2, LengthDelimited(2, "stale") +
                                             Tag(1, 0) + Varint(999)) +
                      LengthDelimited(2, index_field + payload_field));
        break;
    }
  }
  const RawStepResult expected = RunRawStep(plain);
  ASSERT_TRUE(expected.status.ok()) << expected.status.error_message();
  const RawStepResult actual = RunRawStep(odd);
  ASSERT_TRUE(actual.status.ok()) << actual.status.error_message();
  EXPECT_EQ(Weights(actual), Weights(expected));
  EXPECT_EQ(Weights(actual).size(), grads_.size());
  v1::JobStatus plain_status;
  v1::JobStatus odd_status;
  ASSERT_TRUE(RawGetJob(*stub_, job_ids_[0], true, &plain_status).ok());
  ASSERT_TRUE(RawGetJob(*stub_, job_ids_[1], true, &odd_status).ok());
  EXPECT_EQ(odd_status.step(), 1u);
  EXPECT_EQ(odd_status.state_checksum(), plain_status.state_checksum());
}

TEST_F(StepWireTest, MalformedChunkIsInvalidArgumentAndChangesNothing) {
  StateChecksumWatch before;
  ASSERT_NO_FATAL_FAILURE(before.Record(*stub_, job_ids_[0]));
  v1::StepRequest request;
  *request.mutable_chunk() = GradChunk(0);
  const std::string whole = request.SerializeAsString();
  const std::vector<std::string> malformed = {
      whole.substr(0, whole.size() - 1),      // truncated payload
      whole + Tag(3, 7),                      // wire type 7
      LengthDelimited(2, Tag(1, 0)) + whole,  // truncated index
      whole + std::string(11, '\xff'),        // an 11-byte varint tag
  };
  for (const std::string& bad : malformed) {
    const RawStepResult result = RunRawStep({Header(0), bad});
    EXPECT_EQ(result.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(result.status.error_message(),
                HasSubstr("malformed protobuf message"));
    ASSERT_NO_FATAL_FAILURE(before.ExpectUnchanged(*stub_, job_ids_[0]));
  }
}

TEST_F(StepWireTest, MalformedOrChunkFirstMessageIsInvalidArgument) {
  v1::StepRequest request;
  *request.mutable_chunk() = GradChunk(0);
  const RawStepResult chunk_first =
      RunRawStep({request.SerializeAsString(), Header(0)});
  EXPECT_EQ(chunk_first.status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(chunk_first.status.error_message(),
              HasSubstr("must be its header"));

  const std::string header = Header(0);
  const RawStepResult truncated =
      RunRawStep({header.substr(0, header.size() - 1)});
  EXPECT_EQ(truncated.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(truncated.status.error_message(), HasSubstr("malformed"));
}

}  // namespace
}  // namespace depot::testing
