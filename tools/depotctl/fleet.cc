#include "tools/depotctl/fleet.h"

#include <algorithm>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "channel_credentials.h"
#include "wire/wire.h"

namespace depot::ctl {

absl::StatusOr<Fleet> Fleet::Connect(const std::vector<std::string>& addresses,
                                     const ClientOptions& security,
                                     absl::Duration timeout) {
  if (addresses.empty()) {
    return absl::InvalidArgumentError(
        "no server: give --servers=HOST:PORT,... (or set DEPOT_SERVERS)");
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      client_internal::MakeChannelCredentials(security);
  if (!credentials.ok()) return credentials.status();
  Fleet fleet;
  fleet.timeout_ = timeout;
  for (const std::string& address : addresses) {
    if (absl::Status s = client_internal::ValidateServerAddress(address);
        !s.ok()) {
      return s;
    }
    fleet.servers_.push_back(
        client_internal::Connect(address, /*connections=*/1, *credentials));
  }
  return fleet;
}

std::unique_ptr<grpc::ClientContext> Fleet::NewContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  client_internal::SetDeadline(context.get(), absl::Now() + timeout_);
  return context;
}

void Fleet::ForEach(const std::function<void(size_t)>& call) const {
  std::vector<std::thread> threads;
  threads.reserve(servers_.size());
  for (size_t i = 0; i < servers_.size(); ++i) threads.emplace_back(call, i);
  for (std::thread& thread : threads) thread.join();
}

std::vector<ServerReading> ReadStatus(const Fleet& fleet) {
  std::vector<ServerReading> readings(fleet.size());
  fleet.ForEach([&](size_t i) {
    readings[i].address = fleet.address(i);
    std::unique_ptr<grpc::ClientContext> context = fleet.NewContext();
    readings[i].status = client_internal::WithServer(
        FromGrpcStatus(fleet.stub(i).ServerStatus(
            context.get(), v1::ServerStatusRequest(), &readings[i].response)),
        fleet.address(i));
  });
  return readings;
}

std::vector<FleetJob> GroupJobs(const std::vector<ServerReading>& readings,
                                bool own_only) {
  std::map<std::pair<std::string, std::string>, FleetJob> jobs;
  for (size_t i = 0; i < readings.size(); ++i) {
    if (!readings[i].status.ok()) continue;
    const v1::ServerStatusResponse& response = readings[i].response;
    for (const v1::JobSummary& job : response.jobs()) {
      // An admin sees every tenant's jobs, each with its tenant; anyone
      // else only its own, without one.
      const bool own =
          !response.all_tenants() || job.tenant() == response.caller_tenant();
      if (own_only && !own) continue;
      FleetJob& grouped = jobs[{job.name(), job.tenant()}];
      grouped.name = job.name();
      grouped.tenant = job.tenant();
      grouped.own = own;
      grouped.num_servers = job.num_servers();
      grouped.shards.push_back({i, job});
    }
  }
  std::vector<FleetJob> out;
  for (auto& [name, job] : jobs) {
    std::sort(job.shards.begin(), job.shards.end(),
              [](const FleetJob::Shard& a, const FleetJob::Shard& b) {
                return a.job.server_index() < b.job.server_index();
              });
    out.push_back(std::move(job));
  }
  return out;
}

absl::StatusOr<FleetJob> FindJob(const std::vector<ServerReading>& readings,
                                 const std::string& name) {
  for (FleetJob& job : GroupJobs(readings, /*own_only=*/true)) {
    if (job.name == name) return std::move(job);
  }
  return absl::NotFoundError(absl::StrCat(
      "no server that answered holds a job named \"", name,
      "\" (or it is another tenant's; `depotctl jobs` lists yours)"));
}

}  // namespace depot::ctl
