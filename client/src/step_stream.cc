#include "step_stream.h"

#include <cstring>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/sync_stream.h"
#include "wire/wire.h"

namespace depot::client_internal {
namespace {

using Stream = grpc::ClientReaderWriter<v1::StepRequest, v1::StepResponse>;

class StepStream {
 public:
  StepStream(v1::Depot::Stub& stub, const StepStreamParams& params,
             CallGroup& group)
      : params_(params),
        shard_(params.plan->shard(params.server)),
        window_(static_cast<uint64_t>(params.max_inflight_chunks)),
        context_(group, params.deadline),
        stream_(stub.Step(context_.get())) {
    seen_.assign(shard_.num_chunks(), false);
  }

  absl::StatusOr<StepStreamStats> Run() {
    std::thread reader([this] { ReadAnswers(); });
    SendGradients();
    reader.join();
    const grpc::Status finish = stream_->Finish();
    // After the reader has stopped, its fields are ours to read.
    if (!protocol_error_.ok()) return protocol_error_;
    if (!finish.ok()) return FromGrpcStatus(finish);
    if (stats_.chunks != shard_.num_chunks()) {
      return absl::InternalError(absl::StrCat(
          "step ", params_.step, " stream ended after ", stats_.chunks, " of ",
          shard_.num_chunks(), " chunks were answered"));
    }
    if (!have_server_stats_) {
      return absl::InternalError(absl::StrCat(
          "step ", params_.step, " stream ended without StepStats"));
    }
    stats_.bytes_sent = bytes_sent_;
    return stats_;
  }

 private:
  // The writer: runs on the caller's thread.
  void SendGradients() {
    const size_t grad_size = DTypeSize(params_.grad_dtype);
    v1::StepRequest request;
    v1::StepHeader* header = request.mutable_header();
    header->set_job_id(params_.job_id);
    header->set_fingerprint(params_.fingerprint);
    header->set_step(params_.step);
    header->set_worker_rank(params_.worker_rank);
    if (params_.group_hparams != nullptr) {
      GroupHyperParamsToProto(*params_.group_hparams, header);
    }
    if (!stream_->Write(request)) return;  // Finish() tells why.

    const char* grads = static_cast<const char*>(params_.grads);
    for (uint64_t index = shard_.first_chunk; index < shard_.end_chunk;
         ++index) {
      if (!WaitForWindow()) return;
      const ChunkRange chunk = params_.plan->chunk(index);
      v1::Chunk* message = request.mutable_chunk();  // reuses its buffer
      message->set_index(index);
      message->mutable_payload()->assign(grads + chunk.begin * grad_size,
                                         chunk.size() * grad_size);
      if (!stream_->Write(request)) return;
      bytes_sent_ += message->payload().size();
    }
    stream_->WritesDone();
  }

  // Blocks until one more chunk may be sent, and counts it as sent (before the
  // Write, so that its answer is never seen as unsolicited). False once the
  // reader has stopped: the stream is over and nothing more is worth sending.
  bool WaitForWindow() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &StepStream::MaySendOrStop));
    if (reader_done_) return false;
    ++sent_;
    return true;
  }

  bool MaySendOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return reader_done_ || sent_ - answered_ < window_;
  }

  // The reader: runs on its own thread until the stream ends or breaks
  // protocol.
  void ReadAnswers() {
    v1::StepResponse response;
    while (stream_->Read(&response)) {
      absl::Status status = Accept(response);
      if (!status.ok()) {
        protocol_error_ = std::move(status);
        context_.get()->TryCancel();
        break;
      }
    }
    absl::MutexLock lock(&mu_);
    reader_done_ = true;
  }

  absl::Status Accept(const v1::StepResponse& response) {
    if (response.has_stats()) {
      if (have_server_stats_) {
        return absl::InternalError("server sent StepStats twice");
      }
      if (response.stats().step() != params_.step) {
        return absl::InternalError(absl::StrCat(
            "server sent StepStats for step ", response.stats().step(),
            " on the stream of step ", params_.step));
      }
      have_server_stats_ = true;
      stats_.chunks_replayed = response.stats().chunks_replayed();
      stats_.update_seconds = response.stats().update_seconds();
      return absl::OkStatus();
    }
    if (!response.has_chunk()) {
      return absl::InternalError("server sent an empty StepResponse");
    }
    if (have_server_stats_) {
      return absl::InternalError("server sent a chunk after StepStats");
    }
    const v1::Chunk& chunk = response.chunk();
    const uint64_t index = chunk.index();
    if (index < shard_.first_chunk || index >= shard_.end_chunk) {
      return absl::InternalError(absl::StrCat(
          "server answered chunk ", index, " outside its shard's chunks [",
          shard_.first_chunk, ", ", shard_.end_chunk, ")"));
    }
    if (seen_[index - shard_.first_chunk]) {
      return absl::InternalError(
          absl::StrCat("server answered chunk ", index, " twice"));
    }
    {
      absl::MutexLock lock(&mu_);
      if (index >= shard_.first_chunk + sent_) {
        return absl::InternalError(absl::StrCat("server answered chunk ", index,
                                                " before it was sent"));
      }
    }
    const ChunkRange range = params_.plan->chunk(index);
    const size_t weight_size = DTypeSize(params_.weight_dtype);
    const uint64_t expected = range.size() * weight_size;
    if (chunk.payload().size() != expected) {
      return absl::InternalError(absl::StrCat(
          "server answered chunk ", index, " with ", chunk.payload().size(),
          " payload bytes, expected ", expected));
    }
    std::memcpy(
        static_cast<char*>(params_.weights_out) + range.begin * weight_size,
        chunk.payload().data(), expected);
    seen_[index - shard_.first_chunk] = true;
    ++stats_.chunks;
    stats_.bytes_received += expected;
    absl::MutexLock lock(&mu_);
    ++answered_;
    return absl::OkStatus();
  }

  const StepStreamParams& params_;
  const ShardRange& shard_;
  const uint64_t window_;
  GroupContext context_;
  std::unique_ptr<Stream> stream_;

  mutable absl::Mutex mu_;
  uint64_t sent_ ABSL_GUARDED_BY(mu_) = 0;  // chunks counted by WaitForWindow
  uint64_t answered_ ABSL_GUARDED_BY(mu_) = 0;
  bool reader_done_ ABSL_GUARDED_BY(mu_) = false;

  uint64_t bytes_sent_ = 0;  // writer only

  // Reader only until it is joined.
  std::vector<bool> seen_;
  absl::Status protocol_error_;
  bool have_server_stats_ = false;
  StepStreamStats stats_;
};

}  // namespace

absl::StatusOr<StepStreamStats> RunStepStream(v1::Depot::Stub& stub,
                                              const StepStreamParams& params,
                                              CallGroup& group) {
  StepStream stream(stub, params, group);
  return stream.Run();
}

}  // namespace depot::client_internal
