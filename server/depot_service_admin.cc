// The operator's RPCs of DepotService (depotctl, docs/operations.md):
// ServerStatus, Drain, and ListCheckpoints' verification.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/depot_service.h"
#include "server/memory_budget.h"
#include "server/shard_state.h"

#ifndef DEPOT_VERSION_STRING
#define DEPOT_VERSION_STRING "unknown"
#endif

namespace depot {
namespace {

double UnixNow() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

uint64_t CounterValue(const prometheus::Counter& counter) {
  return static_cast<uint64_t>(counter.Value());
}

void LogAdmin(const std::string& line) {
  std::fprintf(stderr, "depot-server: %s\n", line.c_str());
}

}  // namespace

void DepotService::SetAdminHooks(AdminHooks hooks) {
  admin_ = std::move(hooks);
}

bool DepotService::IsAdmin(const Caller& caller) const {
  if (auth_ == nullptr || !auth_->enabled()) return true;
  return std::find(admin_.admin_tenants.begin(), admin_.admin_tenants.end(),
                   caller.tenant) != admin_.admin_tenants.end();
}

grpc::Status DepotService::ServerStatus(grpc::ServerContextBase* context,
                                        const v1::ServerStatusRequest*,
                                        v1::ServerStatusResponse* response) {
  return Serve(Rpc::kServerStatus, *context, [&](Caller& caller) {
    return DoServerStatus(caller, response);
  });
}

absl::Status DepotService::DoServerStatus(const Caller& caller,
                                          v1::ServerStatusResponse* response) {
  response->set_version(DEPOT_VERSION_STRING);
  response->set_time(UnixNow());
  response->set_start_time(metrics_->start_time.Value());
  response->set_memory_limit_bytes(jobs_->memory_limit_bytes());
  response->set_memory_used_bytes(jobs_->budget()->used());
  response->set_state_bytes(jobs_->state_bytes());
  response->set_draining(draining());
  response->set_checkpoints_enabled(checkpointer_ != nullptr);
  response->set_checkpoint_every_steps(
      static_cast<uint64_t>(metrics_->checkpoint_every_steps.Value()));
  response->set_checkpoint_last_success(
      metrics_->checkpoint_last_success.Value());
  response->set_steps_completed(CounterValue(metrics_->steps_completed));
  response->set_chunks_updated(CounterValue(metrics_->chunks_updated));
  response->set_received_bytes(CounterValue(metrics_->received_step_bytes) +
                               CounterValue(metrics_->received_init_bytes));
  response->set_sent_bytes(CounterValue(metrics_->sent_step_bytes) +
                           CounterValue(metrics_->sent_pull_bytes));
  response->set_checkpoints_written(
      CounterValue(metrics_->checkpoints_written));
  response->set_checkpoint_failures(
      CounterValue(metrics_->checkpoint_failures));
  response->set_rollbacks(CounterValue(metrics_->rollbacks));
  response->set_jobs_restored(CounterValue(metrics_->jobs_restored));
  response->set_active_streams(
      static_cast<uint32_t>(metrics_->active_streams.Value()));
  const bool admin = IsAdmin(caller);
  response->set_all_tenants(admin);
  response->set_caller_tenant(caller.tenant);
  for (const std::shared_ptr<ShardState>& shard : jobs_->Jobs()) {
    const std::string& tenant = shard->shape().tenant();
    if (!admin && tenant != caller.tenant) continue;
    const JobShape& shape = shard->shape();
    v1::JobSummary* job = response->add_jobs();
    job->set_job_id(shard->job_id());
    job->set_name(shape.config().name);
    if (admin) job->set_tenant(tenant);
    job->set_fingerprint(shape.fingerprint());
    job->set_server_index(shape.server_index());
    job->set_num_servers(shape.config().num_servers);
    job->set_num_workers(shape.config().num_workers);
    job->set_step(shard->completed_step());
    job->set_newest_step(shard->newest_step());
    const PendingStepReport pending = shard->OldestPendingStep();
    job->set_pending_step(pending.step);
    for (const uint32_t worker : pending.missing_workers) {
      job->add_missing_workers(worker);
    }
    if (pending.step != 0) {
      job->set_waiting_seconds(
          std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                        pending.since)
              .count());
    }
    job->set_shard_params(shape.shard().size());
    job->set_state_bytes(shape.state_bytes());
    if (checkpointer_ != nullptr) {
      absl::StatusOr<std::vector<uint64_t>> steps =
          checkpointer_->CompleteSteps(shape.key());
      // Newest first; an unreadable directory shows as none.
      if (steps.ok() && !steps->empty()) {
        job->set_newest_checkpoint_step(steps->front());
      }
    }
  }
  return absl::OkStatus();
}

grpc::Status DepotService::Drain(grpc::ServerContextBase* context,
                                 const v1::DrainRequest* request,
                                 v1::DrainResponse* response) {
  return Serve(Rpc::kDrain, *context, [&](Caller& caller) {
    return DoDrain(caller, *request, response);
  });
}

absl::Status DepotService::DoDrain(const Caller& caller,
                                   const v1::DrainRequest& request,
                                   v1::DrainResponse* response) {
  if (!IsAdmin(caller)) {
    return absl::PermissionDeniedError(
        "draining a server needs an admin tenant (the server's "
        "--admin_tenants)");
  }
  if (request.resume() && request.shutdown()) {
    return absl::InvalidArgumentError(
        "a Drain request cannot both resume and shut down");
  }
  if (request.shutdown() && !admin_.request_shutdown) {
    return absl::FailedPreconditionError(
        "this server cannot shut itself down (it is not run by "
        "depot-server's main)");
  }
  if (request.resume()) {
    draining_.store(false, std::memory_order_release);
    metrics_->draining.Set(0);
    if (admin_.set_serving) admin_.set_serving(true);
    LogAdmin(absl::StrCat("drain resumed by tenant \"",
                          absl::CHexEscape(caller.tenant),
                          "\": new jobs are taken again, SERVING"));
    response->set_draining(false);
    return absl::OkStatus();
  }
  draining_.store(true, std::memory_order_release);
  metrics_->draining.Set(1);
  if (admin_.set_serving) admin_.set_serving(false);
  LogAdmin(absl::StrCat("drained by tenant \"", absl::CHexEscape(caller.tenant),
                        "\": no new jobs, NOT_SERVING",
                        checkpointer_ != nullptr
                            ? "; checkpointing every job"
                            : " (no --checkpoint_dir: nothing is saved)"));
  response->set_draining(true);
  bool all_saved = true;
  if (checkpointer_ != nullptr) {
    for (const std::shared_ptr<ShardState>& shard : jobs_->Jobs()) {
      v1::DrainedJob* drained = response->add_checkpoints();
      drained->set_job_id(shard->job_id());
      drained->set_name(shard->shape().config().name);
      drained->set_tenant(shard->shape().tenant());
      absl::StatusOr<uint64_t> step = checkpointer_->CheckpointNow(shard);
      if (step.ok()) {
        drained->set_step(*step);
      } else {
        all_saved = false;
        drained->set_error(step.status().ToString());
      }
    }
  }
  if (request.shutdown() && !all_saved) {
    // Stopping now would lose what the failed checkpoints hold: the server
    // stays up, drained, for the operator to decide.
    LogAdmin("drain: NOT shutting down: a job's checkpoint failed");
    return absl::OkStatus();
  }
  if (request.shutdown()) {
    response->set_shutting_down(true);
    LogAdmin("drain: shutting down as asked");
    admin_.request_shutdown();
  }
  return absl::OkStatus();
}

absl::Status DepotService::VerifyCheckpoints(
    const ShardState& shard, const std::vector<uint64_t>& steps,
    v1::ListCheckpointsResponse* response) {
  const JobShape& shape = shard.shape();
  for (const uint64_t step : steps) {
    // The shard is read whole: its state size must fit the budget meanwhile.
    ScopedReservation reservation(jobs_->budget().get());
    if (!reservation.TryAdd(shape.state_bytes())) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "verifying the checkpoint of step %d reads %d bytes of state, more "
          "than the memory budget has free now",
          step, shape.state_bytes()));
    }
    v1::CheckpointVerification* verified = response->add_verified();
    verified->set_step(step);
    absl::StatusOr<ShardCheckpoint> loaded =
        checkpointer_->Load(shape.key(), step);
    if (!loaded.ok()) {
      verified->set_error(loaded.status().ToString());
    } else if (loaded->fingerprint != shape.fingerprint() ||
               loaded->server_index != shape.server_index()) {
      verified->set_error(absl::StrFormat(
          "DATA_LOSS: the checkpoint of step %d is of another job (fingerprint "
          "%016x, server %d; the job's %016x, server %d)",
          step, loaded->fingerprint, loaded->server_index, shape.fingerprint(),
          shape.server_index()));
    } else if (loaded->step != step) {
      verified->set_error(absl::StrFormat(
          "DATA_LOSS: the checkpoint listed as step %d holds step %d", step,
          loaded->step));
    } else {
      verified->set_ok(true);
    }
  }
  return absl::OkStatus();
}

}  // namespace depot
