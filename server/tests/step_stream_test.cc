#include "server/step_stream.h"

#include <memory>
#include <string>
#include <vector>

#include "depot/v1/depot.pb.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/metrics.h"

namespace depot {
namespace {

// A written message as protobuf parses it: the stream's hand-encoded chunks
// must read back as the same StepResponse.
v1::StepResponse Parse(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  v1::StepResponse response;
  EXPECT_TRUE(response.ParseFromString(bytes));
  return response;
}

// Records the transport calls; the test completes writes by hand.
class FakeTransport : public StepTransport {
 public:
  void StartWriting(const grpc::ByteBuffer* response) override {
    buffers.push_back(*response);
    writes.push_back(Parse(*response));
  }
  void WriteLastAndFinish(const grpc::ByteBuffer* response) override {
    buffers.push_back(*response);
    writes.push_back(Parse(*response));
    finished_ok = true;
  }
  void FinishWithError(const absl::Status& status) override { error = status; }
  void ResumeReading() override { ++resumed; }

  // What gRPC would hold: references to the written messages' slices.
  std::vector<grpc::ByteBuffer> buffers;
  std::vector<v1::StepResponse> writes;
  bool finished_ok = false;
  absl::Status error;
  int resumed = 0;
};

ChunkWeights Weights(uint64_t chunk, std::string bytes, double seconds,
                     bool replayed) {
  return {chunk, std::make_shared<const std::string>(std::move(bytes)), seconds,
          replayed, nullptr};
}

class StepStreamTest : public ::testing::Test {
 protected:
  prometheus::Registry registry_;
  ServerMetrics metrics_{registry_};
  FakeTransport transport_;
  StepStream stream_{&transport_, &metrics_};
};

TEST_F(StepStreamTest, WritesOneChunkAtATime) {
  stream_.Deliver(Weights(4, "abcd", 0.0, false));
  stream_.Deliver(Weights(5, "efgh", 0.0, false));
  ASSERT_EQ(transport_.writes.size(), 1u);
  EXPECT_EQ(transport_.writes[0].chunk().index(), 4u);
  EXPECT_EQ(transport_.writes[0].chunk().payload(), "abcd");
  stream_.OnWriteDone(true);
  ASSERT_EQ(transport_.writes.size(), 2u);
  EXPECT_EQ(transport_.writes[1].chunk().index(), 5u);
}

TEST_F(StepStreamTest, WeightsAreSentFromTheSharedPayloadWithoutACopy) {
  auto payload = std::make_shared<const std::string>(1000, 'w');
  stream_.Deliver({7, payload, 0.0, false, nullptr});
  ASSERT_EQ(transport_.buffers.size(), 1u);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(transport_.buffers[0].Dump(&slices).ok());
  ASSERT_EQ(slices.size(), 2u);  // the encoded prefix, then the payload
  EXPECT_EQ(reinterpret_cast<const char*>(slices[1].begin()), payload->data());
  EXPECT_EQ(transport_.writes[0].chunk().index(), 7u);
  EXPECT_EQ(transport_.writes[0].chunk().payload(), *payload);

  // The payload lives while a slice references it, and not longer.
  stream_.OnWriteDone(true);
  EXPECT_GT(payload.use_count(), 1);
  slices.clear();
  transport_.buffers.clear();
  EXPECT_EQ(payload.use_count(), 1);
}

TEST_F(StepStreamTest, FinishesWithStatsOnceEveryExpectedChunkIsWritten) {
  stream_.set_step(3);
  stream_.ExpectChunk();
  stream_.ExpectChunk();
  stream_.Deliver(Weights(4, "abcd", 0.0, /*replayed=*/true));
  stream_.ReadsDone();
  stream_.OnWriteDone(true);
  EXPECT_FALSE(transport_.finished_ok);  // chunk 5 is still owed

  stream_.Deliver(Weights(5, "efgh", 0.25, false));
  stream_.OnWriteDone(true);
  ASSERT_TRUE(transport_.finished_ok);
  ASSERT_EQ(transport_.writes.size(), 3u);
  const v1::StepStats& stats = transport_.writes[2].stats();
  EXPECT_EQ(stats.step(), 3u);
  EXPECT_EQ(stats.chunks(), 2u);
  EXPECT_EQ(stats.chunks_replayed(), 1u);
  EXPECT_EQ(stats.update_seconds(), 0.25);
  EXPECT_EQ(metrics_.sent_step_bytes.Value(), 8.0);
}

// --checkpoint_max_lag_steps: the stream's end waits for its gate, and
// only its end: the weights go out at once, a failure is never held.
TEST_F(StepStreamTest, FinishWaitsForTheGateOnly) {
  std::vector<uint64_t> asked;
  bool open = false;
  stream_.set_step(7);
  stream_.set_finish_gate([&](uint64_t step) {
    asked.push_back(step);
    return open;
  });
  stream_.ExpectChunk();
  stream_.Deliver(Weights(4, "abcd", 0.0, false));
  ASSERT_EQ(transport_.writes.size(), 1u);  // not held
  stream_.ReadsDone();
  stream_.OnWriteDone(true);
  EXPECT_FALSE(transport_.finished_ok);
  EXPECT_EQ(asked, std::vector<uint64_t>{7});
  // Asked once: later events wait for the gate to call back.
  stream_.DeliverGradStats(GradStats());
  stream_.OnWriteDone(true);
  EXPECT_EQ(asked.size(), 1u);
  EXPECT_FALSE(transport_.finished_ok);
  stream_.FinishGateOpened();
  EXPECT_TRUE(transport_.finished_ok);
  EXPECT_EQ(transport_.writes.back().stats().step(), 7u);
}

TEST_F(StepStreamTest, AFailureIsNotHeldByTheGate) {
  stream_.set_finish_gate([](uint64_t) { return false; });
  stream_.ExpectChunk();
  stream_.Deliver(Weights(4, "abcd", 0.0, false));
  stream_.ReadsDone();
  stream_.OnWriteDone(true);
  EXPECT_FALSE(transport_.finished_ok);
  stream_.Fail(absl::UnavailableError("server is shutting down"));
  EXPECT_EQ(transport_.error.code(), absl::StatusCode::kUnavailable);
}

TEST_F(StepStreamTest, AcksAndGradStatsAreWrittenInDeliveryOrder) {
  stream_.DeliverAck(4);
  stream_.DeliverGradStats({25.0, 4.0, false, 3});
  stream_.Deliver(Weights(4, "abcd", 0.0, false));
  ASSERT_EQ(transport_.writes.size(), 1u);
  EXPECT_EQ(transport_.writes[0].ack().index(), 4u);
  stream_.OnWriteDone(true);
  ASSERT_EQ(transport_.writes.size(), 2u);
  const v1::GradStats& stats = transport_.writes[1].grad_stats();
  EXPECT_EQ(stats.sum_squares(), 25.0);
  EXPECT_EQ(stats.max_abs(), 4.0);
  EXPECT_FALSE(stats.non_finite());
  EXPECT_EQ(stats.zero_count(), 3u);
  stream_.OnWriteDone(true);
  ASSERT_EQ(transport_.writes.size(), 3u);
  EXPECT_EQ(transport_.writes[2].chunk().index(), 4u);
}

// Sum-only tensors: a chunk's GradSum is written just before its weights,
// and only the weights answer the chunk.
TEST_F(StepStreamTest, AGradSumGoesJustBeforeItsWeightsAndIsNotAnAnswer) {
  stream_.set_step(1);
  stream_.ExpectChunk();
  ChunkWeights weights = Weights(4, "abcd", 0.0, false);
  weights.grad_sum = std::make_shared<const GradSumReply>(
      GradSumReply{"12345678", {3, 5}, {}});
  stream_.Deliver(std::move(weights));
  stream_.ReadsDone();
  ASSERT_EQ(transport_.writes.size(), 1u);
  EXPECT_EQ(transport_.writes[0].grad_sum().index(), 4u);
  EXPECT_EQ(transport_.writes[0].grad_sum().sums(), "12345678");
  EXPECT_EQ(transport_.writes[0].grad_sum().skipped_tensors_size(), 2);
  EXPECT_EQ(transport_.writes[0].grad_sum().skipped_tensors(1), 5u);
  stream_.OnWriteDone(true);
  EXPECT_FALSE(transport_.finished_ok);  // the weights are still owed
  ASSERT_EQ(transport_.writes.size(), 2u);
  EXPECT_EQ(transport_.writes[1].chunk().index(), 4u);
  stream_.OnWriteDone(true);
  ASSERT_TRUE(transport_.finished_ok);
  EXPECT_EQ(transport_.writes.back().stats().chunks(), 1u);
  EXPECT_EQ(metrics_.sent_step_bytes.Value(), 12.0);
}

TEST_F(StepStreamTest, AnAckIsNotAnAnsweredChunk) {
  stream_.set_step(1);
  stream_.ExpectChunk();
  stream_.DeliverAck(4);
  stream_.ReadsDone();
  stream_.OnWriteDone(true);
  EXPECT_FALSE(transport_.finished_ok);  // chunk 4's weights are still owed
  stream_.Deliver(Weights(4, "abcd", 0.0, false));
  stream_.OnWriteDone(true);
  ASSERT_TRUE(transport_.finished_ok);
  EXPECT_EQ(transport_.writes.back().stats().chunks(), 1u);
  EXPECT_EQ(metrics_.sent_step_bytes.Value(), 4.0);
}

// Issue 13: the in-flight window was enforced by the client only. The server
// stops reading a stream that has kCredits contributions unanswered, and
// resumes once an answer (an ack or weights, each chunk counted once) is
// written: one still in the send queue holds its credit.
TEST_F(StepStreamTest, ReaderStopsAtItsCreditsAndResumesOnAnAnswer) {
  for (uint64_t chunk = 0; chunk < StepStream::kCredits; ++chunk) {
    EXPECT_TRUE(stream_.MayRead()) << chunk;
    stream_.ExpectChunk();
  }
  EXPECT_FALSE(stream_.MayRead());
  EXPECT_EQ(transport_.resumed, 0);
  // A two-phase ack of chunk 3 answers it once written: the reader resumes,
  // once.
  stream_.DeliverAck(3);
  EXPECT_EQ(transport_.resumed, 0);
  stream_.OnWriteDone(true);
  EXPECT_EQ(transport_.resumed, 1);
  stream_.ExpectChunk();
  EXPECT_FALSE(stream_.MayRead());
  // Chunk 3's weights do not answer it again.
  stream_.Deliver(Weights(3, "abcd", 0.0, false));
  stream_.OnWriteDone(true);
  EXPECT_EQ(transport_.resumed, 1);
  stream_.Deliver(Weights(5, "abcd", 0.0, false));
  stream_.OnWriteDone(true);
  EXPECT_EQ(transport_.resumed, 2);
  EXPECT_TRUE(stream_.MayRead());
}

TEST_F(StepStreamTest, AFailedStreamIsNotResumed) {
  for (uint64_t chunk = 0; chunk < StepStream::kCredits; ++chunk) {
    stream_.ExpectChunk();
  }
  EXPECT_FALSE(stream_.MayRead());
  stream_.Deliver(Weights(0, "abcd", 0.0, false));
  stream_.Fail(absl::CancelledError("gone"));
  stream_.OnWriteDone(true);
  EXPECT_EQ(transport_.resumed, 0);
}

TEST_F(StepStreamTest, FailFinishesAtOnceWhenNoWriteIsInFlight) {
  stream_.ExpectChunk();
  stream_.Fail(absl::UnavailableError("server is shutting down"));
  EXPECT_EQ(transport_.error.code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(stream_.ended());
  EXPECT_FALSE(stream_.IsOpen());
}

TEST_F(StepStreamTest, FailWaitsForTheWriteInFlightAndDropsTheRest) {
  stream_.Deliver(Weights(4, "abcd", 0.0, false));
  stream_.Deliver(Weights(5, "efgh", 0.0, false));
  stream_.Fail(absl::AbortedError("job 1 was deleted"));
  EXPECT_TRUE(transport_.error.ok());
  stream_.OnWriteDone(true);
  EXPECT_EQ(transport_.error.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(transport_.writes.size(), 1u);
}

TEST_F(StepStreamTest, FailedWriteFinishesWithCancelled) {
  stream_.Deliver(Weights(4, "abcd", 0.0, false));
  stream_.OnWriteDone(false);
  EXPECT_EQ(transport_.error.code(), absl::StatusCode::kCancelled);
}

TEST_F(StepStreamTest, FirstFailureWins) {
  stream_.Fail(absl::AbortedError("job 1 was deleted"));
  stream_.Fail(absl::UnavailableError("server is shutting down"));
  EXPECT_EQ(transport_.error.code(), absl::StatusCode::kAborted);
}

TEST_F(StepStreamTest, DetachedStreamIsNotOpenAndIgnoresDeliveries) {
  EXPECT_TRUE(stream_.IsOpen());
  stream_.Detach();
  EXPECT_FALSE(stream_.IsOpen());
  stream_.Deliver(Weights(0, "abcd", 0.0, false));
  EXPECT_TRUE(transport_.writes.empty());
}

}  // namespace
}  // namespace depot
