// depot::Client over gRPC: connection setup, the health wait and OpenJob.
#include "depot/client.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "call_group.h"
#include "channel.h"
#include "channel_credentials.h"
#include "grpcpp/support/sync_stream.h"
#include "job_impl.h"
#include "wire/transport_memory.h"
#include "wire/wire.h"

namespace depot {
namespace client_internal {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// Waits until `connection` reports the Depot service SERVING. Check (waiting
// for the connection) answers at once when the server is already up; a server
// that is up but not yet serving is then followed with Watch, which pushes each
// change of its status, so nothing polls.
absl::Status WaitUntilServing(const ServerConnection& connection,
                              absl::Time deadline, absl::Duration timeout,
                              CallGroup& group) {
  HealthCheckRequest request;
  request.set_service(kDepotServiceName);
  HealthCheckResponse response;
  {
    GroupContext context(group, deadline);
    context.get()->set_wait_for_ready(true);
    const grpc::Status rpc =
        connection.health->Check(context.get(), request, &response);
    if (rpc.ok() && response.status() == HealthCheckResponse::SERVING) {
      return absl::OkStatus();
    }
    // NOT_FOUND: the service is not registered with the health service yet.
    if (!rpc.ok() && rpc.error_code() != grpc::StatusCode::NOT_FOUND) {
      return absl::UnavailableError(absl::StrCat("not reachable within ",
                                                 absl::FormatDuration(timeout),
                                                 ": ", rpc.error_message()));
    }
  }
  GroupContext context(group, deadline);
  context.get()->set_wait_for_ready(true);
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader =
      connection.health->Watch(context.get(), request);
  std::string last_status = "none";
  while (reader->Read(&response)) {
    if (response.status() == HealthCheckResponse::SERVING) {
      context.get()->TryCancel();  // the Watch would run until the deadline
      reader->Finish();
      return absl::OkStatus();
    }
    last_status = HealthCheckResponse::ServingStatus_Name(response.status());
  }
  const grpc::Status rpc = reader->Finish();
  return absl::UnavailableError(absl::StrCat(
      kDepotServiceName, " not SERVING within ", absl::FormatDuration(timeout),
      " (last health status ", last_status, "; ", rpc.error_message(), ")"));
}

// INVALID_ARGUMENT unless every chunk message fits gRPC's message limit.
absl::Status ValidateChunkSize(const JobConfig& config) {
  const size_t elem_bytes =
      std::max(DTypeSize(config.grad_dtype), DTypeSize(config.weight_dtype));
  const uint64_t max_elems =
      (kMaxMessageBytes - kMessageOverheadBytes) / elem_bytes;
  if (config.chunk_elems > max_elems) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_elems ", config.chunk_elems,
                     " makes chunk messages larger than ", kMaxMessageBytes,
                     " bytes; use at most ", max_elems));
  }
  return absl::OkStatus();
}

// FAILED_PRECONDITION unless the server's answer describes the job and shard
// that the client computed: both sides must cut the flat space the same way.
absl::Status CheckCreated(const v1::CreateJobResponse& response,
                          uint64_t fingerprint, const ShardRange& shard) {
  if (response.fingerprint() != fingerprint) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "job fingerprint %#x differs from the client's %#x: client and server "
        "encode the job differently (version mismatch?)",
        response.fingerprint(), fingerprint));
  }
  if (response.shard_begin() != shard.begin ||
      response.shard_end() != shard.end ||
      response.first_chunk() != shard.first_chunk ||
      response.end_chunk() != shard.end_chunk) {
    return absl::FailedPreconditionError(absl::StrCat(
        "server holds elements [", response.shard_begin(), ", ",
        response.shard_end(), ") chunks [", response.first_chunk(), ", ",
        response.end_chunk(), "), the client's shard plan says [", shard.begin,
        ", ", shard.end, ") chunks [", shard.first_chunk, ", ", shard.end_chunk,
        ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CreatedJob> CreateJobOnServers(const Connections& connections,
                                              const JobConfig& config,
                                              uint64_t fingerprint,
                                              const ShardPlan& plan,
                                              absl::Time deadline) {
  v1::CreateJobRequest request;
  JobConfigToProto(config, request.mutable_spec());
  CreatedJob job;
  job.ids.assign(connections.size(), 0);
  job.created.assign(connections.size(), 0);
  absl::Status status = RunOnServers(
      connections, AllServers(connections.size()),
      [&](uint32_t server, CallGroup& group) {
        GroupContext context(group, deadline);
        v1::CreateJobRequest server_request = request;
        server_request.set_server_index(server);
        v1::CreateJobResponse response;
        const grpc::Status rpc = connections[server]->depot->CreateJob(
            context.get(), server_request, &response);
        if (!rpc.ok()) return FromGrpcStatus(rpc);
        absl::Status checked =
            CheckCreated(response, fingerprint, plan.shard(server));
        if (!checked.ok()) return checked;
        job.ids[server] = response.job_id();
        job.created[server] = response.created();
        return absl::OkStatus();
      });
  if (!status.ok()) return status;
  return job;
}

namespace {

class ClientImpl : public Client {
 public:
  ClientImpl(ClientOptions options,
             std::shared_ptr<const Connections> connections)
      : Client(std::move(options)), connections_(std::move(connections)) {}

  absl::Status WaitForServers(absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    return RunOnServers(*connections_, AllServers(connections_->size()),
                        [&](uint32_t server, CallGroup& group) {
                          const ServerConnection& connection =
                              *(*connections_)[server];
                          absl::Status serving = WaitUntilServing(
                              connection, deadline, timeout, group);
                          // The step connections too, not only the first.
                          if (serving.ok()) {
                            for (const auto& step : connection.step_channels) {
                              step->AwaitSettled(deadline);
                            }
                          }
                          return serving;
                        });
  }

  absl::StatusOr<std::unique_ptr<Job>> OpenJob(JobConfig config,
                                               uint32_t worker_rank) override {
    config.num_servers = static_cast<uint32_t>(connections_->size());
    absl::StatusOr<JobGeometry> geometry = MakeJobGeometry(config);
    if (!geometry.ok()) return geometry.status();
    if (worker_rank >= config.num_workers) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker_rank ", worker_rank,
                       " is not below num_workers ", config.num_workers));
    }
    if (absl::Status valid = ValidateChunkSize(config); !valid.ok()) {
      return valid;
    }
    const ShardPlan& plan = geometry->plan;
    const uint64_t fingerprint = Fingerprint(config);

    absl::StatusOr<CreatedJob> created =
        CreateJobOnServers(*connections_, config, fingerprint, plan,
                           absl::Now() + options().rpc_timeout);
    if (!created.ok()) return created.status();
    return std::make_unique<JobImpl>(
        std::move(config), std::move(geometry->layout),
        std::move(geometry->plan), fingerprint, worker_rank, connections_,
        options(), std::move(created->ids));
  }

 private:
  std::shared_ptr<const Connections> connections_;
};

absl::Status ValidateOptions(const ClientOptions& options) {
  if (options.servers.empty()) {
    return absl::InvalidArgumentError("ClientOptions.servers is empty");
  }
  for (const std::string& address : options.servers) {
    absl::Status valid = ValidateServerAddress(address);
    if (!valid.ok()) return valid;
  }
  if (options.rpc_timeout <= absl::ZeroDuration() ||
      options.step_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "ClientOptions: rpc_timeout and step_timeout must be positive");
  }
  if (options.unavailable_retry < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "ClientOptions.unavailable_retry must not be negative");
  }
  if (options.max_inflight_chunks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.max_inflight_chunks is ",
                     options.max_inflight_chunks, ", must be at least 1"));
  }
  if (options.connections_per_server < 1 ||
      options.connections_per_server > kMaxConnectionsPerServer) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.connections_per_server is ",
                     options.connections_per_server, ", must be in [1, ",
                     kMaxConnectionsPerServer, "]"));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace client_internal

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  absl::Status valid = client_internal::ValidateOptions(options);
  if (!valid.ok()) return valid;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      client_internal::MakeChannelCredentials(options);
  if (!credentials.ok()) return credentials.status();
  if (options.retain_transport_buffers) RetainTransportBuffers();
  auto connections = std::make_shared<client_internal::Connections>();
  for (const std::string& address : options.servers) {
    connections->push_back(client_internal::Connect(
        address, options.connections_per_server, *credentials));
  }
  return std::make_unique<client_internal::ClientImpl>(std::move(options),
                                                       std::move(connections));
}

}  // namespace depot
