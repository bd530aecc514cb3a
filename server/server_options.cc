#include "server/server_options.h"

#include <unistd.h>

#include <algorithm>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace depot {
namespace {

// Share of physical RAM that job state may use when no limit is given: the rest
// is left to in-flight payloads, gRPC and the system.
constexpr double kDefaultMemoryFraction = 0.8;

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

}  // namespace

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
    options.memory_limit_bytes = static_cast<uint64_t>(
        static_cast<double>(PhysicalMemoryBytes()) * kDefaultMemoryFraction);
    if (options.memory_limit_bytes == 0) {
      return absl::InvalidArgumentError(
          "--memory_limit_bytes: cannot read this machine's physical memory; "
          "give the limit explicitly");
    }
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
  if (options.checkpoint_keep < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--checkpoint_keep must be >= 1, got ", options.checkpoint_keep));
  }
  return options;
}

}  // namespace depot
