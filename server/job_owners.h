// JobOwners: which tenant owns each job, and which tenant holds each job name
// (docs/security.md). A job belongs to the tenant that created it. With a
// tenants file (`<--checkpoint_dir>/tenants`), the tenant of every job that is
// not the implicit tenant's is written there, durably, when the job is
// created, so that a restarted server gives the jobs it restores from their
// checkpoints back to their tenants; a restored job the file does not name
// belongs to the implicit tenant (tenant_auth.h), which no authenticated
// caller is.
//
// Job names are server-wide (the job store and the checkpoint directory key
// jobs by name), so a tenant that asks for a name another tenant holds is
// refused; the refusal tells it that the name is taken and nothing else.
//
// Thread safety: all methods may be called concurrently.
#ifndef DEPOT_SERVER_JOB_OWNERS_H_
#define DEPOT_SERVER_JOB_OWNERS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace depot {

class JobOwners {
 public:
  // `tenants_file` empty: owners are kept in memory only.
  explicit JobOwners(std::string tenants_file = "")
      : tenants_file_(std::move(tenants_file)) {}

  // Claims `name` for `tenant` before a CreateJob creates or attaches to the
  // job of that name; every successful claim is followed by exactly one
  // Established or Abandoned. ALREADY_EXISTS when another tenant holds the
  // name.
  absl::Status ClaimName(const std::string& tenant, const std::string& name);
  // The claimed job exists: `job_id` and `name` belong to `tenant`. Returns
  // the error of writing the tenants file (the job is established anyway; a
  // restart would give it to the implicit tenant).
  absl::Status Established(const std::string& tenant, const std::string& name,
                           uint64_t job_id);
  // The claimed creation failed; the name is released unless a job holds it
  // or another claim is pending.
  void Abandoned(const std::string& name);
  // The jobs the server holds before serving (restored from its
  // checkpoints), (name, id) each: each is the tenant's that the tenants file
  // names for it, else the implicit tenant's; the file then keeps only these
  // jobs. Returns the error of reading or writing the file (the jobs it
  // could not name are the implicit tenant's).
  absl::Status AddRestored(
      const std::vector<std::pair<std::string, uint64_t>>& jobs);
  // The job was deleted: its id and name belong to no one. Returns the error
  // of writing the tenants file.
  absl::Status Removed(const std::string& name, uint64_t job_id);

  // True when `tenant` owns job `job_id`. A job never Established (restored
  // at start-up, or a creation still under way) is the implicit tenant's.
  bool Owns(const std::string& tenant, uint64_t job_id) const;
  // The tenant that owns job `job_id` (as Owns decides it).
  std::string OwnerOf(uint64_t job_id) const;

 private:
  struct NameClaim {
    std::string tenant;
    int pending = 0;    // ClaimName calls not yet Established or Abandoned
    bool held = false;  // a job of this name exists
  };

  // Writes the tenants file from names_ (held names of tenants other than
  // the implicit one). Under write_mu_, so that the last write has the
  // newest state; mu_ is held only to copy it.
  absl::Status WriteTenantsFile() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string tenants_file_;
  absl::Mutex write_mu_;
  mutable absl::Mutex mu_;
  std::map<std::string, NameClaim> names_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::string> owners_ ABSL_GUARDED_BY(mu_);
};

// The tenants file's text for (job name, tenant) pairs, and back: a line
// "TENANT HEX(NAME)" each. DATA_LOSS for a line that does not parse.
std::string EncodeTenantsFile(
    const std::map<std::string, std::string>& tenants);
absl::StatusOr<std::map<std::string, std::string>> DecodeTenantsFile(
    absl::string_view text);

}  // namespace depot

#endif  // DEPOT_SERVER_JOB_OWNERS_H_
