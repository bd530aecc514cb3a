// JobKey: how a server tells its jobs apart: the tenant that owns the job
// and the name its config gives it. Job names are per tenant
// (docs/security.md): tenants alpha and beta may each hold a job "gpt", and
// they are two jobs that know nothing of each other. The job store, the
// checkpoint directory and the checkpointer key jobs by it.
#ifndef DEPOT_SERVER_JOB_KEY_H_
#define DEPOT_SERVER_JOB_KEY_H_

#include <cstdint>
#include <string>
#include <tuple>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace depot {

struct JobKey {
  // The owner (tenant_auth.h); "" is the implicit tenant of a server
  // without authentication.
  std::string tenant;
  std::string name;  // JobConfig::name

  friend bool operator<(const JobKey& a, const JobKey& b) {
    return std::tie(a.tenant, a.name) < std::tie(b.tenant, b.name);
  }
  friend bool operator==(const JobKey& a, const JobKey& b) {
    return a.tenant == b.tenant && a.name == b.name;
  }
  friend bool operator!=(const JobKey& a, const JobKey& b) { return !(a == b); }
};

// For log lines: " of tenant \"TENANT\"" (C-escaped), or "" for the
// implicit tenant.
inline std::string OfTenant(const std::string& tenant) {
  if (tenant.empty()) return "";
  return absl::StrCat(" of tenant \"", absl::CHexEscape(tenant), "\"");
}

// For log lines: job "NAME" (C-escaped) and OfTenant; with an id, job ID
// "NAME" and OfTenant.
inline std::string Describe(const JobKey& key) {
  return absl::StrCat("job \"", absl::CHexEscape(key.name), "\"",
                      OfTenant(key.tenant));
}
inline std::string Describe(const JobKey& key, uint64_t job_id) {
  return absl::StrCat("job ", job_id, " \"", absl::CHexEscape(key.name), "\"",
                      OfTenant(key.tenant));
}

}  // namespace depot

#endif  // DEPOT_SERVER_JOB_KEY_H_
