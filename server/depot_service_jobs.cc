// DepotService's methods on one job's life and state (docs/protocol.md):
// CreateJob, InitWeights, PullWeights, GetJob, DeleteJob, ExportState and
// ImportState. The dispatch, authentication and bookkeeping around them are in
// depot_service.cc.
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/depot_service.h"
#include "wire/wire.h"

namespace depot {

grpc::Status DepotService::CreateJob(grpc::ServerContextBase* context,
                                     const v1::CreateJobRequest* request,
                                     v1::CreateJobResponse* response) {
  return Serve(Rpc::kCreateJob, *context, [&](Caller& caller) {
    return DoCreateJob(caller, *request, response);
  });
}

grpc::Status DepotService::InitWeights(
    grpc::ServerContextBase* context,
    RequestReader<v1::InitWeightsRequest>* reader,
    v1::InitWeightsResponse* response) {
  return Serve(Rpc::kInitWeights, *context, [&](Caller& caller) {
    return DoInitWeights(caller, reader, response);
  });
}

grpc::Status DepotService::PullWeights(
    grpc::ServerContextBase* context, const v1::PullRequest* request,
    ResponseWriter<v1::PullResponse>* writer) {
  return Serve(Rpc::kPullWeights, *context, [&](Caller& caller) {
    return DoPullWeights(caller, *request, writer);
  });
}

grpc::Status DepotService::GetJob(grpc::ServerContextBase* context,
                                  const v1::GetJobRequest* request,
                                  v1::JobStatus* response) {
  return Serve(Rpc::kGetJob, *context, [&](Caller& caller) {
    return DoGetJob(caller, *request, response);
  });
}

grpc::Status DepotService::DeleteJob(grpc::ServerContextBase* context,
                                     const v1::DeleteJobRequest* request,
                                     v1::DeleteJobResponse*) {
  return Serve(Rpc::kDeleteJob, *context,
               [&](Caller& caller) { return DoDeleteJob(caller, *request); });
}

absl::Status DepotService::DoCreateJob(Caller& caller,
                                       const v1::CreateJobRequest& request,
                                       v1::CreateJobResponse* response) {
  absl::StatusOr<JobConfig> config = JobConfigFromProto(request.spec());
  if (!config.ok()) return config.status();
  if (draining()) {
    // A drained server takes no new job; the jobs it holds go on.
    const JobKey key{caller.tenant, config->name};
    bool held = false;
    for (const std::shared_ptr<ShardState>& shard : jobs_->Jobs()) {
      held = held || shard->shape().key() == key;
    }
    if (!held) {
      return absl::UnavailableError(
          "this server is drained (depotctl drain) and takes no new job: "
          "create the job on other servers, or resume this one with "
          "`depotctl drain --resume`");
    }
  }
  absl::StatusOr<OpenedJob> opened = jobs_->CreateOrAttach(
      *std::move(config), request.server_index(), caller.tenant);
  if (!opened.ok()) return opened.status();
  const ShardState& shard = *opened->shard;
  NoteJob(&caller.job, shard);
  const JobShape& shape = shard.shape();
  response->set_job_id(shard.job_id());
  response->set_fingerprint(shape.fingerprint());
  response->set_created(opened->created);
  response->set_shard_begin(shape.shard().begin);
  response->set_shard_end(shape.shard().end);
  response->set_first_chunk(shape.shard().first_chunk);
  response->set_end_chunk(shape.shard().end_chunk);
  response->set_state_bytes(shape.state_bytes());
  Log(absl::StrFormat("%s %s (server %d of %d, %d bytes of state)",
                      opened->created ? "created" : "attached to",
                      Describe(shape.key(), shard.job_id()),
                      shape.server_index(), shape.config().num_servers,
                      shape.state_bytes()));
  return absl::OkStatus();
}

absl::Status DepotService::DoInitWeights(
    Caller& caller, RequestReader<v1::InitWeightsRequest>* reader,
    v1::InitWeightsResponse* response) {
  v1::InitWeightsRequest request;
  if (!reader->Read(&request)) {
    if (!reader->status().ok()) return reader->status();
  }
  if (!request.has_header()) {
    return absl::InvalidArgumentError(
        "the first message of an InitWeights stream must be its header");
  }
  const v1::InitHeader& header = request.header();
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      FindOwned(caller, header.job_id(), header.fingerprint());
  if (!shard.ok()) return shard.status();
  absl::StatusOr<DType> dtype = DTypeFromProto(header.dtype(), "dtype");
  if (!dtype.ok()) return dtype.status();
  uint64_t chunks = 0;
  while (reader->Read(&request)) {
    if (ended()) return absl::UnavailableError(kShuttingDown);
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
  // A malformed message ends the reads: the stream fails with it (the chunks
  // before it stay written), it is never taken for the stream's end.
  if (!reader->status().ok()) return reader->status();
  response->set_chunks(chunks);
  return absl::OkStatus();
}

absl::Status DepotService::DoPullWeights(
    Caller& caller, const v1::PullRequest& request,
    ResponseWriter<v1::PullResponse>* writer) {
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      FindOwned(caller, request.job_id(), request.fingerprint());
  if (!shard.ok()) return shard.status();
  absl::StatusOr<DType> dtype = DTypeFromProto(request.dtype(), "dtype");
  if (!dtype.ok()) return dtype.status();
  absl::Status status = (*shard)->ReadWeights(
      request.begin(), request.end(), *dtype, request.step(),
      [&](uint64_t offset, std::string payload) {
        if (ended()) return false;
        v1::PullResponse response;
        response.set_offset(offset);
        const size_t bytes = payload.size();
        *response.mutable_payload() = std::move(payload);
        if (!writer->Write(response)) return false;
        metrics_->sent_pull_bytes.Increment(static_cast<double>(bytes));
        return true;
      });
  return ended() && !status.ok() ? absl::UnavailableError(kShuttingDown)
                                 : status;
}

absl::Status DepotService::DoGetJob(Caller& caller,
                                    const v1::GetJobRequest& request,
                                    v1::JobStatus* response) {
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      FindOwned(caller, request.job_id());
  if (!shard.ok()) return shard.status();
  const JobShape& shape = (*shard)->shape();
  response->set_job_id((*shard)->job_id());
  JobConfigToProto(shape.config(), response->mutable_spec());
  response->set_fingerprint(shape.fingerprint());
  response->set_server_index(shape.server_index());
  response->set_step((*shard)->completed_step());
  response->set_newest_step((*shard)->newest_step());
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

absl::Status DepotService::DoDeleteJob(Caller& caller,
                                       const v1::DeleteJobRequest& request) {
  // Ownership and fingerprint first: Delete itself cannot be undone.
  if (absl::StatusOr<std::shared_ptr<ShardState>> found =
          FindOwned(caller, request.job_id(), request.fingerprint());
      !found.ok()) {
    return found.status();
  }
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      jobs_->Delete(request.job_id(), request.fingerprint());
  if (!shard.ok()) return shard.status();
  FailStreamsOf(request.job_id(),
                absl::AbortedError(
                    absl::StrCat("job ", request.job_id(), " was deleted")));
  Log(absl::StrCat("deleted ",
                   Describe((*shard)->shape().key(), request.job_id())));
  return absl::OkStatus();
}

grpc::Status DepotService::ExportState(grpc::ServerContextBase* context,
                                       const v1::ExportStateRequest* request,
                                       ResponseWriter<v1::StateChunk>* writer) {
  return Serve(Rpc::kExportState, *context, [&](Caller& caller) {
    return DoExportState(caller, *request, writer);
  });
}

grpc::Status DepotService::ImportState(
    grpc::ServerContextBase* context,
    RequestReader<v1::ImportStateRequest>* reader,
    v1::ImportStateResponse* response) {
  return Serve(Rpc::kImportState, *context, [&](Caller& caller) {
    return DoImportState(caller, reader, response);
  });
}

absl::Status DepotService::DoExportState(
    Caller& caller, const v1::ExportStateRequest& request,
    ResponseWriter<v1::StateChunk>* writer) {
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      FindOwned(caller, request.job_id(), request.fingerprint());
  if (!shard.ok()) return shard.status();
  const std::vector<uint64_t> only(request.chunks().begin(),
                                   request.chunks().end());
  absl::Status status =
      (*shard)->ExportChunks(only, [&](ChunkSnapshot snapshot) {
        if (ended()) return false;
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
        message.set_lacks_worker_state(snapshot.lacks_worker_state);
        return writer->Write(message);
      });
  return ended() && !status.ok() ? absl::UnavailableError(kShuttingDown)
                                 : status;
}

absl::Status DepotService::DoImportState(
    Caller& caller, RequestReader<v1::ImportStateRequest>* reader,
    v1::ImportStateResponse* response) {
  v1::ImportStateRequest request;
  if (!reader->Read(&request) && !reader->status().ok()) {
    return reader->status();
  }
  if (!request.has_header()) {
    return absl::InvalidArgumentError(
        "the first message of an ImportState stream must be its header");
  }
  absl::StatusOr<std::shared_ptr<ShardState>> shard = FindOwned(
      caller, request.header().job_id(), request.header().fingerprint());
  if (!shard.ok()) return shard.status();
  const bool patch = request.header().patch();
  const uint64_t capture_step = request.header().capture_step();
  if (capture_step != 0 && !patch) {
    return absl::InvalidArgumentError(
        "capture_step needs patch: only a part of a capture is sent");
  }
  // Staged whole: ImportChunks (PatchChunks) checks everything before it
  // replaces anything.
  // The staged chunks are charged to the memory budget while they are held:
  // a client that sends more than it holds is refused.
  std::vector<ChunkSnapshot> chunks;
  ScopedReservation staged(jobs_->budget().get());
  while (reader->Read(&request)) {
    if (ended()) return absl::UnavailableError(kShuttingDown);
    if (!request.has_chunk()) {
      return absl::InvalidArgumentError(
          "an ImportState stream carries one header, then only chunks");
    }
    v1::StateChunk* chunk = request.mutable_chunk();
    if (!staged.TryAdd(chunk->ByteSizeLong())) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "ImportState: the server's memory budget (", jobs_->budget()->limit(),
          " bytes, ", jobs_->budget()->used(),
          " in use) has no room to stage chunk ", chunk->index(), " (",
          chunk->ByteSizeLong(), " bytes) after ", chunks.size(),
          " chunks staged (", staged.bytes(), " bytes)"));
    }
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
    snapshot.lacks_worker_state = chunk->lacks_worker_state();
  }
  if (!reader->status().ok()) return reader->status();
  if (patch) {
    // The same history: the job's checkpoints stay.
    const uint64_t patched = chunks.size();
    if (absl::Status s =
            capture_step != 0
                ? (*shard)->PatchCapture(capture_step, std::move(chunks))
                : (*shard)->PatchChunks(std::move(chunks));
        !s.ok()) {
      return s;
    }
    response->set_chunks(patched);
    return absl::OkStatus();
  }
  if (absl::Status s = (*shard)->ImportChunks(std::move(chunks)); !s.ok()) {
    return s;
  }
  jobs_->NoteStateReplaced(*shard);
  response->set_chunks((*shard)->shape().shard().num_chunks());
  return absl::OkStatus();
}

}  // namespace depot
