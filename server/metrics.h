// ServerMetrics: the daemon's Prometheus series (names per DESIGN.md: depot_
// prefix, base units, _total counters, no per-step/chunk/job labels). Every
// labelled series the server can emit is created up front, so it is exported as
// 0 before it first moves. All members are safe to update from any thread.
#ifndef DEPOT_SERVER_METRICS_H_
#define DEPOT_SERVER_METRICS_H_

#include <array>

#include "absl/status/status.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace depot {

// The RPCs of depot.v1.Depot, as counted in depot_rpcs_total{rpc=...}.
enum class Rpc {
  kCreateJob,
  kInitWeights,
  kStep,
  kPullWeights,
  kGetJob,
  kDeleteJob,
  kExportState,
  kImportState,
  kCheckpoint,
  kListCheckpoints,
  kRollBack,
  kImportCheckpoint,
  kServerStatus,
  kDrain,
};
inline constexpr int kNumRpcs = 14;

class ServerMetrics {
 public:
  // Registers the series in `registry`, which must outlive this object.
  explicit ServerMetrics(prometheus::Registry& registry);

  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  // depot_rpcs_total{rpc}: one per RPC started.
  void CountRpc(Rpc rpc);
  // depot_errors_total{code}: one per RPC that ended with `code`. Ignores OK.
  void CountError(absl::StatusCode code);

  // Payload bytes of accepted gradient (Step) and weight (InitWeights) chunks.
  prometheus::Counter& received_step_bytes;
  prometheus::Counter& received_init_bytes;
  // Weight payload bytes sent by Step and PullWeights.
  prometheus::Counter& sent_step_bytes;
  prometheus::Counter& sent_pull_bytes;
  prometheus::Counter& chunks_updated;
  prometheus::Counter& steps_completed;
  prometheus::Histogram& chunk_update_seconds;
  // From a step's first contribution to its last chunk update on this server.
  prometheus::Histogram& step_seconds;
  prometheus::Gauge& state_bytes;
  // The memory budget (--memory_limit_bytes) and everything counted against
  // it now: jobs, payloads of steps in flight, the Step streams'
  // reservations, staged imports (set at each scrape, StatusEndpoint); and
  // of it, the Step streams' reservations (one chunk message per stream
  // that reads, server/step_reactor.cc).
  prometheus::Gauge& memory_limit_bytes;
  prometheus::Gauge& memory_used_bytes;
  prometheus::Gauge& step_receive_reserved_bytes;
  prometheus::Gauge& jobs;
  prometheus::Gauge& active_streams;
  // Calls of methods other than Step whose handlers run now, each on a
  // thread of its own, and the most that may (--max_handler_threads; a call
  // past it is RESOURCE_EXHAUSTED).
  prometheus::Gauge& handler_calls;
  prometheus::Gauge& handler_calls_limit;
  // The stalled-step check (stall_monitor.h): steps that have waited past the
  // threshold for workers that sent nothing for some chunk, now; the worker
  // ranks they wait for and the longest wait among them; and each such step
  // counted once.
  prometheus::Gauge& stalled_steps;
  prometheus::Gauge& stalled_step_missing_workers;
  prometheus::Gauge& stalled_step_wait_seconds;
  prometheus::Counter& step_stalls;
  // Checkpoints (server/checkpointer.h): shard checkpoints written, failed
  // (an error writing them: a failed fsync among them), and capture steps
  // skipped because the job's previous checkpoint was still being written;
  // bytes written, write time, and when the last one was written (unix
  // seconds, 0 before the first).
  prometheus::Counter& checkpoints_written;
  prometheus::Counter& checkpoint_failures;
  prometheus::Counter& checkpoints_skipped;
  prometheus::Counter& checkpoint_bytes;
  prometheus::Histogram& checkpoint_write_seconds;
  prometheus::Gauge& checkpoint_last_success;
  // Jobs restored from --checkpoint_dir at start-up, and jobs found there
  // that could not be restored.
  prometheus::Counter& jobs_restored;
  prometheus::Counter& job_restore_failures;
  // Jobs rolled back on this server (the RollBack RPC), and the chunk
  // contributions in flight that rollbacks dropped.
  prometheus::Counter& rollbacks;
  // 1 while the server is drained (depotctl drain), else 0.
  prometheus::Gauge& draining;
  prometheus::Counter& rollback_dropped_contributions;
  // The daemon's --checkpoint_every_steps (0: it takes no checkpoints), so
  // that an alert on the checkpoints' age knows whether to expect any.
  prometheus::Gauge& checkpoint_every_steps;
  // When these metrics were created, unix seconds: the process's start, as
  // the standard process_start_time_seconds (prometheus-cpp exports no
  // process metrics). A change of it is a restart.
  prometheus::Gauge& start_time;

 private:
  struct Families;
  ServerMetrics(prometheus::Registry& registry, const Families& families);

  std::array<prometheus::Counter*, kNumRpcs> rpcs_;
  // Indexed by absl::StatusCode value; OK (0) is unused.
  std::array<prometheus::Counter*, 17> errors_{};
};

}  // namespace depot

#endif  // DEPOT_SERVER_METRICS_H_
