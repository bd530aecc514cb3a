// DepotService's checkpoint methods (docs/checkpoints.md): Checkpoint,
// ListCheckpoints, RollBack and ImportCheckpoint. ListCheckpoints'
// verification is in depot_service_admin.cc.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/checkpoint_import.h"
#include "server/depot_service.h"
#include "wire/wire.h"

namespace depot {

grpc::Status DepotService::Checkpoint(grpc::ServerContextBase* context,
                                      const v1::CheckpointRequest* request,
                                      v1::CheckpointResponse* response) {
  return Serve(Rpc::kCheckpoint, *context, [&](Caller& caller) {
    return DoCheckpoint(caller, *request, response);
  });
}

absl::Status DepotService::DoCheckpoint(Caller& caller,
                                        const v1::CheckpointRequest& request,
                                        v1::CheckpointResponse* response) {
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      FindOwned(caller, request.job_id(), request.fingerprint());
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

grpc::Status DepotService::ListCheckpoints(
    grpc::ServerContextBase* context, const v1::ListCheckpointsRequest* request,
    v1::ListCheckpointsResponse* response) {
  return Serve(Rpc::kListCheckpoints, *context, [&](Caller& caller) {
    return DoListCheckpoints(caller, *request, response);
  });
}

absl::Status DepotService::DoListCheckpoints(
    Caller& caller, const v1::ListCheckpointsRequest& request,
    v1::ListCheckpointsResponse* response) {
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      FindOwned(caller, request.job_id(), request.fingerprint());
  if (!shard.ok()) return shard.status();
  response->set_step((*shard)->completed_step());
  response->set_newest_step((*shard)->newest_step());
  // Without a --checkpoint_dir there are none: the list is empty.
  if (checkpointer_ == nullptr) return absl::OkStatus();
  absl::StatusOr<Checkpointer::Steps> steps =
      checkpointer_->ListSteps((*shard)->shape().key());
  if (!steps.ok()) return steps.status();
  for (const uint64_t step : steps->complete) response->add_steps(step);
  // Ascending, as the field says.
  for (auto it = steps->lacking_worker_state.rbegin();
       it != steps->lacking_worker_state.rend(); ++it) {
    response->add_steps_lacking_worker_state(*it);
  }
  if (request.verify()) {
    return VerifyCheckpoints(**shard, steps->complete, response);
  }
  return absl::OkStatus();
}

grpc::Status DepotService::RollBack(grpc::ServerContextBase* context,
                                    const v1::RollBackRequest* request,
                                    v1::RollBackResponse* response) {
  return Serve(Rpc::kRollBack, *context, [&](Caller& caller) {
    return DoRollBack(caller, *request, response);
  });
}

absl::Status DepotService::DoRollBack(Caller& caller,
                                      const v1::RollBackRequest& request,
                                      v1::RollBackResponse* response) {
  absl::StatusOr<std::shared_ptr<ShardState>> found =
      FindOwned(caller, request.job_id(), request.fingerprint());
  if (!found.ok()) return found.status();
  ShardState& shard = **found;
  const JobKey key = shard.shape().key();
  const uint64_t step = request.step();
  // Checked before anything changes: a step the shard has not reached, or
  // one it has left without a checkpoint to go back to.
  const uint64_t completed = shard.completed_step();
  if (step > completed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot roll job ", request.job_id(), " back to step ", step,
        ": this server has completed only step ", completed));
  }
  const bool at_step = step == completed && shard.newest_step() == step;
  if (!at_step) {
    if (checkpointer_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot roll job ", request.job_id(), " back to step ", step,
          ": it is at step ", completed,
          " and this server has no --checkpoint_dir to restore from"));
    }
    absl::StatusOr<std::vector<uint64_t>> steps =
        checkpointer_->CompleteSteps(key);
    if (!steps.ok()) return steps.status();
    if (std::find(steps->begin(), steps->end(), step) == steps->end()) {
      return absl::NotFoundError(absl::StrCat(
          "job ", request.job_id(), " has no complete checkpoint of step ",
          step, " on this server (it has: ", absl::StrJoin(*steps, ", "), ")"));
    }
  }
  const absl::Status aborted = absl::AbortedError(absl::StrCat(
      "job ", request.job_id(), " is being rolled back to step ", step,
      " (a client asked for it: a server restarted behind the others, or an "
      "operator's rollback); open the job again and resume after step ",
      step));
  // Before and after the shard stops taking contributions: a stream that
  // opened in between may have added some.
  FailStreamsOf(request.job_id(), aborted);
  shard.BeginRollBack();
  FailStreamsOf(request.job_id(), aborted);
  const uint64_t dropped = shard.DropInFlight();
  absl::Status status;
  bool restored = false;
  // The checkpoint, read whole before it replaces the state, is charged to
  // the memory budget meanwhile.
  ScopedReservation staged(jobs_->budget().get());
  if (!(shard.completed_step() == step && shard.newest_step() == step)) {
    absl::StatusOr<ShardCheckpoint> loaded =
        checkpointer_ == nullptr
            ? absl::FailedPreconditionError("no --checkpoint_dir")
        : !staged.TryAdd(shard.shape().state_bytes())
            ? absl::ResourceExhaustedError(absl::StrCat(
                  "the server's memory budget (", jobs_->budget()->limit(),
                  " bytes, ", jobs_->budget()->used(),
                  " in use) has no room to read the checkpoint's ",
                  shard.shape().state_bytes(), " bytes of state"))
            : checkpointer_->Load(key, step);
    if (loaded.ok() &&
        (loaded->fingerprint != shard.shape().fingerprint() ||
         loaded->server_index != shard.shape().server_index() ||
         loaded->chunks.size() != shard.shape().shard().num_chunks())) {
      loaded = absl::FailedPreconditionError(
          absl::StrCat("the checkpoint of step ", step,
                       " is of another shard or config "
                       "than the job's"));
    }
    status = loaded.ok() ? shard.ImportChunks(std::move(loaded->chunks))
                         : loaded.status();
    restored = status.ok();
  }
  shard.EndRollBack();
  metrics_->rollback_dropped_contributions.Increment(
      static_cast<double>(dropped));
  if (!status.ok()) {
    Log(absl::StrFormat(
        "%s NOT rolled back to step %d (it stays at step %d; %d "
        "contributions in flight were dropped): %s",
        Describe(key, request.job_id()), step, shard.completed_step(), dropped,
        status.ToString()));
    return status;
  }
  if (checkpointer_ != nullptr) checkpointer_->RemoveStepsAfter(key, step);
  metrics_->rollbacks.Increment();
  Log(absl::StrFormat(
      "%s rolled back to step %d (%s; %d contributions in flight "
      "dropped)",
      Describe(key, request.job_id()), step,
      restored ? "restored from its checkpoint" : "it was at that step",
      dropped));
  response->set_step(step);
  response->set_restored(restored);
  response->set_dropped_contributions(dropped);
  return absl::OkStatus();
}

grpc::Status DepotService::ImportCheckpoint(
    grpc::ServerContextBase* context,
    const v1::ImportCheckpointRequest* request,
    v1::ImportCheckpointResponse* response) {
  return Serve(Rpc::kImportCheckpoint, *context, [&](Caller& caller) {
    return DoImportCheckpoint(caller, *request, response);
  });
}

absl::Status DepotService::DoImportCheckpoint(
    Caller& caller, const v1::ImportCheckpointRequest& request,
    v1::ImportCheckpointResponse* response) {
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      FindOwned(caller, request.job_id(), request.fingerprint());
  if (!shard.ok()) return shard.status();
  const JobShape& shape = (*shard)->shape();
  // Only directories under --import_roots, read through their canonical
  // paths (import_roots.h).
  absl::StatusOr<std::vector<std::string>> dirs =
      import_roots_.Resolve(std::vector<std::string>(
          request.checkpoint_dirs().begin(), request.checkpoint_dirs().end()));
  if (!dirs.ok()) return dirs.status();
  // The shard's state, read and staged whole before it replaces the job's,
  // is charged to the memory budget meanwhile.
  ScopedReservation staged(jobs_->budget().get());
  if (!request.verify_only() && !staged.TryAdd(shape.state_bytes())) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "ImportCheckpoint: the server's memory budget (",
        jobs_->budget()->limit(), " bytes, ", jobs_->budget()->used(),
        " in use) has no room to stage the shard's ", shape.state_bytes(),
        " bytes of state"));
  }
  // Read on this call's thread: the files are other servers', so the
  // checkpointer's writer (this server's directory) has no part in it.
  absl::StatusOr<CheckpointForShard> read = ReadCheckpointForShard(
      *dirs, shape, request.step(), /*keep_chunks=*/!request.verify_only());
  if (!read.ok()) return read.status();
  response->set_step(request.step());
  response->set_old_num_servers(read->old_num_servers);
  for (const std::string& file : read->shard_files) {
    response->add_shard_files(file);
  }
  if (request.verify_only()) return absl::OkStatus();
  if (absl::Status s = (*shard)->ImportChunks(std::move(read->chunks));
      !s.ok()) {
    return s;
  }
  jobs_->NoteStateReplaced(*shard);
  Log(absl::StrFormat(
      "job %d \"%s\" (server %d of %d) imported the checkpoint of step %d "
      "written by %d servers, from %s",
      request.job_id(), shape.config().name, shape.server_index(),
      shape.config().num_servers, request.step(), read->old_num_servers,
      read->shard_files.empty() ? std::string("no file (an empty shard)")
                                : absl::StrJoin(read->shard_files, ", ")));
  return absl::OkStatus();
}

}  // namespace depot
