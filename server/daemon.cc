#include "server/daemon.h"

#include <cstdio>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "server/bind_probe.h"
#include "wire/channel_args.h"

namespace depot {
namespace {

constexpr int kMaxMessageBytes = 64 << 20;
// The name clients ask the health service about (besides "", the whole server).
constexpr const char* kServiceName = "depot.v1.Depot";
// After the grace period: how long the handlers that were just failed get to
// send their status before gRPC cancels whatever still runs.
constexpr absl::Duration kCancelDelay = absl::Seconds(1);

// What to do about an address that cannot be bound, per flag.
constexpr const char* kListenHint =
    "pass --listen=HOST:PORT; port 0 picks a free one, which --port_file "
    "reports";
constexpr const char* kMetricsListenHint =
    "pass --metrics_listen=HOST:PORT, port 0 picks a free one, or an empty "
    "value to disable metrics";

// UNAVAILABLE "<what> <address>: <reason> (<hint>)", the hint led by "another
// depot-server?" when the address is in use (ProbeBind's UNAVAILABLE).
absl::Status BindError(absl::string_view what, absl::string_view address,
                       const absl::Status& reason, absl::string_view hint) {
  return absl::UnavailableError(absl::StrCat(
      what, " ", address, ": ", reason.message(), " (",
      absl::IsUnavailable(reason) ? "another depot-server? " : "", hint, ")"));
}

void LogLine(const std::string& line) {
  std::fprintf(stderr, "depot-server: %s\n", line.c_str());
}

// The contents of the PEM file that flag `flag` names. NOT_FOUND when it
// cannot be read, INVALID_ARGUMENT when it holds no PEM block.
absl::StatusOr<std::string> ReadPemFile(absl::string_view flag,
                                        const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("--", flag, " ", path, ": cannot read it"));
  }
  std::stringstream contents;
  contents << in.rdbuf();
  if (contents.str().find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", path, ": not a PEM file"));
  }
  return contents.str();
}

// The credentials the gRPC port listens with: TLS (mTLS with a client CA)
// when --tls_cert is set, else plaintext.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ListenCredentials(
    const ServerOptions& options) {
  if (options.tls_cert.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(
      GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  absl::StatusOr<std::string> cert = ReadPemFile("tls_cert", options.tls_cert);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPemFile("tls_key", options.tls_key);
  if (!key.ok()) return key.status();
  ssl.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  if (!options.tls_client_ca.empty()) {
    absl::StatusOr<std::string> ca =
        ReadPemFile("tls_client_ca", options.tls_client_ca);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
    // Requested, and verified when presented, but not required by the
    // handshake: the health service stays open to a caller without one, and
    // a Depot RPC without one ends UNAUTHENTICATED (TenantAuth).
    ssl.client_certificate_request =
        GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

DepotDaemon::DepotDaemon(const ServerOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<DepotDaemon>> DepotDaemon::Start(
    const ServerOptions& options) {
  // Both addresses are probed before anything starts, so that a bad one
  // fails fast (stopping a started metrics endpoint takes seconds).
  absl::StatusOr<HostPort> metrics_at;
  if (!options.metrics_listen.empty()) {
    metrics_at = ParseHostPort(options.metrics_listen);
    if (!metrics_at.ok()) return metrics_at.status();
    if (absl::Status probe = ProbeBind(*metrics_at); !probe.ok()) {
      return BindError("cannot serve metrics on", options.metrics_listen, probe,
                       kMetricsListenHint);
    }
  }
  absl::StatusOr<HostPort> listen = ParseHostPort(options.listen);
  if (!listen.ok()) return listen.status();
  // Also spares the log the multi-line error of gRPC's own failed bind.
  if (absl::Status probe = ProbeBind(*listen); !probe.ok()) {
    return BindError("cannot listen on", options.listen, probe, kListenHint);
  }

  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      ListenCredentials(options);
  if (!credentials.ok()) return credentials.status();
  absl::StatusOr<std::unique_ptr<TenantAuth>> auth = TenantAuth::Create(
      options.auth_token_file, !options.tls_client_ca.empty());
  if (!auth.ok()) return auth.status();

  std::unique_ptr<DepotDaemon> daemon(new DepotDaemon(options));
  daemon->auth_ = *std::move(auth);
  daemon->registry_ = std::make_shared<prometheus::Registry>();
  daemon->metrics_ = std::make_unique<ServerMetrics>(*daemon->registry_);
  daemon->pool_ =
      std::make_unique<ThreadPool>(options.threads, options.pin_threads);
  daemon->metrics_->checkpoint_every_steps.Set(
      static_cast<double>(options.checkpoint_every_steps));
  daemon->payloads_ = PayloadPool::Create(JobStore::kPayloadPoolFreeBytes);
  daemon->jobs_ = std::make_unique<JobStore>(
      options.memory_limit_bytes, daemon->pool_.get(), daemon->metrics_.get(),
      options.bench_noop_update, daemon->payloads_);
  if (!options.checkpoint_dir.empty()) {
    absl::StatusOr<std::unique_ptr<CheckpointDirectory>> dir =
        CheckpointDirectory::Open(options.checkpoint_dir);
    if (!dir.ok()) return dir.status();
    daemon->checkpoint_dir_ = *std::move(dir);
    CheckpointPolicy policy;
    policy.every_steps = options.checkpoint_every_steps;
    policy.keep = options.checkpoint_keep;
    policy.write_bytes_per_second = options.checkpoint_write_bytes_per_second;
    if (options.checkpoint_max_lag_steps >= 0) {
      policy.max_lag_steps =
          static_cast<uint64_t>(options.checkpoint_max_lag_steps);
    }
    daemon->checkpointer_ =
        std::make_unique<Checkpointer>(daemon->checkpoint_dir_.get(), policy,
                                       daemon->metrics_.get(), &LogLine);
    daemon->jobs_->SetListener(daemon->checkpointer_.get(), policy.every_steps);
    // Checkpoints of tenants' jobs written before job names were per tenant:
    // into their tenants' directories, so that they restore as theirs.
    if (absl::StatusOr<int> adopted =
            daemon->checkpoint_dir_->AdoptTenantsFile();
        !adopted.ok()) {
      LogLine(
          absl::StrCat("the tenants file of an older server was not "
                       "applied: ",
                       adopted.status().ToString()));
    } else if (*adopted > 0) {
      LogLine(absl::StrCat("moved ", *adopted,
                           " tenants' jobs into their tenants' directories "
                           "(the tenants file of an older server)"));
    }
    // Before serving: a client that finds the server up finds its jobs.
    RestoreJobs(*daemon->checkpoint_dir_, *daemon->jobs_, *daemon->metrics_,
                &LogLine);
  }
  if (!options.metrics_listen.empty()) {
    // civetweb reports a failed bind with words of its own: the probe above
    // names the usual reasons, this catches the rest (e.g. the port taken
    // since).
    StatusIdentity identity;
    identity.listen = options.listen;
    identity.checkpoint_dir = options.checkpoint_dir;
    identity.threads = daemon->pool_->num_threads();
    absl::StatusOr<std::unique_ptr<StatusEndpoint>> status =
        StatusEndpoint::Start(options.metrics_listen, daemon->registry_,
                              daemon->metrics_.get(), daemon->jobs_.get(),
                              std::move(identity));
    if (!status.ok()) {
      return BindError("cannot serve metrics on", options.metrics_listen,
                       status.status(), kMetricsListenHint);
    }
    daemon->status_ = *std::move(status);
    daemon->metrics_address_ = FormatHostPort(
        metrics_at->host, daemon->status_->port() != 0
                              ? daemon->status_->port()
                              : metrics_at->port);
  }
  daemon->service_ = std::make_unique<DepotService>(
      daemon->jobs_.get(), daemon->metrics_.get(), daemon->checkpointer_.get(),
      daemon->auth_.get(), options.max_handler_threads);
  DepotService::AdminHooks admin;
  admin.admin_tenants = options.admin_tenants;
  admin.request_shutdown = options.request_shutdown;
  admin.set_serving = [daemon = daemon.get()](bool serving) {
    // Before BuildAndStart nothing can call Drain, so server_ is set. Only
    // the Depot service: "" says the process is alive, and a liveness probe
    // on it must not restart a drained server (deploy/kubernetes).
    daemon->server_->GetHealthCheckService()->SetServingStatus(kServiceName,
                                                               serving);
  };
  daemon->service_->SetAdminHooks(std::move(admin));
  // --import_roots, else the server's own checkpoint directory.
  std::vector<std::string> roots = options.import_roots;
  if (roots.empty() && !options.checkpoint_dir.empty()) {
    roots.push_back(options.checkpoint_dir);
  }
  absl::StatusOr<ImportRoots> import_roots = ImportRoots::Create(roots);
  if (!import_roots.ok()) return import_roots.status();
  daemon->service_->set_import_roots(*std::move(import_roots));
  if (options.stalled_step_threshold > absl::ZeroDuration()) {
    daemon->stall_monitor_ = std::make_unique<StallMonitor>(
        daemon->jobs_.get(), daemon->metrics_.get(),
        options.stalled_step_threshold, &LogLine);
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, *credentials, &port);
  // Without this, a second server on the same fixed port would silently share
  // it (gRPC sets SO_REUSEPORT by default on Linux).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Frame size and flow control for bulk chunks (docs/protocol.md, Transport).
  ApplyServerTransportArgs(builder);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.RegisterCallbackGenericService(daemon->service_.get());
  daemon->server_ = builder.BuildAndStart();
  if (daemon->server_ == nullptr || port == 0) {
    daemon->server_.reset();
    return BindError("cannot listen on", options.listen,
                     absl::UnknownError("gRPC could not bind it"), kListenHint);
  }
  daemon->address_ = FormatHostPort(listen->host, port);
  if (daemon->status_ != nullptr) daemon->status_->set_listen(daemon->address_);
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
  const absl::Time deadline = absl::Now() + options_.shutdown_grace;
  // Rejecting first: a client that sees NOT_SERVING finds new RPCs refused.
  service_->StopAcceptingRpcs();
  server_->GetHealthCheckService()->SetServingStatus(false);
  const DepotService::RpcsInFlight in_flight = service_->InFlight();
  const int checkpoint_tasks =
      checkpointer_ != nullptr ? checkpointer_->Pending() : 0;
  LogLine(absl::StrFormat(
      "draining: new RPCs are refused; waiting up to %s for %d Step "
      "stream(s), %d other RPC(s) and %d checkpoint task(s)",
      absl::FormatDuration(options_.shutdown_grace), in_flight.step_streams,
      in_flight.others, checkpoint_tasks));
  // A Checkpoint RPC waits for its write, so the RPCs first; then the
  // periodic writes, which include those of steps that ended meanwhile.
  bool drained = service_->WaitForRpcs(deadline);
  if (checkpointer_ != nullptr) {
    drained = checkpointer_->FlushUntil(deadline) && drained;
  }
  if (!drained) {
    const DepotService::RpcsInFlight left = service_->InFlight();
    LogLine(absl::StrFormat(
        "grace period over: ending %d Step stream(s) and %d other RPC(s) "
        "with UNAVAILABLE, abandoning %d checkpoint task(s)",
        left.step_streams, left.others,
        checkpointer_ != nullptr ? checkpointer_->Pending() : 0));
  }
  // From here on nothing waits for a client, a worker or the disk: what
  // still runs ends at its next message or piece of file.
  service_->EndRpcs();
  if (checkpointer_ != nullptr) checkpointer_->Abandon();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + kCancelDelay));
  server_->Wait();
  if (stall_monitor_ != nullptr) stall_monitor_->Stop();
  pool_.reset();
  if (checkpointer_ != nullptr) checkpointer_->Stop();
  status_.reset();
}

}  // namespace depot
