#include "server/server_options.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/tenant_auth.h"

namespace depot {
namespace {

// Share of physical RAM that job state may use when no limit is given: the rest
// is left to in-flight payloads, gRPC and the system.
constexpr double kDefaultMemoryFraction = 0.8;
// What the default budget leaves below a cgroup's memory limit, at least:
// gRPC, the binary, the pool's free buffers (and 1/8 of the limit if more).
constexpr uint64_t kCgroupMarginBytes = uint64_t{128} << 20;

uint64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

absl::Status CheckAddress(const char* flag, const std::string& address) {
  absl::StatusOr<HostPort> parsed = ParseHostPort(address);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": ", parsed.status().message()));
  }
  return absl::OkStatus();
}

// The whole (small) file, or nothing when it cannot be read.
std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// A limit file's value: bytes, or nothing for "max", an unreadable file or a
// value of at least 2^62 (v1 writes unlimited as 2^63 less a page).
std::optional<uint64_t> ReadLimitFile(const std::string& path) {
  const std::optional<std::string> text = ReadSmallFile(path);
  if (!text.has_value()) return std::nullopt;
  uint64_t value = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &value) ||
      value >= (uint64_t{1} << 62)) {
    return std::nullopt;
  }
  return value;
}

}  // namespace

std::optional<uint64_t> CgroupMemoryLimit(const std::string& proc_self_cgroup,
                                          const std::string& cgroup_root,
                                          std::string* path) {
  const std::optional<std::string> lines = ReadSmallFile(proc_self_cgroup);
  if (!lines.has_value()) return std::nullopt;
  for (absl::string_view line : absl::StrSplit(*lines, '\n')) {
    // "hierarchy-id:controllers:path"; the path may itself hold ':'.
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (fields.size() != 3) continue;
    std::vector<std::string> candidates;
    if (fields[0] == "0" && fields[1].empty()) {
      candidates = {absl::StrCat(cgroup_root, fields[2], "/memory.max"),
                    absl::StrCat(cgroup_root, "/memory.max")};
    } else {
      const std::vector<absl::string_view> controllers =
          absl::StrSplit(fields[1], ',');
      if (std::find(controllers.begin(), controllers.end(), "memory") ==
          controllers.end()) {
        continue;
      }
      const std::string hierarchy = absl::StrCat(cgroup_root, "/memory");
      candidates = {
          absl::StrCat(hierarchy, fields[2], "/memory.limit_in_bytes"),
          absl::StrCat(hierarchy, "/memory.limit_in_bytes")};
    }
    for (const std::string& candidate : candidates) {
      if (!ReadSmallFile(candidate).has_value()) continue;
      if (path != nullptr) *path = candidate;
      return ReadLimitFile(candidate);
    }
  }
  return std::nullopt;
}

absl::StatusOr<MemoryLimitDefault> DefaultMemoryLimit(
    uint64_t physical_bytes, const std::string& proc_self_cgroup,
    const std::string& cgroup_root) {
  MemoryLimitDefault result;
  if (physical_bytes > 0) {
    result.bytes = static_cast<uint64_t>(static_cast<double>(physical_bytes) *
                                         kDefaultMemoryFraction);
    result.source = absl::StrCat("80% of physical RAM (", physical_bytes,
                                 " bytes)");
  }
  std::string path;
  const std::optional<uint64_t> cgroup =
      CgroupMemoryLimit(proc_self_cgroup, cgroup_root, &path);
  if (cgroup.has_value()) {
    const uint64_t margin = std::max(kCgroupMarginBytes, *cgroup / 8);
    if (*cgroup <= margin) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--memory_limit_bytes: the cgroup's memory limit of ", *cgroup,
          " bytes (", path, ") leaves nothing after a margin of ", margin,
          " bytes for the server itself; raise it, or give the budget "
          "explicitly"));
    }
    if (result.bytes == 0 || *cgroup - margin < result.bytes) {
      result.bytes = *cgroup - margin;
      result.source = absl::StrCat("the cgroup's memory limit of ", *cgroup,
                                   " bytes (", path, ") less a margin of ",
                                   margin, " bytes");
    }
  }
  if (result.bytes == 0) {
    return absl::InvalidArgumentError(
        "--memory_limit_bytes: cannot read this machine's physical memory "
        "nor a cgroup memory limit; give the limit explicitly");
  }
  return result;
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", address, "\" is not a host:port address"));
  }
  HostPort result;
  result.host = std::string(address.substr(0, colon));
  const bool bracketed = result.host.front() == '[';
  if (bracketed != (result.host.back() == ']') ||
      (!bracketed && result.host.find(':') != std::string::npos)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", address,
        "\" is not a host:port address (write an IPv6 host as [host]:port)"));
  }
  const absl::string_view port = address.substr(colon + 1);
  if (port.empty() || port.find_first_not_of("0123456789") != port.npos ||
      !absl::SimpleAtoi(port, &result.port) || result.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", address, "\" has no valid port (expected 0 to 65535)"));
  }
  return result;
}

std::string FormatHostPort(absl::string_view host, int port) {
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<ServerOptions> ResolveServerOptions(ServerOptions options) {
  if (absl::Status s = CheckAddress("listen", options.listen); !s.ok()) {
    return s;
  }
  if (!options.metrics_listen.empty()) {
    if (absl::Status s = CheckAddress("metrics_listen", options.metrics_listen);
        !s.ok()) {
      return s;
    }
  }
  if (options.max_handler_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_handler_threads must be >= 1, got ",
                     options.max_handler_threads));
  }
  if (options.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--threads must be >= 0 (0: one per hardware thread), got ",
        options.threads));
  }
  if (options.threads == 0) {
    options.threads =
        std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }
  if (options.memory_limit_bytes == 0) {
    absl::StatusOr<MemoryLimitDefault> limit =
        DefaultMemoryLimit(PhysicalMemoryBytes());
    if (!limit.ok()) return limit.status();
    options.memory_limit_bytes = limit->bytes;
    options.memory_limit_source = limit->source;
  } else {
    options.memory_limit_source = "--memory_limit_bytes";
  }
  if (options.shutdown_grace < absl::ZeroDuration() ||
      options.shutdown_grace == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shutdown_grace_seconds must be finite and >= 0, got ",
                     absl::FormatDuration(options.shutdown_grace)));
  }
  if (options.stalled_step_threshold < absl::ZeroDuration() ||
      options.stalled_step_threshold == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stalled_step_seconds must be finite and >= 0 (0: no check), got ",
        absl::FormatDuration(options.stalled_step_threshold)));
  }
  if (options.checkpoint_every_steps > 0 && options.checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--checkpoint_every_steps=", options.checkpoint_every_steps,
        " needs --checkpoint_dir (where to write the checkpoints)"));
  }
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together: give both (TLS) or neither");
  }
  if (!options.tls_client_ca.empty() && options.tls_cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls_client_ca needs --tls_cert and --tls_key (client certificates "
        "are checked in the TLS handshake)");
  }
  if (!options.auth_token_file.empty() && options.tls_cert.empty()) {
    return absl::InvalidArgumentError(
        "--auth_token_file needs --tls_cert and --tls_key: tokens must not "
        "cross the network in clear text");
  }
  for (const std::string& tenant : options.admin_tenants) {
    if (!IsValidTenantName(tenant)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--admin_tenants: \"", absl::CHexEscape(tenant),
          "\" is not a tenant name (1 to 64 of [A-Za-z0-9_.-])"));
    }
  }
  if (!options.admin_tenants.empty() && options.auth_token_file.empty() &&
      options.tls_client_ca.empty()) {
    return absl::InvalidArgumentError(
        "--admin_tenants needs --auth_token_file or --tls_client_ca (without "
        "authentication every caller is an admin)");
  }
  if (options.checkpoint_max_lag_steps < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--checkpoint_max_lag_steps must be -1 (unlimited) or >= 0, got ",
        options.checkpoint_max_lag_steps));
  }
  if (options.checkpoint_max_lag_steps >= 0 &&
      options.checkpoint_every_steps == 0) {
    return absl::InvalidArgumentError(
        "--checkpoint_max_lag_steps needs --checkpoint_every_steps (it holds "
        "steps back behind the periodic checkpoints)");
  }
  if (options.checkpoint_keep < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--checkpoint_keep must be >= 1, got ", options.checkpoint_keep));
  }
  return options;
}

}  // namespace depot
