// DepotService::StepReactor: one Step stream on gRPC's callback API. It reads
// the header, the gradient chunks and (two phases) the commit, and hands them
// to the job's ShardState; the sending side (weights, stats, the final status)
// is the StepStream's, for which the reactor is the transport.
//
// The method is raw (grpc::ByteBuffer both ways): a chunk's payload is copied
// once, from the received slices straight into the buffer the shard keeps
// (wire/step_codec.h), instead of into a protobuf `bytes` and out again.
// Other messages go through protobuf.
//
// Once its header is read, a stream reserves one message (the job's largest,
// ShardState::StepReceiveBytes) in the server's memory budget until it stops
// reading: a read is pending on it all that time, and gRPC lets a pending
// read's whole message in ahead of the reader. So what gRPC holds for the
// Step streams is charged to the budget like the payloads they deliver, and a
// stream the budget has no room for is refused before it is read further
// (docs/protocol.md, "Bounds and memory").
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "depot/v1/depot.pb.h"
#include "grpcpp/support/server_callback.h"
#include "server/depot_service.h"
#include "server/node_sender.h"
#include "server/shard_state.h"
#include "server/step_numerics.h"
#include "server/step_stream.h"
#include "wire/byte_buffers.h"
#include "wire/step_codec.h"
#include "wire/wire.h"

namespace depot {
namespace {

CommitDecision CommitFromProto(const v1::StepCommit& commit) {
  return CommitDecision{commit.clip_coef(), commit.skip()};
}

}  // namespace

class DepotService::StepReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      public StepTransport {
 public:
  StepReactor(DepotService* service, grpc::CallbackServerContext* context)
      : service_(service),
        context_(context),
        stream_(std::make_shared<StepStream>(this, service->metrics_)),
        budget_(service->jobs_->budget()) {
    service_->metrics_->CountRpc(Rpc::kStep);
    service_->TrackStepStream(stream_, /*job_id=*/0);
    if (!service_->accepting()) {
      stream_->Fail(absl::UnavailableError(kShuttingDown));
      return;
    }
    // Before a single message is read: an unauthenticated stream changes
    // nothing.
    absl::StatusOr<std::string> tenant = service_->TenantOf(*context);
    if (!tenant.ok()) {
      stream_->Fail(tenant.status());
      return;
    }
    caller_.tenant = *std::move(tenant);
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // No read follows.
      ReleaseReceive();
      // The worker half-closed (or the RPC is over, and this changes nothing).
      if (shard_ == nullptr) {
        stream_->Fail(absl::InvalidArgumentError(
            "the first message of a Step stream must be its header"));
      } else if (numerics_.two_phase && !committed_ &&
                 !context_->IsCancelled()) {
        // (A cancelled stream ends with CANCELLED from OnCancel instead.)
        stream_->Fail(absl::FailedPreconditionError(absl::StrCat(
            "the two-phase Step stream of step ", header_.step(),
            " half-closed without its commit: send a StepCommit after the "
            "server's GradStats")));
      } else {
        stream_->ReadsDone();
      }
      return;
    }
    if (stream_->ended()) return;
    absl::Status status = AcceptRequestCatching();
    // The slices go back to gRPC before the next read.
    received_.Clear();
    request_.Clear();
    if (!status.ok()) {
      stream_->Fail(std::move(status));
      return;
    }
    // Out of credits: the stream resumes the reads (ResumeReading) once an
    // answer makes room; meanwhile HTTP/2 flow control holds the client.
    if (stream_->MayRead()) StartRead(&request_);
  }

  void OnWriteDone(bool ok) override { stream_->OnWriteDone(ok); }

  void OnCancel() override {
    stream_->Fail(absl::CancelledError("the client cancelled the Step stream"));
  }

  void OnDone() override {
    ReleaseReceive();
    service_->UntrackStepStream(stream_.get());
    stream_->Detach();
    delete this;
  }

  // StepTransport. After a finishing call the reactor may be deleted at any
  // moment (OnDone), so none touches a member after calling into gRPC.
  void StartWriting(const grpc::ByteBuffer* response) override {
    StartWrite(response);
  }
  void WriteLastAndFinish(const grpc::ByteBuffer* response) override {
    // Before gRPC can send the status: a client that sees it may count on
    // the budget being free.
    ReleaseReceive();
    StartWriteAndFinish(response, grpc::WriteOptions(), grpc::Status::OK);
  }
  void ResumeReading() override { StartRead(&request_); }
  void FinishWithError(const absl::Status& status) override {
    ReleaseReceive();
    service_->RecordFailure(Rpc::kStep, status);
    Finish(ToGrpcStatus(status));
  }

 private:
  // The message in request_: a chunk parsed by hand, anything else (or a
  // chunk in an encoding the codec leaves to protobuf) by protobuf.
  absl::Status AcceptRequest() {
    if (absl::Status s = received_.Load(request_); !s.ok()) return s;
    const wire::MessagePieces pieces = received_.pieces();
    wire::ChunkFields chunk;
    absl::StatusOr<wire::MessageKind> kind =
        wire::ParseChunkMessage(pieces, wire::StepMessage::kRequest, &chunk);
    if (!kind.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Step request: ", kind.status().message()));
    }
    if (*kind == wire::MessageKind::kChunk) {
      if (shard_ == nullptr) return HeaderMissing();
      return AcceptChunk(chunk.index, chunk.payload_size, [&](char* out) {
        wire::CopyMessageBytes(pieces, chunk.payload_offset, chunk.payload_size,
                               out);
      });
    }
    v1::StepRequest request;
    if (absl::Status s =
            wire::ParseFromPieces(pieces, "Step request", &request);
        !s.ok()) {
      return s;
    }
    if (shard_ == nullptr) return AcceptHeader(request);
    if (request.has_commit()) return AcceptCommit(request.commit());
    if (request.has_weights_override()) {
      return AcceptOverride(*request.mutable_weights_override());
    }
    if (!request.has_chunk()) {
      return absl::InvalidArgumentError(
          "a Step stream carries one header, then only chunks and weights "
          "overrides (and, in a two-phase step, one commit)");
    }
    const std::string& payload = request.chunk().payload();
    return AcceptChunk(request.chunk().index(), payload.size(),
                       [&](char* out) { payload.copy(out, payload.size()); });
  }

  // AcceptRequest, with an exception (an allocation that failed, e.g. for
  // a job's per-worker bookkeeping) turned into a status. Nothing may throw
  // out of a reactor's callback: gRPC would never see the operation end,
  // the reactor would never be done, and the server's shutdown would wait
  // for it forever.
  absl::Status AcceptRequestCatching() {
    try {
      return AcceptRequest();
    } catch (const std::exception& e) {
      return ExceptionStatus(e);
    }
  }

  static absl::Status HeaderMissing() {
    return absl::InvalidArgumentError(
        "the first message of a Step stream must be its header");
  }

  absl::Status AcceptHeader(const v1::StepRequest& request) {
    if (!request.has_header()) return HeaderMissing();
    header_ = request.header();
    absl::StatusOr<std::shared_ptr<ShardState>> shard =
        service_->FindOwned(caller_, header_.job_id(), header_.fingerprint());
    if (!shard.ok()) return shard.status();
    if (header_.two_phase() && header_.has_commit()) {
      return absl::InvalidArgumentError(
          "a Step header sets two_phase or carries a commit, not both: the "
          "commit of a two-phase step comes after the server's GradStats");
    }
    numerics_.loss_scale =
        header_.has_loss_scale() ? header_.loss_scale() : 1.0;
    numerics_.two_phase = header_.two_phase();
    if (header_.has_commit())
      numerics_.commit = CommitFromProto(header_.commit());
    if (absl::Status s = ReserveReceive(**shard); !s.ok()) return s;
    absl::StatusOr<NodeSender> sender = NodeSender::FromHeader(
        (*shard)->shape().plan(), header_.local_ranks(), header_.local_rank(),
        header_.bucket_chunks());
    if (!sender.ok()) return sender.status();
    if (absl::Status s = (*shard)->BeginStep(
            header_.step(), header_.worker_rank(),
            GroupHyperParamsFromProto(header_), numerics_, stream_,
            header_.no_grad_tensors(), sender->shape(),
            SumOnlyTensors(header_.sum_only_tensors(), header_.omit_sums(),
                           header_.fills_captures()));
        !s.ok()) {
      return s;
    }
    sender_ = *std::move(sender);
    shard_ = *std::move(shard);
    stream_->set_step(header_.step());
    // --checkpoint_max_lag_steps: the stream's end may wait for a checkpoint
    // to be durable. The gate holds the stream weakly: an RPC that ends
    // meanwhile is not kept.
    std::weak_ptr<StepStream> weak_stream = stream_;
    stream_->set_finish_gate([shard = shard_, weak_stream](uint64_t step) {
      return shard->MayFinishStep(step, [weak_stream] {
        if (std::shared_ptr<StepStream> stream = weak_stream.lock()) {
          stream->FinishGateOpened();
        }
      });
    });
    service_->TrackStepStream(stream_, header_.job_id());
    return absl::OkStatus();
  }

  // Reserves the message gRPC may receive ahead of this stream's reader (the
  // file comment) until ReleaseReceive; RESOURCE_EXHAUSTED when the budget
  // has no room for it.
  absl::Status ReserveReceive(const ShardState& shard) {
    const uint64_t bytes = shard.StepReceiveBytes();
    if (!budget_->TryReserve(bytes)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "Step stream of worker ", header_.worker_rank(), " for step ",
          header_.step(), ": the server's memory budget (", budget_->limit(),
          " bytes, ", budget_->used(),
          " in use by jobs, the payloads of steps in flight and the open Step "
          "streams) has no room for the ",
          bytes,
          " bytes of one chunk message that the stream may receive ahead of "
          "its reader; send it again once other steps' streams have ended"));
    }
    // Added after the stream finished on another thread (a failure while
    // the header was read), it is given back by OnDone.
    reserved_.fetch_add(bytes, std::memory_order_relaxed);
    service_->metrics_->step_receive_reserved_bytes.Increment(
        static_cast<double>(bytes));
    return absl::OkStatus();
  }
  // Gives the reservation back, once: called from the reader and from
  // whichever thread finishes the stream.
  void ReleaseReceive() {
    const uint64_t bytes = reserved_.exchange(0, std::memory_order_relaxed);
    if (bytes == 0) return;
    budget_->Release(bytes);
    service_->metrics_->step_receive_reserved_bytes.Decrement(
        static_cast<double>(bytes));
  }

  // A buffer of `bytes` bytes for a received gradient payload, from the
  // shard's pool, so that steady steps allocate nothing.
  std::string TakePayloadBuffer(size_t bytes) {
    return shard_->payload_pool().Take(bytes);
  }

  // Chunk `index` with a payload of `bytes` bytes that copy_payload writes to
  // the pointer it is given.
  template <typename CopyPayload>
  absl::Status AcceptChunk(uint64_t index, size_t bytes,
                           const CopyPayload& copy_payload) {
    if (committed_) {
      return absl::InvalidArgumentError(
          "a chunk after the commit: a two-phase step sends all its chunks "
          "before its StepCommit");
    }
    // The chunk's range and the payload's size are checked before the payload
    // is copied into a buffer of the pool (a rejected chunk copies nothing).
    if (absl::Status s = shard_->CheckGradientPayload(index, bytes); !s.ok()) {
      return s;
    }
    Contribution contribution;
    contribution.step = header_.step();
    contribution.worker_rank = header_.worker_rank();
    contribution.chunk_index = index;
    contribution.payload = TakePayloadBuffer(bytes);
    copy_payload(contribution.payload.data());
    contribution.sink = stream_;
    contribution.sender = sender_;
    if (absl::Status s = shard_->Contribute(std::move(contribution)); !s.ok()) {
      return s;
    }
    stream_->ExpectChunk();
    service_->metrics_->received_step_bytes.Increment(
        static_cast<double>(bytes));
    return absl::OkStatus();
  }

  absl::Status AcceptOverride(v1::WeightsOverride& proto) {
    if (committed_) {
      return absl::InvalidArgumentError(
          "a weights override after the commit: overrides come before the "
          "chunk they change");
    }
    return shard_->OverrideWeights(
        header_.step(), header_.worker_rank(), proto.chunk_index(),
        WeightsPiece{proto.offset(), std::move(*proto.mutable_payload())},
        sender_);
  }

  absl::Status AcceptCommit(const v1::StepCommit& proto) {
    if (!numerics_.two_phase) {
      return absl::InvalidArgumentError(
          "a StepCommit on a one-phase Step stream: only a header with "
          "two_phase set is followed by a commit");
    }
    if (committed_) {
      return absl::InvalidArgumentError(
          "a second StepCommit on one Step stream: each worker commits once");
    }
    const CommitDecision commit = CommitFromProto(proto);
    if (absl::Status s = ValidateCommitDecision(commit); !s.ok()) return s;
    if (absl::Status s = shard_->Commit(header_.step(), commit); !s.ok()) {
      return s;
    }
    committed_ = true;
    return absl::OkStatus();
  }

  DepotService* const service_;
  grpc::CallbackServerContext* const context_;
  // The stream's tenant (the peer is not audited: steps are not).
  Caller caller_;
  const std::shared_ptr<StepStream> stream_;
  // Reads are sequential (the next starts after OnReadDone), so these need no
  // lock.
  grpc::ByteBuffer request_;
  wire::ReceivedMessage received_;
  v1::StepHeader header_;
  StepNumerics numerics_;
  // Which local rank of a node worker the header says this stream is from.
  NodeSender sender_;
  bool committed_ = false;
  std::shared_ptr<ShardState> shard_;
  // The server's memory budget, and what this stream holds of it
  // (ReserveReceive).
  const std::shared_ptr<MemoryBudget> budget_;
  std::atomic<uint64_t> reserved_{0};
};

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* DepotService::Step(
    grpc::CallbackServerContext* context) {
  return new StepReactor(this, context);
}

}  // namespace depot
