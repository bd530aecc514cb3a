#include "raw_driver.h"

#include <thread>
#include <utility>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "wire/connect_errno.h"
#include "wire/wire.h"

namespace depot::testing {
namespace {

constexpr int kMaxMessageBytes = 64 << 20;

void SetDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

constexpr absl::Duration kUnaryTimeout = absl::Seconds(30);

}  // namespace

std::unique_ptr<v1::Depot::Stub> NewDepotStub(const std::string& address) {
  GuardGrpcConnectErrno();  // its first RPC does not wait for the connection
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  return v1::Depot::NewStub(grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), args));
}

v1::InitHeader MakeInitHeader(uint64_t job_id, uint64_t fingerprint,
                              v1::DType dtype) {
  v1::InitHeader header;
  header.set_job_id(job_id);
  header.set_fingerprint(fingerprint);
  header.set_dtype(dtype);
  return header;
}

v1::StepHeader MakeStepHeader(
    uint64_t job_id, uint64_t fingerprint, uint64_t step, uint32_t worker_rank,
    const std::vector<GroupHyperParams>& group_hparams) {
  v1::StepHeader header;
  header.set_job_id(job_id);
  header.set_fingerprint(fingerprint);
  header.set_step(step);
  header.set_worker_rank(worker_rank);
  GroupHyperParamsToProto(group_hparams, &header);
  return header;
}

v1::PullRequest MakePullRequest(uint64_t job_id, uint64_t fingerprint,
                                uint64_t begin, uint64_t end, v1::DType dtype) {
  v1::PullRequest request;
  request.set_job_id(job_id);
  request.set_fingerprint(fingerprint);
  request.set_begin(begin);
  request.set_end(end);
  request.set_dtype(dtype);
  return request;
}

v1::Chunk MakeChunk(const ShardPlan& plan, uint64_t index, const void* flat,
                    DType dtype) {
  const ChunkRange range = plan.chunk(index);
  const size_t element = DTypeSize(dtype);
  v1::Chunk chunk;
  chunk.set_index(index);
  chunk.set_payload(static_cast<const char*>(flat) + range.begin * element,
                    range.size() * element);
  return chunk;
}

std::vector<v1::Chunk> MakeChunks(const ShardPlan& plan, uint64_t first,
                                  uint64_t end, const void* flat, DType dtype) {
  std::vector<v1::Chunk> chunks;
  for (uint64_t index = first; index < end; ++index) {
    chunks.push_back(MakeChunk(plan, index, flat, dtype));
  }
  return chunks;
}

grpc::Status RawCreateJob(v1::Depot::Stub& stub, const v1::JobSpec& spec,
                          uint32_t server_index,
                          v1::CreateJobResponse* response) {
  grpc::ClientContext context;
  SetDeadline(context, kUnaryTimeout);
  v1::CreateJobRequest request;
  *request.mutable_spec() = spec;
  request.set_server_index(server_index);
  return stub.CreateJob(&context, request, response);
}

grpc::Status RawGetJob(v1::Depot::Stub& stub, uint64_t job_id,
                       bool with_checksum, v1::JobStatus* status) {
  grpc::ClientContext context;
  SetDeadline(context, kUnaryTimeout);
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  request.set_with_checksum(with_checksum);
  return stub.GetJob(&context, request, status);
}

namespace {

// Reads job_id's status with its checksum (gtest assertions).
void ReadStatusWithChecksum(v1::Depot::Stub& stub, uint64_t job_id,
                            v1::JobStatus* status) {
  grpc::Status rpc = RawGetJob(stub, job_id, /*with_checksum=*/true, status);
  ASSERT_TRUE(rpc.ok()) << rpc.error_message();
}

}  // namespace

void StateChecksumWatch::Record(v1::Depot::Stub& stub, uint64_t job_id,
                                v1::JobStatus* status) {
  v1::JobStatus read;
  ASSERT_NO_FATAL_FAILURE(ReadStatusWithChecksum(stub, job_id, &read));
  checksum_ = read.state_checksum();
  if (status != nullptr) *status = std::move(read);
}

void StateChecksumWatch::ExpectUnchanged(v1::Depot::Stub& stub, uint64_t job_id,
                                         v1::JobStatus* status) const {
  v1::JobStatus read;
  ASSERT_NO_FATAL_FAILURE(ReadStatusWithChecksum(stub, job_id, &read));
  EXPECT_EQ(read.state_checksum(), checksum_)
      << "a rejected request changed state";
  if (status != nullptr) *status = std::move(read);
}

grpc::Status RawInitWeights(v1::Depot::Stub& stub, const v1::InitHeader& header,
                            const std::vector<v1::Chunk>& chunks) {
  grpc::ClientContext context;
  SetDeadline(context, kUnaryTimeout);
  v1::InitWeightsResponse response;
  auto writer = stub.InitWeights(&context, &response);
  v1::InitWeightsRequest request;
  *request.mutable_header() = header;
  bool open = writer->Write(request);
  for (size_t i = 0; open && i < chunks.size(); ++i) {
    *request.mutable_chunk() = chunks[i];
    open = writer->Write(request);
  }
  writer->WritesDone();
  return writer->Finish();
}

grpc::Status RawPull(v1::Depot::Stub& stub, const v1::PullRequest& request,
                     std::string* payload) {
  grpc::ClientContext context;
  SetDeadline(context, kUnaryTimeout);
  auto reader = stub.PullWeights(&context, request);
  v1::PullResponse response;
  payload->clear();
  while (reader->Read(&response)) payload->append(response.payload());
  return reader->Finish();
}

StepStreamPlan MakeStepPlan(const v1::StepHeader& header,
                            const std::vector<v1::Chunk>& chunks) {
  StepStreamPlan plan;
  plan.messages.emplace_back();
  *plan.messages.back().mutable_header() = header;
  for (const v1::Chunk& chunk : chunks) {
    plan.messages.emplace_back();
    *plan.messages.back().mutable_chunk() = chunk;
  }
  return plan;
}

std::vector<StepStreamResult> RunStepStreams(
    v1::Depot::Stub& stub, const std::vector<StepStreamPlan>& plans,
    absl::Duration timeout, const std::function<void(size_t)>& after_plan) {
  using Stream = grpc::ClientReaderWriter<v1::StepRequest, v1::StepResponse>;
  std::vector<StepStreamResult> results(plans.size());
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<std::thread> readers;
  for (size_t i = 0; i < plans.size(); ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    SetDeadline(*contexts.back(), timeout);
    streams.push_back(stub.Step(contexts.back().get()));
    // Reading on its own thread keeps the server's writer flowing while this
    // thread is still writing this or a later stream.
    readers.emplace_back([stream = streams.back().get(), result = &results[i]] {
      v1::StepResponse response;
      while (stream->Read(&response)) {
        if (response.has_chunk()) result->weights.push_back(response.chunk());
        if (response.has_stats()) result->stats = response.stats();
      }
    });
    for (const v1::StepRequest& message : plans[i].messages) {
      if (!streams.back()->Write(message)) break;  // the server ended it
    }
    streams.back()->WritesDone();
    if (after_plan != nullptr) after_plan(i);
  }
  for (size_t i = 0; i < plans.size(); ++i) {
    readers[i].join();
    results[i].status = streams[i]->Finish();
  }
  return results;
}

}  // namespace depot::testing
