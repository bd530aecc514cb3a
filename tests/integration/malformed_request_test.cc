// Requests that are not valid protobuf encodings, sent as raw bytes with
// grpc::GenericStub, and size fields past their bounds (issue 13): every one
// is INVALID_ARGUMENT with a message naming what was wrong, never gRPC's
// INTERNAL with an empty message or UNKNOWN; a malformed message in the middle
// of a client stream fails the stream instead of ending it quietly; and the
// job's state is left as it was.
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "depot/layout.h"
#include "depot/shard_plan.h"
#include "gmock/gmock.h"
#include "grpcpp/channel.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "metrics_scrape.h"
#include "raw_driver.h"
#include "server_process.h"
#include "training_data.h"
#include "wire/wire.h"

namespace depot::testing {
namespace {

using ::testing::HasSubstr;

// Field 0 with wire type 7: no protobuf message starts so.
const std::string kGarbage("\x07\xff\xff\xff", 4);

grpc::ByteBuffer BufferOf(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer BufferOf(const google::protobuf::MessageLite& message) {
  return BufferOf(message.SerializeAsString());
}

// One call of `method` ("/depot.v1.Depot/GetJob") that writes `messages` as
// they are, half-closes, reads whatever comes back and returns the status:
// the wire exchange of any method, unary or streaming, through
// grpc::GenericStub, step by step on a completion queue.
grpc::Status RawCall(const std::string& address, const std::string& method,
                     const std::vector<grpc::ByteBuffer>& messages,
                     std::vector<grpc::ByteBuffer>* responses = nullptr) {
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(60));
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&context, method, &cq);
  void* tag = nullptr;
  bool ok = false;
  // Each operation in turn, waited for before the next.
  auto wait = [&] {
    EXPECT_TRUE(cq.Next(&tag, &ok));
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  bool open = wait();
  for (const grpc::ByteBuffer& message : messages) {
    if (!open) break;
    call->Write(message, reinterpret_cast<void*>(2));
    open = wait();
  }
  if (open) {
    call->WritesDone(reinterpret_cast<void*>(3));
    wait();
  }
  while (true) {
    grpc::ByteBuffer response;
    call->Read(&response, reinterpret_cast<void*>(4));
    if (!wait()) break;
    if (responses != nullptr) responses->push_back(std::move(response));
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  wait();
  return status;
}

class MalformedRequestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = NewDepotStub(server_->grpc_address());
    config_ = SmallJobConfig("malformed", /*num_workers=*/1,
                             /*num_servers=*/1);
    JobConfigToProto(config_, &spec_);
    v1::CreateJobResponse created;
    const grpc::Status status = RawCreateJob(*stub_, spec_, 0, &created);
    ASSERT_TRUE(status.ok()) << status.error_message();
    job_id_ = created.job_id();
    fingerprint_ = created.fingerprint();
    layout_ = std::make_unique<Layout>(
        *Layout::Create(config_.tensors, config_.alignment_elems));
    plan_ = std::make_unique<ShardPlan>(
        *ShardPlan::Create(layout_->total_elems(), 1, config_.chunk_elems));
    ASSERT_GE(plan_->num_chunks(), 2u);
  }

  grpc::Status Call(const std::string& method,
                    const std::vector<grpc::ByteBuffer>& messages) {
    return RawCall(server_->grpc_address(),
                   absl::StrCat("/depot.v1.Depot/", method), messages);
  }

  std::string PullAll() {
    std::string payload;
    const grpc::Status status = RawPull(
        *stub_,
        MakePullRequest(job_id_, fingerprint_, 0, layout_->total_elems(),
                        v1::DTYPE_FP32),
        &payload);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return payload;
  }

  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::Depot::Stub> stub_;
  JobConfig config_;
  v1::JobSpec spec_;
  uint64_t job_id_ = 0;
  uint64_t fingerprint_ = 0;
  std::unique_ptr<Layout> layout_;
  std::unique_ptr<ShardPlan> plan_;
};

// Before: INTERNAL with an empty message, from gRPC, before the handler ran.
TEST_F(MalformedRequestTest, GarbageRequestOfEveryMethodButStepIsInvalidArgument) {
  StateChecksumWatch state;
  ASSERT_NO_FATAL_FAILURE(state.Record(*stub_, job_id_));
  for (const char* method :
       {"CreateJob", "InitWeights", "PullWeights", "GetJob", "DeleteJob",
        "ExportState", "ImportState", "Checkpoint", "ListCheckpoints",
        "RollBack", "ImportCheckpoint", "ServerStatus", "Drain"}) {
    const grpc::Status status = Call(method, {BufferOf(kGarbage)});
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << method << ": " << status.error_message();
    EXPECT_THAT(status.error_message(),
                HasSubstr(absl::StrCat("malformed ", method, " request")))
        << method;
  }
  // The server is still up, the job still there and unchanged.
  ASSERT_NO_FATAL_FAILURE(state.ExpectUnchanged(*stub_, job_id_));
}

// A well-formed request through the raw path still works: the methods are
// the same on the wire.
TEST_F(MalformedRequestTest, WellFormedRawRequestIsAnswered) {
  v1::GetJobRequest request;
  request.set_job_id(job_id_);
  std::vector<grpc::ByteBuffer> responses;
  const grpc::Status status =
      RawCall(server_->grpc_address(), "/depot.v1.Depot/GetJob",
              {BufferOf(request)}, &responses);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(responses.size(), 1u);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(responses[0].Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  v1::JobStatus job;
  ASSERT_TRUE(job.ParseFromString(bytes));
  EXPECT_EQ(job.job_id(), job_id_);
  EXPECT_EQ(job.fingerprint(), fingerprint_);
}

// Before: a request of fixed fields padded to megabytes with an unknown
// field was parsed whole (protobuf keeps unknown fields, a copy of them) and
// answered. Now it is refused from its size before it is parsed.
TEST_F(MalformedRequestTest, OversizedRequestOfFixedFieldsIsRefusedUnparsed) {
  StateChecksumWatch state;
  ASSERT_NO_FATAL_FAILURE(state.Record(*stub_, job_id_));
  v1::GetJobRequest request;
  request.set_job_id(job_id_);
  // Field 1000, length-delimited, 1 MiB: unknown to GetJobRequest.
  std::string padded = request.SerializeAsString();
  padded += std::string("\xc2\x3e\x80\x80\x40", 5);
  padded += std::string(size_t{1} << 20, 'p');
  ASSERT_TRUE(v1::GetJobRequest().ParseFromString(padded));
  for (const char* method :
       {"GetJob", "DeleteJob", "PullWeights", "ExportState", "Checkpoint",
        "ListCheckpoints", "RollBack"}) {
    const grpc::Status status = Call(method, {BufferOf(padded)});
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << method << ": " << status.error_message();
    EXPECT_THAT(status.error_message(),
                HasSubstr(absl::StrCat(method, " request of ", padded.size(),
                                       " bytes is larger than its limit")))
        << method;
  }
  ASSERT_NO_FATAL_FAILURE(state.ExpectUnchanged(*stub_, job_id_));
}

// Before: the malformed message was taken as the stream's end, the RPC was
// OK, and the chunk after it was dropped without a word.
TEST_F(MalformedRequestTest, MalformedMessageInsideInitWeightsFailsTheStream) {
  const std::string weights =
      MakeInitialWeights(*layout_, DType::kFloat32, /*seed=*/5);
  v1::InitWeightsRequest header;
  *header.mutable_header() =
      MakeInitHeader(job_id_, fingerprint_, v1::DTYPE_FP32);
  v1::InitWeightsRequest first;
  *first.mutable_chunk() = MakeChunk(*plan_, 0, weights.data(), DType::kFloat32);
  v1::InitWeightsRequest second;
  *second.mutable_chunk() =
      MakeChunk(*plan_, 1, weights.data(), DType::kFloat32);
  const std::string before = PullAll();

  const grpc::Status status =
      Call("InitWeights", {BufferOf(header), BufferOf(first),
                           BufferOf(kGarbage), BufferOf(second)});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("malformed InitWeights request"));

  // The chunk before the bad message was written (as the protocol says of
  // what a stream accepted before its error); the one after it was not.
  const std::string after = PullAll();
  const ChunkRange c0 = plan_->chunk(0);
  const ChunkRange c1 = plan_->chunk(1);
  EXPECT_EQ(after.substr(c0.begin * 4, c0.size() * 4),
            weights.substr(c0.begin * 4, c0.size() * 4));
  EXPECT_EQ(after.substr(c1.begin * 4, c1.size() * 4),
            before.substr(c1.begin * 4, c1.size() * 4));
}

TEST_F(MalformedRequestTest, MalformedMessageInsideImportStateFailsTheStream) {
  StateChecksumWatch state;
  ASSERT_NO_FATAL_FAILURE(state.Record(*stub_, job_id_));
  v1::ImportStateRequest header;
  header.mutable_header()->set_job_id(job_id_);
  header.mutable_header()->set_fingerprint(fingerprint_);
  const grpc::Status status =
      Call("ImportState", {BufferOf(header), BufferOf(kGarbage)});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("malformed ImportState request"));
  ASSERT_NO_FATAL_FAILURE(state.ExpectUnchanged(*stub_, job_id_));
}

// Issue 13: num_servers 2^27 grew the server by 5.2 GB (and stayed OK),
// 2^30 escaped as UNKNOWN; num_workers 2^31 allocated per-worker bookkeeping
// outside the budget; chunk_elems had no bound, so a job could exist whose
// state can never be exported. Each is INVALID_ARGUMENT naming the field now.
TEST_F(MalformedRequestTest, SizeFieldsPastTheirBoundsAreInvalidArgument) {
  struct Case {
    const char* field;
    void (*mutate)(v1::JobSpec&);
  };
  const Case cases[] = {
      {"num_servers", [](v1::JobSpec& s) { s.set_num_servers(1u << 27); }},
      {"num_servers", [](v1::JobSpec& s) { s.set_num_servers(1u << 30); }},
      {"num_workers", [](v1::JobSpec& s) { s.set_num_workers(1u << 26); }},
      {"num_workers", [](v1::JobSpec& s) { s.set_num_workers(1u << 31); }},
      {"chunk_elems",
       [](v1::JobSpec& s) { s.set_chunk_elems(uint64_t{1} << 30); }},
      {"name", [](v1::JobSpec& s) { s.set_name(std::string(4096, 'n')); }},
  };
  for (const Case& c : cases) {
    v1::JobSpec spec = spec_;
    spec.set_name(absl::StrCat("bounds-", c.field));
    c.mutate(spec);
    v1::CreateJobResponse response;
    const grpc::Status status = RawCreateJob(*stub_, spec, 0, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.field << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(absl::StrCat(c.field, ":")));
  }
  // None of them left a job behind.
  v1::JobStatus job;
  EXPECT_TRUE(RawGetJob(*stub_, job_id_, false, &job).ok());
  EXPECT_EQ(RawGetJob(*stub_, job_id_ + 1, false, &job).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

// Every call reaches the service as a generic call (server/depot_service.h):
// a path it has no method for is UNIMPLEMENTED and names the path, as gRPC
// answers for a method no service registered.
TEST_F(MalformedRequestTest, AnUnknownMethodIsUnimplementedNamingIt) {
  StateChecksumWatch state;
  ASSERT_NO_FATAL_FAILURE(state.Record(*stub_, job_id_));
  for (const std::string path :
       {"/depot.v1.Depot/NoSuchMethod", "/other.v1.Service/GetJob"}) {
    const grpc::Status status =
        RawCall(server_->grpc_address(), path, {BufferOf(kGarbage)});
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << path;
    EXPECT_THAT(status.error_message(), HasSubstr(path));
  }
  ASSERT_NO_FATAL_FAILURE(state.ExpectUnchanged(*stub_, job_id_));
}

// `n` ImportState calls that send nothing, so that each handler waits in its
// first read, until the object is destroyed (which cancels them).
class WaitingCalls {
 public:
  WaitingCalls(const std::string& address, int n)
      : stub_(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials())) {
    for (int i = 0; i < n; ++i) {
      contexts_.push_back(std::make_unique<grpc::ClientContext>());
      calls_.push_back(stub_.PrepareCall(contexts_.back().get(),
                                         "/depot.v1.Depot/ImportState", &cq_));
      calls_.back()->StartCall(nullptr);
    }
    for (int i = 0; i < n; ++i) Next();
  }
  ~WaitingCalls() {
    for (auto& context : contexts_) context->TryCancel();
    std::vector<grpc::Status> statuses(calls_.size());
    for (size_t i = 0; i < calls_.size(); ++i) {
      calls_[i]->Finish(&statuses[i], nullptr);
    }
    for (size_t i = 0; i < calls_.size(); ++i) Next();
  }

 private:
  void Next() {
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq_.Next(&tag, &ok));
  }

  grpc::GenericStub stub_;
  grpc::CompletionQueue cq_;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts_;
  std::vector<std::unique_ptr<grpc::GenericClientAsyncReaderWriter>> calls_;
};

grpc::Status GetJob(v1::Depot::Stub& stub, uint64_t job_id) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(20));
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  v1::JobStatus job;
  return stub.GetJob(&context, request, &job);
}

// The blocking handlers run on threads of their own, not on gRPC's callback
// threads (server/blocking_call.h): calls whose handlers wait for their
// clients, more than gRPC has callback threads, hold up no other call.
TEST_F(MalformedRequestTest, HandlersWaitingForTheirClientsHoldUpNoOtherCall) {
  WaitingCalls waiting(server_->grpc_address(), 64);
  // Started after them, a unary call and a pull are answered while they wait.
  const grpc::Status status = GetJob(*stub_, job_id_);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(PullAll().size(), layout_->total_elems() * sizeof(float));
}

// A client that opens call after call and finishes none cannot make the
// server start threads without end (--max_handler_threads): past the limit
// a call is RESOURCE_EXHAUSTED, at once, and calls are served again once the
// waiting ones end.
TEST(HandlerThreadLimitTest, CallsPastTheLimitAreResourceExhausted) {
  constexpr int kLimit = 16;
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start({absl::StrCat("--max_handler_threads=", kLimit)});
  ASSERT_TRUE(server.ok()) << server.status();
  std::unique_ptr<v1::Depot::Stub> stub =
      NewDepotStub((*server)->grpc_address());
  constexpr uint64_t kNoSuchJob = 12345;
  {
    WaitingCalls waiting((*server)->grpc_address(), kLimit);
    // The waiting calls take their threads as the server gets to them; the
    // metrics show them against the limit. (A GetJob sent meanwhile would
    // hold a thread too, for a moment: a waiting call arriving then is
    // refused, and the limit is never reached by the waiting calls alone.)
    const std::string metrics = (*server)->metrics_address();
    ASSERT_TRUE(WaitForMetricAtLeast(metrics, "depot_handler_calls", kLimit,
                                     absl::Seconds(30))
                    .ok());
    // Every thread is taken: the next call is refused at once, and counted.
    const grpc::Status status = GetJob(*stub, kNoSuchJob);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("no thread left"));
    absl::StatusOr<std::string> text = ScrapeMetrics(metrics);
    ASSERT_TRUE(text.ok()) << text.status();
    EXPECT_EQ(MetricValue(*text, "depot_handler_calls_limit").value_or(-1),
              kLimit);
    EXPECT_GE(
        MetricValue(*text, "depot_errors_total{code=\"RESOURCE_EXHAUSTED\"}")
            .value_or(-1),
        1);
  }
  EXPECT_TRUE(WaitForMetricAtMost((*server)->metrics_address(),
                                  "depot_handler_calls", 0, absl::Seconds(30))
                  .ok());
  // The cancelled calls' threads come free as their handlers end.
  grpc::Status status;
  const auto give_up =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  do {
    status = GetJob(*stub, kNoSuchJob);
  } while (status.error_code() != grpc::StatusCode::NOT_FOUND &&
           std::chrono::steady_clock::now() < give_up);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND)
      << status.error_message();
}

}  // namespace
}  // namespace depot::testing
