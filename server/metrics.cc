#include "server/metrics.h"

#include <chrono>
#include <string>

#include "prometheus/family.h"

namespace depot {
namespace {

prometheus::Family<prometheus::Counter>& CounterFamily(
    prometheus::Registry& registry, const std::string& name,
    const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
}

prometheus::Counter& Counter(prometheus::Registry& registry,
                             const std::string& name, const std::string& help) {
  return CounterFamily(registry, name, help).Add({});
}

prometheus::Gauge& Gauge(prometheus::Registry& registry,
                         const std::string& name, const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add(
      {});
}

prometheus::Histogram& Histogram(
    prometheus::Registry& registry, const std::string& name,
    const std::string& help, prometheus::Histogram::BucketBoundaries bounds) {
  return prometheus::BuildHistogram()
      .Name(name)
      .Help(help)
      .Register(registry)
      .Add({}, std::move(bounds));
}

constexpr const char* kRpcLabels[kNumRpcs] = {
    "create_job", "init_weights", "step",         "pull_weights",
    "get_job",    "delete_job",   "export_state", "import_state",
    "checkpoint", "list_checkpoints", "roll_back",
    "import_checkpoint", "server_status", "drain"};

}  // namespace

// Registering one family twice is an error in prometheus-cpp, so the labelled
// families are built once and shared by the constructor's member initialisers.
struct ServerMetrics::Families {
  explicit Families(prometheus::Registry& registry)
      : received(CounterFamily(
            registry, "depot_received_bytes_total",
            "Payload bytes of accepted gradient (rpc=step) and initial weight "
            "(rpc=init) chunks.")),
        sent(CounterFamily(registry, "depot_sent_bytes_total",
                           "Weight payload bytes sent by Step (rpc=step) and "
                           "PullWeights (rpc=pull).")),
        rpcs(CounterFamily(registry, "depot_rpcs_total",
                           "RPCs started, by method.")),
        errors(CounterFamily(registry, "depot_errors_total",
                             "RPCs that ended with a non-OK status, by gRPC "
                             "status code name.")) {}

  prometheus::Family<prometheus::Counter>& received;
  prometheus::Family<prometheus::Counter>& sent;
  prometheus::Family<prometheus::Counter>& rpcs;
  prometheus::Family<prometheus::Counter>& errors;
};

ServerMetrics::ServerMetrics(prometheus::Registry& registry)
    : ServerMetrics(registry, Families(registry)) {}

ServerMetrics::ServerMetrics(prometheus::Registry& registry,
                             const Families& families)
    : received_step_bytes(families.received.Add({{"rpc", "step"}})),
      received_init_bytes(families.received.Add({{"rpc", "init"}})),
      sent_step_bytes(families.sent.Add({{"rpc", "step"}})),
      sent_pull_bytes(families.sent.Add({{"rpc", "pull"}})),
      chunks_updated(Counter(registry, "depot_chunks_updated_total",
                             "Chunk optimizer updates applied.")),
      steps_completed(
          Counter(registry, "depot_steps_completed_total",
                  "Steps applied to every chunk of a job's shard.")),
      chunk_update_seconds(Histogram(
          registry, "depot_chunk_update_seconds",
          "CPU time of one chunk update: sum of contributions, optimizer "
          "kernel and weight conversion.",
          {1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25,
           0.5, 1, 2.5, 5, 10})),
      step_seconds(Histogram(
          registry, "depot_step_seconds",
          "Time from a step's first contribution to its last chunk update on "
          "this server.",
          {1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
           30, 60, 120, 300})),
      state_bytes(Gauge(registry, "depot_state_bytes",
                        "Bytes of job memory counted against "
                        "--memory_limit_bytes, all jobs: the state (master "
                        "weights and optimizer slots; with checkpoints on, "
                        "twice: one checkpoint capture per job) and the "
                        "weights kept for pulls at a step (2 x weight dtype "
                        "size per element), and each job's bookkeeping (per "
                        "server, worker, tensor and chunk). Payloads of steps "
                        "in flight are counted too, but not here.")),
      memory_limit_bytes(Gauge(registry, "depot_memory_limit_bytes",
                               "The memory budget, --memory_limit_bytes (or "
                               "its default).")),
      memory_used_bytes(Gauge(
          registry, "depot_memory_used_bytes",
          "Bytes counted against --memory_limit_bytes now, everything: jobs "
          "(depot_state_bytes), gradient payloads of steps in flight, the "
          "Step streams' reservations, staged imports. What does not fit is "
          "refused with RESOURCE_EXHAUSTED.")),
      step_receive_reserved_bytes(Gauge(
          registry, "depot_step_receive_reserved_bytes",
          "Bytes of the memory budget the open Step streams reserve for what "
          "gRPC may receive ahead of the server's reader: one chunk message "
          "per stream, from its header until it stops reading.")),
      jobs(Gauge(registry, "depot_jobs", "Jobs held by this server.")),
      active_streams(Gauge(registry, "depot_active_streams",
                           "Step streams currently open.")),
      handler_calls(Gauge(
          registry, "depot_handler_calls",
          "Calls of methods other than Step (CreateJob, InitWeights, "
          "PullWeights, GetJob, imports, exports, ...) whose handlers run "
          "now, each on a thread of its own.")),
      handler_calls_limit(
          Gauge(registry, "depot_handler_calls_limit",
                "--max_handler_threads: the most such calls served at once; a "
                "call past it is RESOURCE_EXHAUSTED.")),
      stalled_steps(Gauge(
          registry, "depot_stalled_steps",
          "Steps (at most one per job) that have waited longer than "
          "--stalled_step_seconds for worker ranks that have not sent some "
          "chunk the other workers sent.")),
      stalled_step_missing_workers(
          Gauge(registry, "depot_stalled_step_missing_workers",
                "Worker ranks the stalled steps wait for, summed over jobs.")),
      stalled_step_wait_seconds(Gauge(
          registry, "depot_stalled_step_wait_seconds",
          "The longest wait among the stalled steps, from the step's first "
          "contribution on this server; 0 when none is stalled.")),
      step_stalls(Counter(registry, "depot_step_stalls_total",
                          "Steps that became stalled (each counted and "
                          "logged once).")),
      checkpoints_written(Counter(
          registry, "depot_checkpoints_written_total",
          "Shard checkpoints written (shard file and manifest durable).")),
      checkpoint_failures(Counter(
          registry, "depot_checkpoint_failures_total",
          "Shard checkpoints that failed to be written (an I/O error, a "
          "failed fsync among them); each is logged.")),
      checkpoints_skipped(Counter(
          registry, "depot_checkpoints_skipped_total",
          "Checkpoint steps skipped because the job's previous checkpoint "
          "was still being written.")),
      checkpoint_bytes(Counter(registry, "depot_checkpoint_written_bytes_total",
                               "Bytes of shard checkpoint files written.")),
      checkpoint_write_seconds(Histogram(
          registry, "depot_checkpoint_write_seconds",
          "Time to write one shard checkpoint (file, fsyncs, manifest).",
          {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
           600})),
      checkpoint_last_success(
          Gauge(registry, "depot_checkpoint_last_success_timestamp_seconds",
                "When the last shard checkpoint was written, unix seconds; 0 "
                "before the first.")),
      jobs_restored(
          Counter(registry, "depot_jobs_restored_total",
                  "Jobs restored from --checkpoint_dir at start-up.")),
      job_restore_failures(Counter(
          registry, "depot_job_restore_failures_total",
          "Jobs in --checkpoint_dir that could not be restored at start-up "
          "(no complete checkpoint verified, or no room in the budget).")),
      rollbacks(Counter(registry, "depot_rollbacks_total",
                        "Jobs rolled back to an earlier step on this server "
                        "(the RollBack RPC: after a server restarted behind "
                        "the others, or an operator's rollback).")),
      draining(Gauge(registry, "depot_server_draining",
                     "1 while the server is drained (depotctl drain: no new "
                     "jobs, NOT_SERVING on the health service), else 0.")),
      rollback_dropped_contributions(
          Counter(registry, "depot_rollback_dropped_contributions_total",
                  "Chunk contributions in flight that rollbacks dropped.")),
      checkpoint_every_steps(Gauge(
          registry, "depot_checkpoint_every_steps",
          "The server's --checkpoint_every_steps: jobs are checkpointed at "
          "every step that is a multiple of it; 0 when they are not.")),
      start_time(Gauge(registry, "process_start_time_seconds",
                       "Start time of the process since unix epoch in "
                       "seconds.")) {
  // Not SetToCurrentTime, which has whole seconds: a server killed and
  // restarted within a second must still show a new start time.
  start_time.Set(std::chrono::duration<double>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count());
  for (int i = 0; i < kNumRpcs; ++i) {
    rpcs_[i] = &families.rpcs.Add({{"rpc", kRpcLabels[i]}});
  }
  for (int code = 1; code < static_cast<int>(errors_.size()); ++code) {
    errors_[code] = &families.errors.Add(
        {{"code",
          absl::StatusCodeToString(static_cast<absl::StatusCode>(code))}});
  }
}

void ServerMetrics::CountRpc(Rpc rpc) {
  rpcs_[static_cast<int>(rpc)]->Increment();
}

void ServerMetrics::CountError(absl::StatusCode code) {
  const int index = static_cast<int>(code);
  if (index <= 0 || index >= static_cast<int>(errors_.size())) return;
  errors_[index]->Increment();
}

}  // namespace depot
