#include "step_stream.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "depot/v1/depot.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "raw_bidi_call.h"
#include "wire/byte_buffers.h"
#include "wire/step_codec.h"
#include "wire/wire.h"

namespace depot::client_internal {
namespace {

void CommitToProto(const StepCommit& commit, v1::StepCommit* out) {
  out->set_clip_coef(commit.clip_coef);
  out->set_skip(commit.skip);
}

// The slices gRPC holds that reference the caller's gradient buffer: each
// holds a reference to this count, so that the stream can wait until gRPC
// has let go of them all before the caller may reuse the buffer.
class LentSlices : public std::enable_shared_from_this<LentSlices> {
 public:
  // The user_data of one more lent slice, for Release; `feed`, when not
  // null, is told when chunk `index`'s slice is released.
  void* Lend(ChunkFeed* feed = nullptr, uint64_t index = 0) {
    absl::MutexLock lock(&mu_);
    ++lent_;
    return new Loan{shared_from_this(), feed, index};
  }

  // gRPC's release of a lent slice; any thread.
  static void Release(void* user_data) {
    std::unique_ptr<Loan> loan(static_cast<Loan*>(user_data));
    if (loan->feed != nullptr) loan->feed->Released(loan->index);
    absl::MutexLock lock(&loan->owner->mu_);
    --loan->owner->lent_;
  }

  // Blocks until every lent slice is released. Once the stream's call is
  // over, gRPC releases them as soon as the bytes are written or the
  // connection is dropped.
  void WaitUntilReleased() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* lent) { return *lent == 0; }, &lent_));
  }

 private:
  struct Loan {
    std::shared_ptr<LentSlices> owner;
    ChunkFeed* feed;
    uint64_t index;
  };

  absl::Mutex mu_;
  int lent_ ABSL_GUARDED_BY(mu_) = 0;
};

// One Step RPC of the client: sends a stream's share of the chunks and reads
// their weights back (the server's side of the call is server/step_stream.h's
// StepStream).
class StepCall {
 public:
  StepCall(const StepChannel& channel, const StepStreamParams& params,
           CallGroup& group, std::shared_ptr<LentSlices> lent)
      : params_(params),
        chunks_(params.feed != nullptr ? params.feed_chunks
                                       : params.end_chunk - params.first_chunk),
        span_(params.end_chunk - params.first_chunk),
        window_(static_cast<uint64_t>(params.max_inflight_chunks)),
        two_phase_(params.barrier != nullptr),
        lent_(std::move(lent)),
        context_(group, params.deadline),
        stream_(std::make_unique<RawBidiCall>(channel.step_stub, kStepMethod,
                                              context_.get())) {
    seen_.assign(span_, false);
    answered_.assign(span_, false);
    sent_flags_.assign(span_, false);
  }

  absl::StatusOr<StepStreamStats> Run() {
    std::thread reader([this] { ReadAnswers(); });
    absl::Status writer = SendGradients();
    if (!writer.ok()) context_.get()->TryCancel();
    reader.join();
    const grpc::Status finish = stream_->Finish();
    // After the reader has stopped, its fields are ours to read.
    if (!protocol_error_.ok()) return protocol_error_;
    if (!writer.ok()) return writer;
    if (!finish.ok()) return FromGrpcStatus(finish);
    if (stats_.chunks != chunks_) {
      return absl::InternalError(absl::StrCat(
          "step ", params_.step, " stream ended after ", stats_.chunks, " of ",
          chunks_, " chunks were answered"));
    }
    if (!have_server_stats_) {
      return absl::InternalError(absl::StrCat(
          "step ", params_.step, " stream ended without StepStats"));
    }
    stats_.bytes_sent = bytes_sent_;
    return stats_;
  }

 private:
  // The writer: runs on the caller's thread. Returns an error only for what
  // the stream itself cannot tell (the barrier's); a broken stream returns OK
  // and Finish() tells why.
  absl::Status SendGradients() {
    const size_t grad_size = DTypeSize(params_.grad_dtype);
    grpc::ByteBuffer buffer;
    v1::StepRequest request;
    v1::StepHeader* header = request.mutable_header();
    header->set_job_id(params_.job_id);
    header->set_fingerprint(params_.fingerprint);
    header->set_step(params_.step);
    header->set_worker_rank(params_.worker_rank);
    if (params_.group_hparams != nullptr) {
      GroupHyperParamsToProto(*params_.group_hparams, header);
    }
    if (params_.loss_scale != 1.0) header->set_loss_scale(params_.loss_scale);
    header->set_two_phase(two_phase_);
    if (params_.known_commit.has_value()) {
      CommitToProto(*params_.known_commit, header->mutable_commit());
    }
    if (params_.sum_only_tensors != nullptr) {
      header->set_sum_only_tensors(*params_.sum_only_tensors);
      header->set_omit_sums(params_.omit_sums);
      header->set_fills_captures(params_.fills_captures);
    }
    if (params_.no_grad_tensors != nullptr) {
      header->set_no_grad_tensors(*params_.no_grad_tensors);
    }
    if (params_.local_ranks != 0) {
      header->set_local_ranks(params_.local_ranks);
      header->set_local_rank(params_.local_rank);
      header->set_bucket_chunks(params_.bucket_chunks);
    }
    wire::SerializeToBuffer(request, &buffer);
    if (!stream_->Write(buffer)) return absl::OkStatus();
    if (params_.feed != nullptr) {
      if (absl::Status s = SendFedChunks(); !s.ok()) return s;
      return FinishSending(request, buffer);
    }

    const char* grads = static_cast<const char*>(params_.grads);
    std::vector<ChunkOverride>::const_iterator override_it;
    if (params_.overrides != nullptr) {
      override_it = std::lower_bound(
          params_.overrides->begin(), params_.overrides->end(),
          params_.first_chunk, [](const ChunkOverride& o, uint64_t index) {
            return o.chunk_index < index;
          });
    }
    for (uint64_t index = params_.first_chunk; index < params_.end_chunk;
         ++index) {
      if (params_.overrides != nullptr) {
        for (; override_it != params_.overrides->end() &&
               override_it->chunk_index == index;
             ++override_it) {
          if (!SendOverride(*override_it)) return absl::OkStatus();
        }
      }
      if (!WaitForWindow(index)) return absl::OkStatus();
      const ChunkRange chunk = params_.plan->chunk(index);
      const size_t bytes = chunk.size() * grad_size;
      buffer = wire::ChunkMessageBuffer(wire::StepMessage::kRequest, index,
                                        grads + chunk.begin * grad_size, bytes,
                                        &LentSlices::Release, lent_->Lend());
      if (!stream_->Write(buffer)) return absl::OkStatus();
      bytes_sent_ += bytes;
    }
    return FinishSending(request, buffer);
  }

  // A streamed step's chunks, as the feed gives them. INTERNAL when the feed
  // gives a chunk outside the stream's range or twice (an engine bug).
  absl::Status SendFedChunks() {
    const size_t grad_size = DTypeSize(params_.grad_dtype);
    for (uint64_t n = 0; n < chunks_; ++n) {
      std::optional<ChunkFeed::Ready> ready = params_.feed->Next();
      if (!ready.has_value()) {
        return absl::AbortedError(absl::StrCat(
            "step ", params_.step, ": the chunk feed ended after ", n, " of ",
            chunks_, " chunks"));
      }
      if (ready->index < params_.first_chunk ||
          ready->index >= params_.end_chunk) {
        return absl::InternalError(absl::StrCat(
            "step ", params_.step, ": the chunk feed gave chunk ", ready->index,
            " outside the stream's chunks [", params_.first_chunk, ", ",
            params_.end_chunk, ")"));
      }
      {
        absl::MutexLock lock(&mu_);
        if (sent_flags_[ready->index - params_.first_chunk]) {
          return absl::InternalError(absl::StrCat(
              "step ", params_.step, ": the chunk feed gave chunk ",
              ready->index, " twice"));
        }
      }
      if (!WaitForWindow(ready->index)) {
        params_.feed->Released(ready->index);
        return absl::OkStatus();
      }
      const size_t bytes = params_.plan->chunk(ready->index).size() * grad_size;
      grpc::ByteBuffer buffer = wire::ChunkMessageBuffer(
          wire::StepMessage::kRequest, ready->index, ready->data, bytes,
          &LentSlices::Release, lent_->Lend(params_.feed, ready->index));
      if (!stream_->Write(buffer)) return absl::OkStatus();
      bytes_sent_ += bytes;
    }
    return absl::OkStatus();
  }

  // After the chunks: the two-phase exchange, then the half-close.
  absl::Status FinishSending(v1::StepRequest& request,
                             grpc::ByteBuffer& buffer) {
    buffer.Clear();
    if (two_phase_) {
      std::optional<v1::GradStats> stats = WaitForGradStats();
      if (!stats.has_value()) return absl::OkStatus();
      absl::StatusOr<StepCommit> commit =
          params_.barrier->Report(params_.server, *stats, params_.deadline);
      if (!commit.ok()) return commit.status();
      CommitToProto(*commit, request.mutable_commit());
      wire::SerializeToBuffer(request, &buffer);
      if (!stream_->Write(buffer)) return absl::OkStatus();
    }
    stream_->WritesDone();
    return absl::OkStatus();
  }

  // Sends one weights override (rare: weights changed outside the optimizer,
  // so a protobuf copy of the values is fine). False once the stream broke.
  bool SendOverride(const ChunkOverride& piece) {
    v1::StepRequest request;
    v1::WeightsOverride* message = request.mutable_weights_override();
    message->set_chunk_index(piece.chunk_index);
    message->set_offset(piece.offset);
    message->set_payload(reinterpret_cast<const char*>(piece.values),
                         piece.count * sizeof(float));
    grpc::ByteBuffer buffer;
    wire::SerializeToBuffer(request, &buffer);
    return stream_->Write(buffer);
  }

  // Blocks until one more chunk may be sent, and counts it as sent (before the
  // Write, so that its answer is never seen as unsolicited). False once the
  // reader has stopped: the stream is over and nothing more is worth sending.
  bool WaitForWindow(uint64_t index) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &StepCall::MaySendOrStop));
    if (reader_done_) return false;
    ++sent_;
    sent_flags_[index - params_.first_chunk] = true;
    return true;
  }

  bool MaySendOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return reader_done_ || sent_ - answered_count_ < window_;
  }

  // Blocks until the server's GradStats have arrived; nullopt once the reader
  // has stopped without them.
  std::optional<v1::GradStats> WaitForGradStats() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &StepCall::HaveGradStatsOrStop));
    return grad_stats_;
  }

  bool HaveGradStatsOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return reader_done_ || grad_stats_.has_value();
  }

  // The reader: runs on its own thread until the stream ends or breaks
  // protocol.
  void ReadAnswers() {
    grpc::ByteBuffer buffer;
    wire::ReceivedMessage received;
    while (stream_->Read(&buffer)) {
      absl::Status status = received.Load(buffer);
      if (status.ok()) status = Accept(received.pieces());
      received.Clear();
      buffer.Clear();
      if (!status.ok()) {
        protocol_error_ = std::move(status);
        context_.get()->TryCancel();
        break;
      }
    }
    absl::MutexLock lock(&mu_);
    reader_done_ = true;
  }

  // A chunk's weights parsed by hand, anything else (or weights in an
  // encoding the codec leaves to protobuf) by protobuf.
  absl::Status Accept(wire::MessagePieces pieces) {
    wire::ChunkFields chunk;
    absl::StatusOr<wire::MessageKind> kind =
        wire::ParseChunkMessage(pieces, wire::StepMessage::kResponse, &chunk);
    if (!kind.ok()) {
      return absl::InternalError(
          absl::StrCat("server sent a StepResponse that is not valid: ",
                       kind.status().message()));
    }
    if (*kind == wire::MessageKind::kChunk) {
      return AcceptWeights(chunk.index, chunk.payload_size,
                           [&](char* out, uint64_t offset, uint64_t n) {
                             wire::CopyMessageBytes(
                                 pieces, chunk.payload_offset + offset, n, out);
                           });
    }
    v1::StepResponse response;
    if (absl::Status s =
            wire::ParseFromPieces(pieces, "StepResponse", &response);
        !s.ok()) {
      return absl::InternalError(absl::StrCat("server sent a ", s.message()));
    }
    switch (response.kind_case()) {
      case v1::StepResponse::kStats:
        return AcceptStats(response.stats());
      case v1::StepResponse::kChunk: {
        const std::string& payload = response.chunk().payload();
        return AcceptWeights(response.chunk().index(), payload.size(),
                             [&](char* out, uint64_t offset, uint64_t n) {
                               payload.copy(out, n, offset);
                             });
      }
      case v1::StepResponse::kAck:
        return AcceptAck(response.ack());
      case v1::StepResponse::kGradStats:
        return AcceptGradStats(response.grad_stats());
      case v1::StepResponse::kGradSum:
        return AcceptGradSum(response.grad_sum());
      case v1::StepResponse::KIND_NOT_SET:
        break;
    }
    return absl::InternalError("server sent an empty StepResponse");
  }

  absl::Status AcceptStats(const v1::StepStats& stats) {
    if (have_server_stats_) {
      return absl::InternalError("server sent StepStats twice");
    }
    if (stats.step() != params_.step) {
      return absl::InternalError(
          absl::StrCat("server sent StepStats for step ", stats.step(),
                       " on the stream of step ", params_.step));
    }
    have_server_stats_ = true;
    stats_.chunks_replayed = stats.chunks_replayed();
    stats_.update_seconds = stats.update_seconds();
    return absl::OkStatus();
  }

  absl::Status AcceptGradStats(const v1::GradStats& stats) {
    if (!two_phase_) {
      return absl::InternalError("server sent GradStats in a one-phase step");
    }
    absl::MutexLock lock(&mu_);
    if (grad_stats_.has_value()) {
      return absl::InternalError("server sent GradStats twice");
    }
    grad_stats_ = stats;
    return absl::OkStatus();
  }

  absl::Status AcceptGradSum(const v1::GradSum& sum) {
    if (params_.sum_only_tensors == nullptr || params_.sink == nullptr) {
      return absl::InternalError(
          "server sent a GradSum in a step without sum-only tensors");
    }
    if (absl::Status s = CheckAnsweredChunk(sum.index(), "a GradSum");
        !s.ok()) {
      return s;
    }
    stats_.bytes_received += sum.sums().size();
    WeightSink::GradSum accepted{sum.sums(), StepCommit(), {}};
    if (sum.has_commit()) {
      accepted.commit.clip_coef = sum.commit().clip_coef();
      accepted.commit.skip = sum.commit().skip();
    }
    accepted.skipped_tensors.assign(sum.skipped_tensors().begin(),
                                    sum.skipped_tensors().end());
    accepted.capture_wanted = sum.capture_wanted();
    return params_.sink->AcceptGradSum(sum.index(), accepted);
  }

  // INTERNAL unless `index` is a chunk of the stream that was sent, or a
  // message follows StepStats.
  absl::Status CheckAnsweredChunk(uint64_t index, const char* what) {
    if (have_server_stats_) {
      return absl::InternalError(
          absl::StrCat("server sent ", what, " after StepStats"));
    }
    if (index < params_.first_chunk || index >= params_.end_chunk) {
      return absl::InternalError(
          absl::StrCat("server sent ", what, " of chunk ", index,
                       " outside the stream's chunks [", params_.first_chunk,
                       ", ", params_.end_chunk, ")"));
    }
    absl::MutexLock lock(&mu_);
    if (!sent_flags_[index - params_.first_chunk]) {
      return absl::InternalError(absl::StrCat(
          "server sent ", what, " of chunk ", index, " before it was sent"));
    }
    return absl::OkStatus();
  }

  // The first answer of a chunk (ack or weights) frees a place in the window.
  void NoteAnswered(uint64_t index) {
    absl::MutexLock lock(&mu_);
    if (answered_[index - params_.first_chunk]) return;
    answered_[index - params_.first_chunk] = true;
    ++answered_count_;
  }

  absl::Status AcceptAck(const v1::ChunkAck& ack) {
    if (!two_phase_) {
      return absl::InternalError("server sent a ChunkAck in a one-phase step");
    }
    const uint64_t index = ack.index();
    if (absl::Status s = CheckAnsweredChunk(index, "an ack"); !s.ok()) return s;
    if (acked_.empty()) acked_.assign(span_, false);
    if (acked_[index - params_.first_chunk]) {
      return absl::InternalError(
          absl::StrCat("server acked chunk ", index, " twice"));
    }
    acked_[index - params_.first_chunk] = true;
    NoteAnswered(index);
    return absl::OkStatus();
  }

  // Chunk `index`'s weights, `bytes` bytes, of which copy_payload(dst,
  // offset, n) writes [offset, offset + n) to dst.
  template <typename CopyPayload>
  absl::Status AcceptWeights(uint64_t index, uint64_t bytes,
                             const CopyPayload& copy_payload) {
    if (absl::Status s = CheckAnsweredChunk(index, "weights"); !s.ok()) {
      return s;
    }
    if (seen_[index - params_.first_chunk]) {
      return absl::InternalError(
          absl::StrCat("server answered chunk ", index, " twice"));
    }
    const ChunkRange range = params_.plan->chunk(index);
    const size_t weight_size = DTypeSize(params_.weight_dtype);
    const uint64_t expected = range.size() * weight_size;
    if (bytes != expected) {
      return absl::InternalError(
          absl::StrCat("server answered chunk ", index, " with ", bytes,
                       " payload bytes, expected ", expected));
    }
    if (params_.sink != nullptr) {
      if (absl::Status s = params_.sink->Accept(
              index, expected, WeightSink::CopyWeights(copy_payload));
          !s.ok()) {
        return s;
      }
    } else {
      copy_payload(
          static_cast<char*>(params_.weights_out) + range.begin * weight_size,
          0, expected);
    }
    seen_[index - params_.first_chunk] = true;
    ++stats_.chunks;
    stats_.bytes_received += expected;
    NoteAnswered(index);
    return absl::OkStatus();
  }

  const StepStreamParams& params_;
  const uint64_t chunks_;  // in the stream
  const uint64_t span_;    // end_chunk - first_chunk
  const uint64_t window_;
  const bool two_phase_;
  const std::shared_ptr<LentSlices> lent_;
  GroupContext context_;
  std::unique_ptr<RawBidiCall> stream_;

  mutable absl::Mutex mu_;
  uint64_t sent_ ABSL_GUARDED_BY(mu_) = 0;  // chunks counted by WaitForWindow
  // Per chunk of [first_chunk, end_chunk): counted by WaitForWindow.
  std::vector<bool> sent_flags_ ABSL_GUARDED_BY(mu_);
  // Per chunk of the stream: it has had an ack or its weights.
  std::vector<bool> answered_ ABSL_GUARDED_BY(mu_);
  uint64_t answered_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<v1::GradStats> grad_stats_ ABSL_GUARDED_BY(mu_);
  bool reader_done_ ABSL_GUARDED_BY(mu_) = false;

  uint64_t bytes_sent_ = 0;  // writer only

  // Reader only until it is joined.
  std::vector<bool> seen_;   // weights received, per chunk of the stream
  std::vector<bool> acked_;  // two phases: acks received, per chunk
  absl::Status protocol_error_;
  bool have_server_stats_ = false;
  StepStreamStats stats_;
};

}  // namespace

absl::Status WeightSink::AcceptGradSum(uint64_t index, const GradSum&) {
  return absl::InternalError(
      absl::StrCat("server sent a GradSum of chunk ", index,
                   " to a step whose weights have nowhere to take it"));
}

absl::StatusOr<StepStreamStats> RunStepStream(const StepChannel& channel,
                                              const StepStreamParams& params,
                                              CallGroup& group) {
  channel.AwaitSettled(params.deadline);
  auto lent = std::make_shared<LentSlices>();
  absl::StatusOr<StepStreamStats> stats;
  {
    // The call is released with the stream (its context): only then can
    // gRPC drop the slices still queued on a failed stream.
    StepCall stream(channel, params, group, lent);
    stats = stream.Run();
  }
  lent->WaitUntilReleased();
  return stats;
}

}  // namespace depot::client_internal
