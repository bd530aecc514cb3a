#include "server/depot_service.h"

#include <chrono>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "wire/wire.h"

namespace depot {
namespace {

constexpr const char* kRpcNames[kNumRpcs] = {
    "CreateJob", "InitWeights", "Step",        "PullWeights",
    "GetJob",    "DeleteJob",   "ExportState", "ImportState",
    "Checkpoint"};

void Log(const std::string& line) {
  std::fprintf(stderr, "depot-server: %s\n", line.c_str());
}

}  // namespace

DepotService::DepotService(JobStore* jobs, ServerMetrics* metrics,
                           Checkpointer* checkpointer)
    : jobs_(jobs), metrics_(metrics), checkpointer_(checkpointer) {}

grpc::Status DepotService::Serve(Rpc rpc,
                                 absl::FunctionRef<absl::Status()> body) {
  metrics_->CountRpc(rpc);
  absl::Status status =
      accepting() ? body() : absl::UnavailableError("server is shutting down");
  if (!status.ok()) RecordFailure(rpc, status);
  return ToGrpcStatus(status);
}

void DepotService::RecordFailure(Rpc rpc, const absl::Status& status) {
  metrics_->CountError(status.code());
  Log(absl::StrCat(kRpcNames[static_cast<int>(rpc)],
                   " failed: ", status.ToString()));
}

grpc::Status DepotService::CreateJob(grpc::ServerContext*,
                                     const v1::CreateJobRequest* request,
                                     v1::CreateJobResponse* response) {
  return Serve(Rpc::kCreateJob,
               [&] { return DoCreateJob(*request, response); });
}

grpc::Status DepotService::InitWeights(
    grpc::ServerContext*, grpc::ServerReader<v1::InitWeightsRequest>* reader,
    v1::InitWeightsResponse* response) {
  return Serve(Rpc::kInitWeights,
               [&] { return DoInitWeights(reader, response); });
}

grpc::Status DepotService::PullWeights(
    grpc::ServerContext*, const v1::PullRequest* request,
    grpc::ServerWriter<v1::PullResponse>* writer) {
  return Serve(Rpc::kPullWeights,
               [&] { return DoPullWeights(*request, writer); });
}

grpc::Status DepotService::GetJob(grpc::ServerContext*,
                                  const v1::GetJobRequest* request,
                                  v1::JobStatus* response) {
  return Serve(Rpc::kGetJob, [&] { return DoGetJob(*request, response); });
}

grpc::Status DepotService::DeleteJob(grpc::ServerContext*,
                                     const v1::DeleteJobRequest* request,
                                     v1::DeleteJobResponse*) {
  return Serve(Rpc::kDeleteJob, [&] { return DoDeleteJob(*request); });
}

absl::Status DepotService::DoCreateJob(const v1::CreateJobRequest& request,
                                       v1::CreateJobResponse* response) {
  absl::StatusOr<JobConfig> config = JobConfigFromProto(request.spec());
  if (!config.ok()) return config.status();
  absl::StatusOr<OpenedJob> opened =
      jobs_->CreateOrAttach(*std::move(config), request.server_index());
  if (!opened.ok()) return opened.status();
  const ShardState& shard = *opened->shard;
  const JobShape& shape = shard.shape();
  response->set_job_id(shard.job_id());
  response->set_fingerprint(shape.fingerprint());
  response->set_created(opened->created);
  response->set_shard_begin(shape.shard().begin);
  response->set_shard_end(shape.shard().end);
  response->set_first_chunk(shape.shard().first_chunk);
  response->set_end_chunk(shape.shard().end_chunk);
  response->set_state_bytes(shape.state_bytes());
  Log(absl::StrFormat("%s job %d \"%s\" (server %d of %d, %d bytes of state)",
                      opened->created ? "created" : "attached to",
                      shard.job_id(), shape.config().name, shape.server_index(),
                      shape.config().num_servers, shape.state_bytes()));
  return absl::OkStatus();
}

absl::Status DepotService::DoInitWeights(
    grpc::ServerReader<v1::InitWeightsRequest>* reader,
    v1::InitWeightsResponse* response) {
  v1::InitWeightsRequest request;
  if (!reader->Read(&request) || !request.has_header()) {
    return absl::InvalidArgumentError(
        "the first message of an InitWeights stream must be its header");
  }
  const v1::InitHeader& header = request.header();
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      jobs_->Find(header.job_id(), header.fingerprint());
  if (!shard.ok()) return shard.status();
  absl::StatusOr<DType> dtype = DTypeFromProto(header.dtype(), "dtype");
  if (!dtype.ok()) return dtype.status();
  uint64_t chunks = 0;
  while (reader->Read(&request)) {
    if (!request.has_chunk()) {
      return absl::InvalidArgumentError(
          "an InitWeights stream carries one header, then only chunks");
    }
    const v1::Chunk& chunk = request.chunk();
    if (absl::Status s =
            (*shard)->InitChunk(chunk.index(), *dtype, chunk.payload());
        !s.ok()) {
      return s;
    }
    metrics_->received_init_bytes.Increment(
        static_cast<double>(chunk.payload().size()));
    ++chunks;
  }
  response->set_chunks(chunks);
  return absl::OkStatus();
}

absl::Status DepotService::DoPullWeights(
    const v1::PullRequest& request,
    grpc::ServerWriter<v1::PullResponse>* writer) {
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      jobs_->Find(request.job_id(), request.fingerprint());
  if (!shard.ok()) return shard.status();
  absl::StatusOr<DType> dtype = DTypeFromProto(request.dtype(), "dtype");
  if (!dtype.ok()) return dtype.status();
  return (*shard)->ReadWeights(
      request.begin(), request.end(), *dtype, request.step(),
      [&](uint64_t offset, std::string payload) {
        v1::PullResponse response;
        response.set_offset(offset);
        const size_t bytes = payload.size();
        *response.mutable_payload() = std::move(payload);
        if (!writer->Write(response)) return false;
        metrics_->sent_pull_bytes.Increment(static_cast<double>(bytes));
        return true;
      });
}

absl::Status DepotService::DoGetJob(const v1::GetJobRequest& request,
                                    v1::JobStatus* response) {
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      jobs_->Find(request.job_id());
  if (!shard.ok()) return shard.status();
  const JobShape& shape = (*shard)->shape();
  response->set_job_id((*shard)->job_id());
  JobConfigToProto(shape.config(), response->mutable_spec());
  response->set_fingerprint(shape.fingerprint());
  response->set_server_index(shape.server_index());
  response->set_step((*shard)->completed_step());
  response->set_shard_begin(shape.shard().begin);
  response->set_shard_end(shape.shard().end);
  response->set_shard_params(shape.shard().size());
  response->set_total_params(shape.layout().total_elems());
  response->set_state_bytes(shape.state_bytes());
  if (request.with_checksum()) {
    response->set_state_checksum((*shard)->Checksum());
  }
  const PendingStepReport pending = (*shard)->OldestPendingStep();
  if (pending.step != 0) {
    response->set_pending_step(pending.step);
    for (uint32_t rank : pending.missing_workers) {
      response->add_missing_workers(rank);
    }
    response->set_waiting_seconds(
        std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                      pending.since)
            .count());
  }
  return absl::OkStatus();
}

absl::Status DepotService::DoDeleteJob(const v1::DeleteJobRequest& request) {
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      jobs_->Delete(request.job_id(), request.fingerprint());
  if (!shard.ok()) return shard.status();
  {
    const absl::Status aborted = absl::AbortedError(
        absl::StrCat("job ", request.job_id(), " was deleted"));
    absl::MutexLock lock(&streams_mu_);
    for (const auto& [stream, job_id] : streams_) {
      if (job_id == request.job_id()) stream->Fail(aborted);
    }
  }
  Log(absl::StrFormat("deleted job %d \"%s\"", request.job_id(),
                      (*shard)->shape().config().name));
  return absl::OkStatus();
}

grpc::Status DepotService::ExportState(
    grpc::ServerContext*, const v1::ExportStateRequest* request,
    grpc::ServerWriter<v1::StateChunk>* writer) {
  return Serve(Rpc::kExportState,
               [&] { return DoExportState(*request, writer); });
}

grpc::Status DepotService::ImportState(
    grpc::ServerContext*, grpc::ServerReader<v1::ImportStateRequest>* reader,
    v1::ImportStateResponse* response) {
  return Serve(Rpc::kImportState,
               [&] { return DoImportState(reader, response); });
}

grpc::Status DepotService::Checkpoint(grpc::ServerContext*,
                                      const v1::CheckpointRequest* request,
                                      v1::CheckpointResponse* response) {
  return Serve(Rpc::kCheckpoint,
               [&] { return DoCheckpoint(*request, response); });
}

absl::Status DepotService::DoCheckpoint(const v1::CheckpointRequest& request,
                                        v1::CheckpointResponse* response) {
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      jobs_->Find(request.job_id(), request.fingerprint());
  if (!shard.ok()) return shard.status();
  if (checkpointer_ == nullptr) {
    return absl::FailedPreconditionError(
        "this server has no --checkpoint_dir: start it with one to take "
        "checkpoints");
  }
  absl::StatusOr<uint64_t> step = checkpointer_->CheckpointNow(*shard);
  if (!step.ok()) return step.status();
  response->set_step(*step);
  return absl::OkStatus();
}

absl::Status DepotService::DoExportState(
    const v1::ExportStateRequest& request,
    grpc::ServerWriter<v1::StateChunk>* writer) {
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      jobs_->Find(request.job_id(), request.fingerprint());
  if (!shard.ok()) return shard.status();
  return (*shard)->ExportChunks([&](ChunkSnapshot snapshot) {
    v1::StateChunk message;
    message.set_index(snapshot.index);
    message.set_applied_step(snapshot.applied_step);
    message.set_optimizer_step(snapshot.optimizer_step);
    for (const uint64_t count : snapshot.tensor_steps) {
      message.add_tensor_steps(count);
    }
    *message.mutable_master() = std::move(snapshot.master);
    for (std::string& slot : snapshot.slots) {
      *message.add_slots() = std::move(slot);
    }
    return writer->Write(message);
  });
}

absl::Status DepotService::DoImportState(
    grpc::ServerReader<v1::ImportStateRequest>* reader,
    v1::ImportStateResponse* response) {
  v1::ImportStateRequest request;
  if (!reader->Read(&request) || !request.has_header()) {
    return absl::InvalidArgumentError(
        "the first message of an ImportState stream must be its header");
  }
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      jobs_->Find(request.header().job_id(), request.header().fingerprint());
  if (!shard.ok()) return shard.status();
  // Staged whole: ImportChunks checks everything before it replaces anything.
  std::vector<ChunkSnapshot> chunks;
  while (reader->Read(&request)) {
    if (!request.has_chunk()) {
      return absl::InvalidArgumentError(
          "an ImportState stream carries one header, then only chunks");
    }
    v1::StateChunk* chunk = request.mutable_chunk();
    ChunkSnapshot& snapshot = chunks.emplace_back();
    snapshot.index = chunk->index();
    snapshot.applied_step = chunk->applied_step();
    snapshot.optimizer_step = chunk->optimizer_step();
    snapshot.tensor_steps.assign(chunk->tensor_steps().begin(),
                                 chunk->tensor_steps().end());
    snapshot.master = std::move(*chunk->mutable_master());
    for (std::string& slot : *chunk->mutable_slots()) {
      snapshot.slots.push_back(std::move(slot));
    }
  }
  if (absl::Status s = (*shard)->ImportChunks(std::move(chunks)); !s.ok()) {
    return s;
  }
  jobs_->NoteStateReplaced(*shard);
  response->set_chunks((*shard)->shape().shard().num_chunks());
  return absl::OkStatus();
}

void DepotService::TrackStepStream(StepStream* stream, uint64_t job_id) {
  absl::MutexLock lock(&streams_mu_);
  if (streams_.insert_or_assign(stream, job_id).second) {
    metrics_->active_streams.Increment();
  }
}

void DepotService::UntrackStepStream(StepStream* stream) {
  absl::MutexLock lock(&streams_mu_);
  if (streams_.erase(stream) > 0) metrics_->active_streams.Decrement();
}

bool DepotService::NoStepStreams() const { return streams_.empty(); }

void DepotService::StopAcceptingRpcs() {
  accepting_.store(false, std::memory_order_release);
}

bool DepotService::WaitForStepStreams(absl::Time deadline) {
  absl::MutexLock lock(&streams_mu_);
  return streams_mu_.AwaitWithDeadline(
      absl::Condition(this, &DepotService::NoStepStreams), deadline);
}

void DepotService::FailStepStreams(const absl::Status& status) {
  absl::MutexLock lock(&streams_mu_);
  for (const auto& [stream, job_id] : streams_) stream->Fail(status);
}

}  // namespace depot
