// ServerOptions: the daemon's configuration, as set by its flags (main.cc), and
// the checks and machine-dependent defaults applied to it.
#ifndef DEPOT_SERVER_SERVER_OPTIONS_H_
#define DEPOT_SERVER_SERVER_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/handler_threads.h"

namespace depot {

struct ServerOptions {
  // gRPC address, host:port; port 0 picks a free port.
  std::string listen = "127.0.0.1:50051";
  // When set, the bound addresses are written here once the server is up.
  std::string port_file;
  // Prometheus /metrics address, host:port (port 0 allowed); empty disables it.
  std::string metrics_listen = "127.0.0.1:9464";
  // Update thread pool size; 0 means the hardware concurrency.
  int threads = 0;
  // Pin update thread i to the i-th CPU of the process's affinity mask.
  bool pin_threads = true;
  // The most calls of methods other than Step served at once, each on a
  // thread of its own (server/handler_threads.h); >= 1.
  int max_handler_threads = HandlerThreads::kDefaultMaxThreads;
  // Budget for all the memory clients can make the server hold (docs/
  // protocol.md, "Memory"); 0: DefaultMemoryLimit's.
  uint64_t memory_limit_bytes = 0;
  // How memory_limit_bytes was chosen, for the log: "--memory_limit_bytes",
  // or DefaultMemoryLimit's `source`. Set by ResolveServerOptions.
  std::string memory_limit_source;
  // How long in-flight steps may run on after SIGTERM/SIGINT.
  absl::Duration shutdown_grace = absl::Seconds(10);
  // How long a step may wait for workers that sent nothing for some chunk
  // before the server logs it and counts it in its stalled-step metrics
  // (stall_monitor.h); zero turns the check off.
  absl::Duration stalled_step_threshold = absl::Seconds(30);
  // Where this server writes its jobs' checkpoints and restores them from
  // at start-up (docs/checkpoints.md); empty: no checkpoints. One directory
  // per server.
  std::string checkpoint_dir;
  // The directories (and their subdirectories) ImportCheckpoint may read
  // (import_roots.h); empty: checkpoint_dir alone, or none without it.
  std::vector<std::string> import_roots;
  // Checkpoint each job at every step that is a multiple of this; 0: never
  // (a set checkpoint_dir then only restores). Needs checkpoint_dir.
  uint64_t checkpoint_every_steps = 0;
  // Complete checkpoints kept per job, >= 1.
  int checkpoint_keep = 3;
  // --checkpoint_write_bytes_per_second: 0 unlimited.
  uint64_t checkpoint_write_bytes_per_second = 0;
  // --checkpoint_max_lag_steps: -1 unlimited; k >= 0: a step more than k
  // steps after a periodic checkpoint's step does not complete before that
  // checkpoint is written (CheckpointPolicy::max_lag_steps).
  int64_t checkpoint_max_lag_steps = -1;
  // TLS (docs/security.md): PEM files of the server's certificate chain and
  // private key; both or neither. Neither: plaintext gRPC.
  std::string tls_cert;
  std::string tls_key;
  // mTLS: PEM file of the CA(s) that sign client certificates. A Depot RPC
  // must then come with a certificate it signed; without a token file the
  // certificate's subject CN names the tenant. Needs tls_cert.
  std::string tls_client_ca;
  // Lines "TENANT SHA256-HEX" (tenant_auth.h): a Depot RPC must then carry a
  // token whose hash is listed, and acts as that tenant. Needs tls_cert.
  std::string auth_token_file;
  // The tenants that may drain the server and see every tenant's jobs
  // (depotctl; DepotService::AdminHooks). Meaningful with authentication
  // (without it every caller may).
  std::vector<std::string> admin_tenants;
  // Called by a Drain that asks the server to shut down; empty: such a
  // Drain is refused. main.cc sends the process a SIGTERM.
  std::function<void()> request_shutdown;
  // Benchmarking only (depot-bench transport and step): steps move their
  // chunks but change no state; see --bench_noop_update in main.cc.
  bool bench_noop_update = false;
};

// A host:port address. `host` is kept as written (an IPv6 host in brackets).
struct HostPort {
  std::string host;
  int port = 0;
};

// Parses "host:port" or "[v6-host]:port", port in [0, 65535].
// INVALID_ARGUMENT otherwise.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address);

std::string FormatHostPort(absl::string_view host, int port);

// Where the default memory budget comes from (DefaultMemoryLimit).
struct MemoryLimitDefault {
  uint64_t bytes = 0;
  // What it is, for the log: "80% of physical RAM (N bytes)", or "the
  // cgroup's memory limit of N bytes at PATH less a margin of M bytes".
  std::string source;
};

// The memory limit of the process's own memory cgroup, read under
// `cgroup_root` (normally /sys/fs/cgroup) for the cgroup that
// `proc_self_cgroup` (normally /proc/self/cgroup) names: cgroup v2's
// memory.max for the "0::PATH" line, v1's memory.limit_in_bytes under the
// memory controller's hierarchy for a "N:...memory...:PATH" line. When the
// file is not at ROOT/PATH (a cgroup namespace shows the process's own cgroup
// as the mount's root), ROOT itself is read. Sets *path to the file read.
// Nothing (no limit) when none is found, or it is "max" or at least 2^62
// (v1's way of saying unlimited).
std::optional<uint64_t> CgroupMemoryLimit(const std::string& proc_self_cgroup,
                                          const std::string& cgroup_root,
                                          std::string* path = nullptr);

// The default budget: min(80% of `physical_bytes`, the cgroup's limit (as
// CgroupMemoryLimit reads it) less a margin of max(128 MiB, 1/8 of it)), so
// that a server in a container is not killed by the cgroup before its budget
// refuses anything. INVALID_ARGUMENT when neither is known, or the cgroup's
// limit leaves nothing after the margin.
absl::StatusOr<MemoryLimitDefault> DefaultMemoryLimit(
    uint64_t physical_bytes, const std::string& proc_self_cgroup = "/proc/self/cgroup",
    const std::string& cgroup_root = "/sys/fs/cgroup");

// Checks every value and replaces the 0 defaults of threads and
// memory_limit_bytes by this machine's values (DefaultMemoryLimit). INVALID_
// ARGUMENT naming the flag.
absl::StatusOr<ServerOptions> ResolveServerOptions(ServerOptions options);

}  // namespace depot

#endif  // DEPOT_SERVER_SERVER_OPTIONS_H_
