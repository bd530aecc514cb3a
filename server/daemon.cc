#include "server/daemon.h"

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "wire/channel_args.h"

namespace depot {
namespace {

constexpr int kMaxMessageBytes = 64 << 20;
// The name clients ask the health service about (besides "", the whole server).
constexpr const char* kServiceName = "depot.v1.Depot";
// After the grace period: how long the handlers that were just failed get to
// send their status before gRPC cancels whatever still runs.
constexpr absl::Duration kCancelDelay = absl::Seconds(1);

void LogLine(const std::string& line) {
  std::fprintf(stderr, "depot-server: %s\n", line.c_str());
}

}  // namespace

DepotDaemon::DepotDaemon(const ServerOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<DepotDaemon>> DepotDaemon::Start(
    const ServerOptions& options) {
  std::unique_ptr<DepotDaemon> daemon(new DepotDaemon(options));
  daemon->registry_ = std::make_shared<prometheus::Registry>();
  daemon->metrics_ = std::make_unique<ServerMetrics>(*daemon->registry_);
  if (!options.metrics_listen.empty()) {
    absl::StatusOr<HostPort> bind = ParseHostPort(options.metrics_listen);
    if (!bind.ok()) return bind.status();
    // prometheus-cpp reports a failed bind by throwing; it stops here.
    try {
      daemon->exposer_ =
          std::make_unique<prometheus::Exposer>(options.metrics_listen);
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat(
          "cannot serve metrics on ", options.metrics_listen, ": ", e.what()));
    }
    daemon->exposer_->RegisterCollectable(daemon->registry_);
    const std::vector<int> ports = daemon->exposer_->GetListeningPorts();
    daemon->metrics_address_ =
        FormatHostPort(bind->host, ports.empty() ? bind->port : ports.front());
  }
  daemon->pool_ =
      std::make_unique<ThreadPool>(options.threads, options.pin_threads);
  daemon->payloads_ = PayloadPool::Create(JobStore::kPayloadPoolFreeBytes);
  daemon->jobs_ = std::make_unique<JobStore>(
      options.memory_limit_bytes, daemon->pool_.get(), daemon->metrics_.get(),
      options.bench_noop_update, daemon->payloads_);
  daemon->service_ = std::make_unique<DepotService>(daemon->jobs_.get(),
                                                    daemon->metrics_.get());
  if (options.stalled_step_threshold > absl::ZeroDuration()) {
    daemon->stall_monitor_ = std::make_unique<StallMonitor>(
        daemon->jobs_.get(), daemon->metrics_.get(),
        options.stalled_step_threshold, &LogLine);
  }

  absl::StatusOr<HostPort> listen = ParseHostPort(options.listen);
  if (!listen.ok()) return listen.status();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(),
                           &port);
  // Without this, a second server on the same fixed port would silently share
  // it (gRPC sets SO_REUSEPORT by default on Linux).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Frame size and flow control for bulk chunks (docs/protocol.md, Transport).
  ApplyServerTransportArgs(builder);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.RegisterService(daemon->service_.get());
  daemon->server_ = builder.BuildAndStart();
  if (daemon->server_ == nullptr || port == 0) {
    daemon->server_.reset();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen));
  }
  daemon->address_ = FormatHostPort(listen->host, port);
  grpc::HealthCheckServiceInterface* health =
      daemon->server_->GetHealthCheckService();
  health->SetServingStatus(kServiceName, true);
  health->SetServingStatus(true);
  if (daemon->stall_monitor_ != nullptr) daemon->stall_monitor_->Start();
  return daemon;
}

DepotDaemon::~DepotDaemon() {
  if (server_ != nullptr) Shutdown();
}

void DepotDaemon::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  // Rejecting first: a client that sees NOT_SERVING finds new RPCs refused.
  service_->StopAcceptingRpcs();
  server_->GetHealthCheckService()->SetServingStatus(false);
  service_->WaitForStepStreams(absl::Now() + options_.shutdown_grace);
  service_->FailStepStreams(absl::UnavailableError("server is shutting down"));
  server_->Shutdown(absl::ToChronoTime(absl::Now() + kCancelDelay));
  server_->Wait();
  if (stall_monitor_ != nullptr) stall_monitor_->Stop();
  pool_.reset();
  exposer_.reset();
}

}  // namespace depot
