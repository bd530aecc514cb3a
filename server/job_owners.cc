#include "server/job_owners.h"

#include "absl/strings/str_cat.h"
#include "server/tenant_auth.h"

namespace depot {

absl::Status JobOwners::ClaimName(const std::string& tenant,
                                  const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = names_.try_emplace(name);
  NameClaim& claim = it->second;
  if (inserted) {
    claim.tenant = tenant;
  } else if (claim.tenant != tenant) {
    return absl::AlreadyExistsError(absl::StrCat(
        "the job name \"", name,
        "\" is taken on this server by another tenant; choose another name"));
  }
  ++claim.pending;
  return absl::OkStatus();
}

void JobOwners::Established(const std::string& tenant, const std::string& name,
                            uint64_t job_id) {
  absl::MutexLock lock(&mu_);
  NameClaim& claim = names_[name];
  claim.tenant = tenant;
  if (claim.pending > 0) --claim.pending;
  claim.held = true;
  owners_[job_id] = tenant;
}

void JobOwners::Abandoned(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = names_.find(name);
  if (it == names_.end()) return;
  if (it->second.pending > 0) --it->second.pending;
  if (it->second.pending == 0 && !it->second.held) names_.erase(it);
}

void JobOwners::AddRestored(const std::string& name, uint64_t job_id) {
  absl::MutexLock lock(&mu_);
  NameClaim& claim = names_[name];
  claim.tenant = kImplicitTenant;
  claim.held = true;
  owners_[job_id] = kImplicitTenant;
}

void JobOwners::Removed(const std::string& name, uint64_t job_id) {
  absl::MutexLock lock(&mu_);
  owners_.erase(job_id);
  auto it = names_.find(name);
  if (it == names_.end()) return;
  it->second.held = false;
  if (it->second.pending == 0) names_.erase(it);
}

bool JobOwners::Owns(const std::string& tenant, uint64_t job_id) const {
  absl::MutexLock lock(&mu_);
  const auto it = owners_.find(job_id);
  return tenant ==
         (it == owners_.end() ? std::string(kImplicitTenant) : it->second);
}

}  // namespace depot
