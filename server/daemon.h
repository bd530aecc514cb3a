// DepotDaemon: one running depot server — the gRPC service with its health
// service, the metrics and status endpoint, the update thread pool, the payload buffer
// pool, the job store, the checkpointer and the stalled-step check — wired
// together from ServerOptions. main.cc adds flags and signals; tests start it
// in-process on ephemeral ports.
#ifndef DEPOT_SERVER_DAEMON_H_
#define DEPOT_SERVER_DAEMON_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/server.h"
#include "prometheus/registry.h"
#include "server/checkpoint_directory.h"
#include "server/checkpointer.h"
#include "server/depot_service.h"
#include "server/job_store.h"
#include "server/metrics.h"
#include "server/payload_pool.h"
#include "server/server_options.h"
#include "server/stall_monitor.h"
#include "server/status_endpoint.h"
#include "server/tenant_auth.h"
#include "server/thread_pool.h"

namespace depot {

class DepotDaemon {
 public:
  // Restores the jobs of options.checkpoint_dir (if set), then binds,
  // starts serving and reports SERVING on the health service.
  // REQUIRES: `options` went through ResolveServerOptions.
  // UNAVAILABLE when an address cannot be bound, as one line: "cannot listen
  // on ADDRESS: REASON (what to do)" or "cannot serve metrics on ...".
  // FAILED_PRECONDITION when another process uses the checkpoint directory;
  // another code when it cannot be created.
  static absl::StatusOr<std::unique_ptr<DepotDaemon>> Start(
      const ServerOptions& options);

  // Shuts down if Shutdown has not run.
  ~DepotDaemon();

  DepotDaemon(const DepotDaemon&) = delete;
  DepotDaemon& operator=(const DepotDaemon&) = delete;

  // The bound gRPC address, host:port with the real port.
  const std::string& address() const { return address_; }
  // The bound metrics address, host:port; empty when metrics are disabled.
  const std::string& metrics_address() const { return metrics_address_; }

  // The graceful shutdown: reports NOT_SERVING and rejects new RPCs with
  // UNAVAILABLE; lets the RPCs in flight (Step streams, exports, pulls,
  // imports, Checkpoint calls) and the checkpoint writes run until the grace
  // period ends; then ends what still runs with UNAVAILABLE ("server is
  // shutting down": a step waiting for absent workers, an export a client
  // reads too slowly) and abandons the checkpoint write in progress (its
  // temporary file removed, no manifest: never a half checkpoint that looks
  // complete); then stops the gRPC server, giving handlers kCancelDelay to
  // send their status before it cancels the rest, the update pool, the
  // checkpointer and the status endpoint. Returns about kCancelDelay after the grace
  // at the latest, unless a handler is stuck where it cannot notice (main.cc
  // bounds the whole with an exit). Idempotent.
  void Shutdown();

 private:
  explicit DepotDaemon(const ServerOptions& options);

  const ServerOptions options_;
  std::string address_;
  std::string metrics_address_;
  bool shut_down_ = false;

  // Declared in construction order; destroyed in reverse, so the pool has run
  // every queued update before the metrics it reports to go away.
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<ThreadPool> pool_;
  std::shared_ptr<PayloadPool> payloads_;
  std::unique_ptr<JobStore> jobs_;
  // /metrics, /status and /status.json: reads the jobs and the metrics.
  std::unique_ptr<StatusEndpoint> status_;
  // Null without --checkpoint_dir.
  std::unique_ptr<CheckpointDirectory> checkpoint_dir_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<TenantAuth> auth_;  // outlives service_, which uses it
  std::unique_ptr<DepotService> service_;
  std::unique_ptr<StallMonitor> stall_monitor_;  // null when the check is off
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace depot

#endif  // DEPOT_SERVER_DAEMON_H_
