#include "server/job_owners.h"

#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/durable_file.h"
#include "server/tenant_auth.h"

namespace depot {

std::string EncodeTenantsFile(
    const std::map<std::string, std::string>& tenants) {
  std::string text =
      "# depot-server: the tenant of each job, \"TENANT HEX(JOB NAME)\"\n";
  for (const auto& [name, tenant] : tenants) {
    absl::StrAppend(&text, tenant, " ", absl::BytesToHexString(name), "\n");
  }
  return text;
}

absl::StatusOr<std::map<std::string, std::string>> DecodeTenantsFile(
    absl::string_view text) {
  std::map<std::string, std::string> tenants;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (line.empty() || line.front() == '#') continue;
    const std::vector<absl::string_view> fields = absl::StrSplit(line, ' ');
    const bool hex = fields.size() == 2 && !fields[1].empty() &&
                     fields[1].size() % 2 == 0 &&
                     fields[1].find_first_not_of("0123456789abcdef") ==
                         absl::string_view::npos;
    if (!hex || fields[0].empty()) {
      return absl::DataLossError(
          absl::StrCat("line ", line_number, " is not \"TENANT HEX(NAME)\""));
    }
    tenants[absl::HexStringToBytes(fields[1])] = std::string(fields[0]);
  }
  return tenants;
}

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

absl::Status JobOwners::Established(const std::string& tenant,
                                    const std::string& name, uint64_t job_id) {
  bool changed = false;
  {
    absl::MutexLock lock(&mu_);
    NameClaim& claim = names_[name];
    changed = !claim.held && tenant != kImplicitTenant;
    claim.tenant = tenant;
    if (claim.pending > 0) --claim.pending;
    claim.held = true;
    owners_[job_id] = tenant;
  }
  return changed ? WriteTenantsFile() : absl::OkStatus();
}

void JobOwners::Abandoned(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = names_.find(name);
  if (it == names_.end()) return;
  if (it->second.pending > 0) --it->second.pending;
  if (it->second.pending == 0 && !it->second.held) names_.erase(it);
}

absl::Status JobOwners::AddRestored(
    const std::vector<std::pair<std::string, uint64_t>>& jobs) {
  std::map<std::string, std::string> persisted;
  absl::Status read = absl::OkStatus();
  if (!tenants_file_.empty()) {
    std::ifstream in(tenants_file_);
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      absl::StatusOr<std::map<std::string, std::string>> decoded =
          DecodeTenantsFile(text.str());
      if (decoded.ok()) {
        persisted = *std::move(decoded);
      } else {
        read = absl::DataLossError(
            absl::StrCat(tenants_file_, ": ", decoded.status().message(),
                         "; every restored job is the implicit tenant's"));
      }
    }
  }
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, job_id] : jobs) {
      const auto found = persisted.find(name);
      const std::string tenant = found == persisted.end()
                                     ? std::string(kImplicitTenant)
                                     : found->second;
      NameClaim& claim = names_[name];
      claim.tenant = tenant;
      claim.held = true;
      owners_[job_id] = tenant;
    }
  }
  if (!read.ok()) return read;
  // Forgets the jobs that were not restored (deleted, or never checkpointed).
  return tenants_file_.empty() ? absl::OkStatus() : WriteTenantsFile();
}

absl::Status JobOwners::Removed(const std::string& name, uint64_t job_id) {
  bool changed = false;
  {
    absl::MutexLock lock(&mu_);
    owners_.erase(job_id);
    auto it = names_.find(name);
    if (it == names_.end()) return absl::OkStatus();
    changed = it->second.tenant != kImplicitTenant;
    it->second.held = false;
    if (it->second.pending == 0) names_.erase(it);
  }
  return changed ? WriteTenantsFile() : absl::OkStatus();
}

bool JobOwners::Owns(const std::string& tenant, uint64_t job_id) const {
  return tenant == OwnerOf(job_id);
}

std::string JobOwners::OwnerOf(uint64_t job_id) const {
  absl::MutexLock lock(&mu_);
  const auto it = owners_.find(job_id);
  return it == owners_.end() ? std::string(kImplicitTenant) : it->second;
}

absl::Status JobOwners::WriteTenantsFile() {
  if (tenants_file_.empty()) return absl::OkStatus();
  absl::MutexLock write_lock(&write_mu_);
  std::map<std::string, std::string> tenants;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, claim] : names_) {
      if (claim.held && claim.tenant != kImplicitTenant) {
        tenants[name] = claim.tenant;
      }
    }
  }
  const std::string text = EncodeTenantsFile(tenants);
  return WriteFileDurably(
      tenants_file_,
      [&](const std::function<absl::Status(std::string_view)>& sink) {
        return sink(text);
      },
      SystemFileSync());
}

}  // namespace depot
