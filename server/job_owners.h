// JobOwners: which tenant owns each job, and which tenant holds each job name
// (docs/security.md, "Tenancy"). A job belongs to the tenant that created it;
// a job this server restored from its checkpoints belongs to the implicit
// tenant (tenant_auth.h), which no authenticated caller is.
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

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace depot {

class JobOwners {
 public:
  // Claims `name` for `tenant` before a CreateJob creates or attaches to the
  // job of that name; every successful claim is followed by exactly one
  // Established or Abandoned. ALREADY_EXISTS when another tenant holds the
  // name.
  absl::Status ClaimName(const std::string& tenant, const std::string& name);
  // The claimed job exists: `job_id` and `name` belong to `tenant`.
  void Established(const std::string& tenant, const std::string& name,
                   uint64_t job_id);
  // The claimed creation failed; the name is released unless a job holds it
  // or another claim is pending.
  void Abandoned(const std::string& name);
  // A job the server holds before serving (restored from its checkpoints):
  // it and its name are the implicit tenant's.
  void AddRestored(const std::string& name, uint64_t job_id);
  // The job was deleted: its id and name belong to no one.
  void Removed(const std::string& name, uint64_t job_id);

  // True when `tenant` owns job `job_id`. A job never Established (restored
  // at start-up, or a creation still under way) is the implicit tenant's.
  bool Owns(const std::string& tenant, uint64_t job_id) const;

 private:
  struct NameClaim {
    std::string tenant;
    int pending = 0;    // ClaimName calls not yet Established or Abandoned
    bool held = false;  // a job of this name exists
  };

  mutable absl::Mutex mu_;
  std::map<std::string, NameClaim> names_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::string> owners_ ABSL_GUARDED_BY(mu_);
};

}  // namespace depot

#endif  // DEPOT_SERVER_JOB_OWNERS_H_
