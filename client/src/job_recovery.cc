// JobImpl's recovery after a server restart (docs/checkpoints.md, "Rolling
// back"): Reconcile opens the job again on every server and, when they are
// at different steps, rolls them all back to a step each can return to;
// Step calls it when a step fails in a way a restart explains.
#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "call_group.h"
#include "job_impl.h"
#include "wire/wire.h"

namespace depot {

namespace {
constexpr char kRolledBackUrl[] = "type.depot.dev/depot.RolledBack";
}  // namespace

absl::Status RolledBackError(uint64_t step, absl::string_view why) {
  absl::Status status(
      absl::StatusCode::kAborted,
      absl::StrCat("the job was rolled back to step ", step, " (", why,
                   "): reload the trainer's data position and weights for "
                   "step ",
                   step, " and go on with step ", step + 1));
  status.SetPayload(kRolledBackUrl, absl::Cord(absl::StrCat(step)));
  return status;
}

std::optional<uint64_t> RolledBackStep(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kAborted) return std::nullopt;
  const auto payload = status.GetPayload(kRolledBackUrl);
  uint64_t step = 0;
  if (!payload.has_value() ||
      !absl::SimpleAtoi(std::string(*payload), &step)) {
    return std::nullopt;
  }
  return step;
}

namespace client_internal {
namespace {

// Whether a failed step may come from a server that restarted under it: the
// job id it knew is gone (NOT_FOUND) or names another job now (a fingerprint
// mismatch), the restored job is behind the step (ABORTED: out of order), or
// the server was down (UNAVAILABLE once the step's retries ran out).
bool RestartMayExplain(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kUnavailable:
      return !RolledBackStep(status).has_value();
    case absl::StatusCode::kFailedPrecondition:
      return absl::StrContains(status.message(), "fingerprint mismatch");
    default:
      return false;
  }
}

// Steps a Step recovers from in a row before it gives up: another worker's
// rollback may abort the retry of one that had just recovered.
constexpr int kRecoveryRounds = 3;

}  // namespace

absl::Status JobImpl::Step(uint64_t step, const void* grads, void* weights_out,
                           StepResult* result, const StepOptions& options) {
  absl::Status status = StepOnce(step, grads, weights_out, result, options);
  for (int round = 0; round < kRecoveryRounds && RestartMayExplain(status);
       ++round) {
    absl::StatusOr<Reconciled> reconciled =
        ReconcileUntil(absl::Now() + options_.unavailable_retry);
    if (!reconciled.ok()) {
      return absl::Status(
          status.code(),
          absl::StrCat(status.message(), " (and the job could not be made "
                       "consistent again: ", reconciled.status().ToString(),
                       ")"));
    }
    if (reconciled->step + 1 < step) {
      return RolledBackError(
          reconciled->step,
          absl::StrCat("step ", step, " failed: ", status.message()));
    }
    // Every server is at step - 1 (the step is sent again) or has applied
    // it (the step is replayed: nothing is applied twice).
    status = StepOnce(step, grads, weights_out, result, options);
  }
  return status;
}

absl::Status JobImpl::Reattach() {
  const size_t n = plan().num_servers();
  absl::StatusOr<CreatedJob> opened =
      CreateJobOnServers(*connections_, config(), fingerprint(), plan(),
                         absl::Now() + options_.rpc_timeout);
  if (!opened.ok()) return opened.status();
  const std::vector<uint64_t>& ids = opened->ids;
  const std::vector<char>& created = opened->created;
  job_ids_ = ids;
  std::vector<uint32_t> lost;
  for (uint32_t s = 0; s < n; ++s) {
    if (created[s]) lost.push_back(s);
  }
  if (lost.empty()) return absl::OkStatus();
  // The fresh jobs hold no weights: they must not be trained on.
  std::vector<std::string> addresses;
  for (uint32_t s : lost) addresses.push_back((*connections_)[s]->address);
  RunOnServers(*connections_, lost, [&](uint32_t server, CallGroup& group) {
    GroupContext context(group, absl::Now() + options_.rpc_timeout);
    v1::DeleteJobRequest remove;
    remove.set_job_id(ids[server]);
    remove.set_fingerprint(fingerprint());
    v1::DeleteJobResponse response;
    return FromGrpcStatus((*connections_)[server]->depot->DeleteJob(
        context.get(), remove, &response));
  }).IgnoreError();
  return absl::DataLossError(absl::StrCat(
      "server", lost.size() > 1 ? "s " : " ", absl::StrJoin(addresses, ", "),
      " no longer held job \"", config().name,
      "\" (restarted without a checkpoint of it, or the job was deleted): "
      "its state is lost there; load a saved state into a new job"));
}

absl::StatusOr<std::vector<ServerCheckpoints>> JobImpl::QueryCheckpoints(
    const std::vector<uint32_t>& servers) const {
  std::vector<ServerCheckpoints> each(plan().num_servers());
  const absl::Time deadline = absl::Now() + options_.rpc_timeout;
  absl::Status status = RunOnServers(
      *connections_, servers, [&](uint32_t server, CallGroup& group) {
        GroupContext context(group, deadline);
        v1::ListCheckpointsRequest request;
        request.set_job_id(job_ids_[server]);
        request.set_fingerprint(fingerprint());
        v1::ListCheckpointsResponse response;
        const grpc::Status rpc =
            (*connections_)[server]->depot->ListCheckpoints(context.get(),
                                                            request, &response);
        if (!rpc.ok()) return FromGrpcStatus(rpc);
        ServerCheckpoints& out = each[server];
        out.server = (*connections_)[server]->address;
        out.steps.assign(response.steps().begin(), response.steps().end());
        out.step = response.step();
        out.newest_step = response.newest_step();
        out.steps_lacking_worker_state.assign(
            response.steps_lacking_worker_state().begin(),
            response.steps_lacking_worker_state().end());
        return absl::OkStatus();
      });
  if (!status.ok()) return status;
  return each;
}

absl::Status JobImpl::RollBackServers(const std::vector<uint32_t>& servers,
                                      uint64_t step) const {
  // A rollback may read a whole shard from disk: the step's deadline.
  const absl::Time deadline = absl::Now() + options_.step_timeout;
  return RunOnServers(
      *connections_, servers, [&](uint32_t server, CallGroup& group) {
        GroupContext context(group, deadline);
        v1::RollBackRequest request;
        request.set_job_id(job_ids_[server]);
        request.set_fingerprint(fingerprint());
        request.set_step(step);
        v1::RollBackResponse response;
        return FromGrpcStatus((*connections_)[server]->depot->RollBack(
            context.get(), request, &response));
      });
}

absl::StatusOr<std::vector<ServerCheckpoints>> JobImpl::ListCheckpoints() {
  absl::StatusOr<std::vector<ServerCheckpoints>> each =
      QueryCheckpoints(AllServers(plan().num_servers()));
  if (!each.ok()) return each.status();
  for (uint32_t s = 0; s < plan().num_servers(); ++s) {
    (*each)[s].server = (*connections_)[s]->address;
  }
  return each;
}

absl::StatusOr<uint64_t> JobImpl::NewestCheckpointWithWorkerState(uint64_t at) {
  const std::vector<uint32_t> servers = ServersWithChunks();
  absl::StatusOr<std::vector<ServerCheckpoints>> each =
      QueryCheckpoints(servers);
  if (!each.ok()) return each.status();
  const auto holds = [](const std::vector<uint64_t>& steps, uint64_t t) {
    return std::find(steps.begin(), steps.end(), t) != steps.end();
  };
  // Newest first, as each server lists them: the first held whole by all.
  for (const uint64_t t :
       servers.empty() ? std::vector<uint64_t>() : (*each)[servers[0]].steps) {
    if (t > at) continue;
    bool whole = true;
    for (const uint32_t s : servers) {
      const ServerCheckpoints& on = (*each)[s];
      whole &= holds(on.steps, t) && !holds(on.steps_lacking_worker_state, t);
    }
    if (whole) return t;
  }
  std::vector<std::string> where;
  for (const uint32_t s : servers) {
    const ServerCheckpoints& on = (*each)[s];
    where.push_back(
        absl::StrCat((*connections_)[s]->address, ": [",
                     absl::StrJoin(on.steps, ", "), "], lacking it [",
                     absl::StrJoin(on.steps_lacking_worker_state, ", "), "]"));
  }
  return absl::NotFoundError(absl::StrCat(
      "no step at or before ", at,
      " has a checkpoint on every server that holds the state of the "
      "tensors the workers keep (",
      absl::StrJoin(where, "; "), ")"));
}

absl::Status JobImpl::RollBack(uint64_t step) {
  return RollBackServers(ServersWithChunks(), step);
}

absl::Status JobImpl::ImportCheckpointOnServers(
    uint64_t step, const std::vector<std::string>& checkpoint_dirs,
    bool verify_only) const {
  // Each server reads its part of the checkpoint from disk: the step's
  // deadline, as a rollback.
  const absl::Time deadline = absl::Now() + options_.step_timeout;
  return RunOnServers(
      *connections_, ServersWithChunks(),
      [&](uint32_t server, CallGroup& group) {
        GroupContext context(group, deadline);
        v1::ImportCheckpointRequest request;
        request.set_job_id(job_ids_[server]);
        request.set_fingerprint(fingerprint());
        request.set_step(step);
        for (const std::string& dir : checkpoint_dirs) {
          request.add_checkpoint_dirs(dir);
        }
        request.set_verify_only(verify_only);
        v1::ImportCheckpointResponse response;
        return FromGrpcStatus((*connections_)[server]->depot->ImportCheckpoint(
            context.get(), request, &response));
      });
}

absl::Status JobImpl::ImportCheckpoint(
    uint64_t step, const std::vector<std::string>& checkpoint_dirs) {
  // Every server checks its part before any imports: a missing or damaged
  // file refuses the import with every server as it was.
  if (absl::Status s = ImportCheckpointOnServers(step, checkpoint_dirs,
                                                 /*verify_only=*/true);
      !s.ok()) {
    return s;
  }
  return ImportCheckpointOnServers(step, checkpoint_dirs,
                                   /*verify_only=*/false);
}

absl::StatusOr<Reconciled> JobImpl::Reconcile() {
  if (absl::Status s = Reattach(); !s.ok()) return s;
  const std::vector<uint32_t> servers = ServersWithChunks();
  if (servers.empty()) return Reconciled();
  // (server, step) pairs whose checkpoint turned out damaged.
  std::set<std::pair<uint32_t, uint64_t>> damaged;
  absl::Status last_error;
  for (int attempt = 0; attempt < 3; ++attempt) {
    absl::StatusOr<std::vector<ServerCheckpoints>> each =
        QueryCheckpoints(servers);
    if (!each.ok()) return each.status();
    uint64_t lowest = UINT64_MAX, highest = 0;
    bool half_ahead = false;
    for (uint32_t s : servers) {
      const ServerCheckpoints& at = (*each)[s];
      lowest = std::min(lowest, at.step);
      highest = std::max(highest, at.step);
    }
    for (uint32_t s : servers) {
      half_ahead |= (*each)[s].newest_step > lowest + 1;
    }
    // One step everywhere, at most its successor half applied: sending
    // that step again completes it (its applied chunks replay).
    if (attempt == 0 && lowest == highest && !half_ahead) {
      return Reconciled{lowest, false};
    }
    // The newest step at or below the lowest completed one that every
    // server can return to: by being exactly at it, or from its checkpoint.
    std::set<uint64_t, std::greater<uint64_t>> candidates = {lowest};
    for (uint32_t s : servers) {
      for (uint64_t t : (*each)[s].steps) {
        if (t <= lowest) candidates.insert(t);
      }
    }
    std::optional<uint64_t> target;
    for (uint64_t t : candidates) {
      bool all = true;
      for (uint32_t s : servers) {
        const ServerCheckpoints& at = (*each)[s];
        const bool exactly = at.step == t && at.newest_step == t;
        const bool held =
            std::find(at.steps.begin(), at.steps.end(), t) != at.steps.end() &&
            damaged.count({s, t}) == 0;
        all &= exactly || held;
      }
      if (all) {
        target = t;
        break;
      }
    }
    if (!target.has_value()) {
      std::vector<std::string> where;
      for (uint32_t s : servers) {
        const ServerCheckpoints& at = (*each)[s];
        where.push_back(absl::StrCat(at.server, " at step ", at.step,
                                     " with checkpoints of steps [",
                                     absl::StrJoin(at.steps, ", "), "]"));
      }
      return absl::DataLossError(absl::StrCat(
          "the servers of job \"", config().name,
          "\" are at different steps and have no step in common to roll back "
          "to (",
          absl::StrJoin(where, "; "), ")",
          last_error.ok() ? "" : absl::StrCat("; ", last_error.ToString())));
    }
    absl::Status rolled = RollBackServers(servers, *target);
    if (rolled.ok()) return Reconciled{*target, true};
    if (rolled.code() != absl::StatusCode::kDataLoss &&
        rolled.code() != absl::StatusCode::kNotFound) {
      return rolled;
    }
    // A damaged (or vanished) checkpoint: choose again without it. The
    // message names the server; mark every server holding the step's file
    // that is not exactly at it, which is at most the ones that failed.
    last_error = rolled;
    for (uint32_t s : servers) {
      if (absl::StrContains(rolled.message(), (*each)[s].server)) {
        damaged.insert({s, *target});
      }
    }
  }
  return last_error;
}

absl::StatusOr<Reconciled> JobImpl::ReconcileUntil(absl::Time give_up) {
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    absl::StatusOr<Reconciled> reconciled = Reconcile();
    // A server down (restarting), or one that restarted again under the
    // reconcile (its job ids changed: NOT_FOUND), or a rollback by another
    // worker that aborted ours: look again.
    const absl::StatusCode code = reconciled.status().code();
    const bool again = code == absl::StatusCode::kUnavailable ||
                       code == absl::StatusCode::kNotFound ||
                       code == absl::StatusCode::kAborted;
    if (reconciled.ok() || !again || absl::Now() + backoff >= give_up) {
      return reconciled;
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

}  // namespace client_internal
}  // namespace depot
