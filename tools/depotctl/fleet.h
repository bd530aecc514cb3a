// Fleet: depotctl's connections to a set of depot-servers, and what it reads
// from all of them at once — each server's ServerStatus, and a job as the
// servers hold it (every server keeps its own id for a job; the name is what
// they share).
#ifndef DEPOT_TOOLS_DEPOTCTL_FLEET_H_
#define DEPOT_TOOLS_DEPOTCTL_FLEET_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "channel.h"
#include "depot/client.h"
#include "depot/v1/depot.grpc.pb.h"

namespace depot::ctl {

class Fleet {
 public:
  // Opens a channel to each address (host:port), with the security that
  // `security`'s tls_* and auth_token* fields describe (ClientOptions).
  // INVALID_ARGUMENT for a bad address or bad security options. Does not
  // wait for the servers.
  static absl::StatusOr<Fleet> Connect(const std::vector<std::string>& addresses,
                                       const ClientOptions& security,
                                       absl::Duration timeout);

  size_t size() const { return servers_.size(); }
  const std::string& address(size_t i) const { return servers_[i]->address; }
  v1::Depot::Stub& stub(size_t i) const { return *servers_[i]->depot; }
  // A context whose deadline is the command's timeout from now.
  std::unique_ptr<grpc::ClientContext> NewContext() const;

  // Runs `call(i)` for every server at once and waits for all.
  void ForEach(const std::function<void(size_t)>& call) const;

 private:
  std::vector<std::unique_ptr<client_internal::ServerConnection>> servers_;
  absl::Duration timeout_;
};

// One server's ServerStatus, or why it could not be read (the status names
// the server's address).
struct ServerReading {
  std::string address;
  absl::Status status;
  v1::ServerStatusResponse response;
};

std::vector<ServerReading> ReadStatus(const Fleet& fleet);

// A job as the fleet holds it: each server that holds it (its index in the
// fleet) with the job there.
struct FleetJob {
  std::string name;
  // The owner, as ServerStatus tells an admin caller (else ""): job names
  // are per tenant, so two tenants' jobs of one name are two FleetJobs.
  std::string tenant;
  // The caller's own job (the only kind it can act on).
  bool own = true;
  struct Shard {
    size_t server = 0;
    v1::JobSummary job;
  };
  std::vector<Shard> shards;  // in server_index order
  uint32_t num_servers = 0;   // as the job's config says
};

// Every job the readings hold (only the caller's own with `own_only`), by
// name and tenant, sorted.
std::vector<FleetJob> GroupJobs(const std::vector<ServerReading>& readings,
                                bool own_only = false);

// The caller's own job named `name` in `readings`. NOT_FOUND when no server
// that answered holds it.
absl::StatusOr<FleetJob> FindJob(const std::vector<ServerReading>& readings,
                                 const std::string& name);

}  // namespace depot::ctl

#endif  // DEPOT_TOOLS_DEPOTCTL_FLEET_H_
