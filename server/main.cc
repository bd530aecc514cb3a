// depot-server: the Depot parameter server daemon. Flags are documented by
// --help; docs/protocol.md describes the service.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "depot/flags_usage.h"
#include "server/daemon.h"
#include "server/memory_trimmer.h"
#include "server/optimizer/kernel_isa.h"
#include "server/port_file.h"
#include "server/server_options.h"
#include "server/shutdown_watchdog.h"
#include "server/tenant_auth.h"
#include "wire/transport_memory.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "gRPC address to serve on, host:port (IPv6: [host]:port). Port 0 "
          "picks a free port; see --port_file. An address that cannot be "
          "bound (in use, not on this machine) exits with code 2.");
ABSL_FLAG(std::string, port_file, "",
          "If set, once serving, atomically write the bound gRPC address "
          "(host:port) on line 1 and, when metrics are enabled, the bound "
          "metrics address on line 2.");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "Address of the HTTP endpoint, host:port (port 0 picks a free "
          "port): Prometheus metrics at /metrics, a status page at /status "
          "(jobs, workers, memory, live charts) and its figures at "
          "/status.json. Loopback by default: the page shows every tenant's "
          "jobs. Empty disables it. An address that cannot be bound exits "
          "with code 2.");
ABSL_FLAG(int32_t, threads, 0,
          "Threads of the optimizer update pool. 0: one per hardware thread.");
ABSL_FLAG(int32_t, max_handler_threads,
          depot::HandlerThreads::kDefaultMaxThreads,
          "The most calls of methods other than Step (CreateJob, InitWeights, "
          "PullWeights, GetJob, imports, exports, ...) served at once: each "
          "runs on a thread of its own, and a call past this many is "
          "RESOURCE_EXHAUSTED before its request is read, so that clients "
          "that open calls and never finish them cannot make the server "
          "start threads without end. Step streams take no such thread.");
ABSL_FLAG(bool, pin_threads, true,
          "Pin update thread i to the i-th CPU the process may run on (its "
          "affinity mask, e.g. from taskset or a cgroup), wrapping round. "
          "--nopin_threads leaves them to the scheduler.");
ABSL_FLAG(uint64_t, memory_limit_bytes, 0,
          "Budget for job memory, all jobs together: the state (master "
          "weights and optimizer moments) and the weights each job keeps of "
          "its last two steps for pulls at a step (2 x the weight dtype's "
          "size per element), and each job's bookkeeping (per server, "
          "worker, tensor and chunk); CreateJob beyond it fails with "
          "RESOURCE_EXHAUSTED. Also counted: the gradient payloads of steps "
          "in flight, one chunk message (4 bytes x chunk_elems) per open "
          "Step stream for what gRPC may receive ahead of the reader, and "
          "staged imports, refused with RESOURCE_EXHAUSTED when they do not "
          "fit (docs/protocol.md, \"Bounds and memory\"). "
          "0: 80% of physical RAM, or the server's "
          "cgroup memory limit (cgroup v2 memory.max, v1 "
          "memory.limit_in_bytes) less max(128 MiB, 1/8 of it) if that is "
          "less; the log says which.");
ABSL_FLAG(bool, bench_noop_update, false,
          "Benchmarking only, never for training: Step streams carry their "
          "chunks as usual, but no chunk is summed or updated. Each chunk is "
          "answered with worker 0's gradient payload when the grad and weight "
          "dtypes are the same, else with the unchanged weights. depot-bench "
          "uses it to time the transfer alone (docs/performance.md).");
ABSL_FLAG(uint64_t, malloc_trim_threshold_bytes, uint64_t{32} << 20,
          "When the memory malloc holds freed has grown by more than this "
          "(checked 4 times a second), it is given back to the kernel "
          "(malloc_trim): after large messages, which gRPC reads into "
          "buffers of many threads' malloc arenas, the server would "
          "otherwise keep them (docs/protocol.md, \"Bounds and memory\"). "
          "0: never.");
ABSL_FLAG(double, stalled_step_seconds, 30,
          "A step that has waited this long for worker ranks that sent "
          "nothing for some chunk is logged once on stderr, naming the job, "
          "the step and the missing ranks, and counted in the metrics "
          "depot_step_stalls_total and depot_stalled_*. GetJob reports the "
          "waiting step at any time. 0 turns the check off.");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Directory of this server's job checkpoints, one directory per "
          "server (a second server on it fails to start). At start-up every "
          "job found there is restored from its newest complete checkpoint "
          "that verifies, and CreateJob of its tenant with the same name and "
          "config attaches to it (a tenant's jobs lie in tenant-<tenant>/). "
          "DeleteJob removes the job's checkpoints. Empty: no checkpoints. "
          "See docs/checkpoints.md.");
ABSL_FLAG(std::vector<std::string>, import_roots, {},
          "Comma-separated directories whose checkpoints ImportCheckpoint may "
          "read: a directory it names must be one of them or lie under one, "
          "after `..` and symbolic links are resolved, else the call is "
          "PERMISSION_DENIED (docs/security.md). Typically the shared "
          "directory that holds every server's --checkpoint_dir. Empty: "
          "--checkpoint_dir alone (no import at all without it).");
ABSL_FLAG(uint64_t, checkpoint_every_steps, 0,
          "Checkpoint every job at each step that is a multiple of this, "
          "into --checkpoint_dir: the shard is copied in memory as each "
          "chunk applies the step and written in the background, so training "
          "does not wait for the disk; while a job's previous checkpoint is "
          "still being written its next checkpoint step is skipped (counted "
          "in depot_checkpoints_skipped_total). Each job then counts twice "
          "its state against --memory_limit_bytes (the state and one copy). "
          "0: never checkpoint (a --checkpoint_dir is still restored from).");
ABSL_FLAG(int32_t, checkpoint_keep, 3,
          "Complete checkpoints kept per job in --checkpoint_dir; older ones "
          "are removed after each new one is written. At least 1.");
ABSL_FLAG(uint64_t, checkpoint_write_bytes_per_second, 0,
          "Pace of each checkpoint file's write in the background, so that "
          "it leaves the disk's bandwidth to others (e.g. trainers loading "
          "data from it); a checkpoint still being written when its job's "
          "next one is due makes that one skip. 0: as fast as the disk "
          "goes.");
ABSL_FLAG(int64_t, checkpoint_max_lag_steps, -1,
          "How far training may run ahead of a periodic checkpoint still "
          "being written: a step more than this many steps after the "
          "checkpoint's step does not complete (its Step streams wait) until "
          "the checkpoint is durable. 0: a kill loses at most "
          "--checkpoint_every_steps steps, at the cost of waiting for the "
          "disk when a write outlasts a step (docs/checkpoints.md, \"What a "
          "kill costs\"). -1: never wait (a kill during a write may also lose "
          "the steps of the write). Needs --checkpoint_every_steps.");
ABSL_FLAG(double, shutdown_grace_seconds, 10,
          "On SIGTERM/SIGINT the server reports NOT_SERVING and refuses new "
          "RPCs with UNAVAILABLE (\"server is shutting down\"), which "
          "clients retry elsewhere or later. The RPCs in flight (steps, "
          "exports, pulls, imports, Checkpoint calls) and the checkpoint "
          "writes under way get this long to finish; then what still runs "
          "ends with UNAVAILABLE (a step waiting for absent workers, an export "
          "to a client that reads too slowly) and the checkpoint write in "
          "progress is abandoned, its temporary file removed (the job's "
          "older checkpoints stay complete), and the process exits 0. The "
          "exit comes at most 5 s after the grace period whatever the jobs "
          "(exit status 1 when that bound cut the shutdown short); a second "
          "SIGTERM/SIGINT exits at once with status 1.");
ABSL_FLAG(
    std::string, tls_cert, "",
    "PEM file of the server's TLS certificate (chain); with --tls_key "
    "the gRPC port speaks TLS only (docs/security.md). Empty: plaintext.");
ABSL_FLAG(std::string, tls_key, "",
          "PEM file of the private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "mTLS: PEM file of the CA(s) that sign client certificates. Every "
          "Depot RPC must then present a certificate it signed (the health "
          "service stays open); without --auth_token_file the certificate's "
          "subject CN names the caller's tenant. Needs --tls_cert.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File of bearer tokens, stored hashed: one \"TENANT SHA256-HEX\" "
          "line per token, '#' starts a comment. Every Depot RPC must then "
          "carry \"authorization: Bearer <token>\" with a listed token and "
          "acts as its tenant: a job belongs to the tenant that created it, "
          "and other tenants get NOT_FOUND for it; job names are per tenant. "
          "Needs --tls_cert. Read at start-up only.");
ABSL_FLAG(std::vector<std::string>, admin_tenants, {},
          "Comma-separated tenants that may administer the server: drain it "
          "(depotctl drain) and see every tenant's jobs in depotctl status "
          "(other tenants see their own). Needs --auth_token_file or "
          "--tls_client_ca; without authentication every caller may.");
ABSL_FLAG(bool, hash_token, false,
          "Read a token from stdin (one line) and print the SHA-256 hex that "
          "an --auth_token_file line takes; then exit.");

namespace {

// Exit code for a bad command line, an address that cannot be bound among
// them.
constexpr int kUsageError = 2;
// Exit code when the shutdown did not run to its end: a second stop signal,
// or the drain overran its bound.
constexpr int kShutdownCutShort = 1;

// How often the memory trimmer looks at malloc's free memory: a trim costs
// the re-faulting of what it released, so at most one every interval.
constexpr absl::Duration kTrimInterval = absl::Milliseconds(250);
// How long after its grace period a shutdown may still run before the
// process exits without it (--shutdown_grace_seconds).
constexpr absl::Duration kShutdownOverrun = absl::Seconds(5);

// absl::ParseCommandLine ends the process with status 1 both after printing
// usage
// (--help and its kin) and on a malformed command line (an unknown flag, a
// value that does not parse). depot-server exits 0 after usage and 2 on a bad
// command line, so an exit handler armed only while parsing sets the status.
enum class ExitDuringParse { kNotParsing, kUsageRequested, kBadCommandLine };
std::atomic<ExitDuringParse> g_exit_during_parse{ExitDuringParse::kNotParsing};

void FixExitStatusDuringParse() {
  const ExitDuringParse kind = g_exit_during_parse.load();
  if (kind == ExitDuringParse::kNotParsing) return;
  std::cout.flush();
  std::fflush(nullptr);
  std::_Exit(kind == ExitDuringParse::kUsageRequested ? 0 : kUsageError);
}

// True for the flags with which absl prints usage and exits.
bool RequestsUsage(absl::string_view arg) {
  if (!absl::ConsumePrefix(&arg, "--")) absl::ConsumePrefix(&arg, "-");
  arg = arg.substr(0, arg.find('='));
  for (absl::string_view flag :
       {"help", "helpfull", "helpshort", "helppackage", "helpon", "helpmatch",
        "version", "only_check_args"}) {
    if (arg == flag) return true;
  }
  return false;
}

// Parses the flags; returns the positional arguments (argv[0] first).
std::vector<char*> ParseFlags(int argc, char** argv) {
  depot::SetFlagsUsage(
      "server/main.cc",
      "Depot parameter server: holds fp32 master weights and optimizer state "
      "in host memory and runs the optimizer step on gradients streamed by "
      "trainers.\nUsage: depot-server [--listen=HOST:PORT] [flags]\n"
      "Environment: DEPOT_KERNEL_ISA=scalar|avx2|avx512 forces the update "
      "kernel's instruction set (default: the best this CPU supports; every "
      "one gives the same bits); one the CPU lacks is an error.\n"
      "Exit status: 0 after SIGTERM/SIGINT (or --help); 2 for a bad command "
      "line or an address that cannot be bound (one line on stderr says "
      "why); 1 for a shutdown cut short (see --shutdown_grace_seconds) or "
      "any other failure.");

  bool usage_requested = false;
  for (int i = 1; i < argc; ++i) usage_requested |= RequestsUsage(argv[i]);
  g_exit_during_parse = usage_requested ? ExitDuringParse::kUsageRequested
                                        : ExitDuringParse::kBadCommandLine;
  std::atexit(FixExitStatusDuringParse);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  g_exit_during_parse = ExitDuringParse::kNotParsing;
  return args;
}

// A flag's seconds as a duration; infinite (which validation rejects) when
// not finite.
absl::Duration FlagSeconds(double seconds) {
  return std::isfinite(seconds) ? absl::Seconds(seconds)
                                : absl::InfiniteDuration();
}

depot::ServerOptions OptionsFromFlags() {
  depot::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.port_file = absl::GetFlag(FLAGS_port_file);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.bench_noop_update = absl::GetFlag(FLAGS_bench_noop_update);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.pin_threads = absl::GetFlag(FLAGS_pin_threads);
  options.max_handler_threads = absl::GetFlag(FLAGS_max_handler_threads);
  options.memory_limit_bytes = absl::GetFlag(FLAGS_memory_limit_bytes);
  options.shutdown_grace =
      FlagSeconds(absl::GetFlag(FLAGS_shutdown_grace_seconds));
  options.stalled_step_threshold =
      FlagSeconds(absl::GetFlag(FLAGS_stalled_step_seconds));
  options.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  options.import_roots = absl::GetFlag(FLAGS_import_roots);
  options.checkpoint_every_steps = absl::GetFlag(FLAGS_checkpoint_every_steps);
  options.checkpoint_keep = absl::GetFlag(FLAGS_checkpoint_keep);
  options.checkpoint_write_bytes_per_second =
      absl::GetFlag(FLAGS_checkpoint_write_bytes_per_second);
  options.checkpoint_max_lag_steps =
      absl::GetFlag(FLAGS_checkpoint_max_lag_steps);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  options.admin_tenants = absl::GetFlag(FLAGS_admin_tenants);
  // `depotctl drain --shutdown`: the same path as a SIGTERM (sigwait below).
  options.request_shutdown = [] { kill(getpid(), SIGTERM); };
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<char*> args = ParseFlags(argc, argv);
  if (args.size() > 1) {
    std::fprintf(stderr,
                 "depot-server: unexpected argument \"%s\" (see --help)\n",
                 args[1]);
    return kUsageError;
  }
  if (absl::GetFlag(FLAGS_hash_token)) {
    std::string token;
    std::getline(std::cin, token);
    if (token.empty()) {
      std::fprintf(stderr, "depot-server: --hash_token: no token on stdin\n");
      return kUsageError;
    }
    std::printf("%s\n", depot::Sha256Hex(token).c_str());
    return 0;
  }
  absl::StatusOr<depot::ServerOptions> options =
      depot::ResolveServerOptions(OptionsFromFlags());
  if (!options.ok()) {
    std::fprintf(stderr, "depot-server: %s\n",
                 std::string(options.status().message()).c_str());
    return kUsageError;
  }
  // The update kernel's instruction set (DEPOT_KERNEL_ISA, or the best the CPU
  // has): a bad or unsupported choice stops the server here.
  if (absl::StatusOr<depot::KernelIsa> isa = depot::KernelIsaFromEnvironment();
      !isa.ok()) {
    std::fprintf(stderr, "depot-server: %s\n",
                 std::string(isa.status().message()).c_str());
    return kUsageError;
  }

  // gRPC's receive buffers reused instead of faulted in again for every
  // message (docs/protocol.md, "Flow control, frames and memory").
  depot::RetainTransportBuffers();
  // ...in one malloc arena, so that they are reused by every thread instead
  // of kept per thread (memory_trimmer.h).
  depot::UseOneMallocArena();

  // Blocked before any thread starts, so every thread inherits the mask and the
  // signals reach only the sigwait below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  // What malloc keeps of gRPC's buffers after a burst (large messages read by
  // many gRPC threads, each into its own arena) goes back to the kernel
  // (memory_trimmer.h).
  std::unique_ptr<depot::MemoryTrimmer> trimmer;
  if (const uint64_t threshold =
          absl::GetFlag(FLAGS_malloc_trim_threshold_bytes);
      threshold != 0) {
    trimmer = std::make_unique<depot::MemoryTrimmer>(kTrimInterval, threshold);
  }

  absl::StatusOr<std::unique_ptr<depot::DepotDaemon>> daemon =
      depot::DepotDaemon::Start(*options);
  if (!daemon.ok()) {
    // An address that cannot be bound (DepotDaemon::Start's one UNAVAILABLE)
    // is for the command line to fix, and its message says how.
    if (absl::IsUnavailable(daemon.status())) {
      std::fprintf(stderr, "depot-server: %s\n",
                   std::string(daemon.status().message()).c_str());
      return kUsageError;
    }
    std::fprintf(stderr, "depot-server: %s\n",
                 daemon.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "depot-server listening on %s (update kernel: %s, %d threads%s)\n",
      (*daemon)->address().c_str(),
      std::string(depot::KernelIsaName(depot::ActiveKernelIsa())).c_str(),
      options->threads, options->pin_threads ? ", pinned" : "");
  std::fprintf(stderr, "depot-server: memory budget %llu bytes (%s)\n",
               static_cast<unsigned long long>(options->memory_limit_bytes),
               options->memory_limit_source.c_str());
  if (options->bench_noop_update) {
    std::fprintf(stderr,
                 "depot-server: WARNING: --bench_noop_update is set: steps "
                 "change no state (benchmarking only)\n");
  }
  if (!(*daemon)->metrics_address().empty()) {
    std::printf("depot-server metrics on %s\n",
                (*daemon)->metrics_address().c_str());
  }
  std::fflush(stdout);
  // Last: a reader that sees the port file finds the server ready and its
  // lines above printed.
  if (!options->port_file.empty()) {
    if (absl::Status s =
            depot::WritePortFile(options->port_file, (*daemon)->address(),
                                 (*daemon)->metrics_address());
        !s.ok()) {
      std::fprintf(stderr, "depot-server: %s\n", s.ToString().c_str());
      return 1;
    }
  }

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  std::fprintf(stderr, "depot-server: %s received, shutting down\n",
               depot::SignalName(signal_number).c_str());
  depot::StartShutdownWatchdog(
      stop_signals, options->shutdown_grace + kShutdownOverrun,
      [](const std::string& why) {
        std::fprintf(stderr, "depot-server: %s\n", why.c_str());
        std::_Exit(kShutdownCutShort);
      })
      .detach();
  (*daemon)->Shutdown();
  std::fprintf(stderr, "depot-server: stopped\n");
  // Everything is written and stopped. What is left, freeing memory and
  // gRPC's library shutdown (grpc::Server's destructor, which can wait
  // seconds for an idle poller thread), has nothing to save: skip it, so
  // that the exit follows the shutdown at once.
  std::fflush(nullptr);
  std::_Exit(0);
}
