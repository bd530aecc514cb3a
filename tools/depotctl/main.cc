// depotctl: the operator's command line for a fleet of depot-servers
// (docs/operations.md, "depotctl").
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "depot/flags_usage.h"
#include "tools/depotctl/commands.h"
#include "tools/depotctl/fleet.h"

ABSL_FLAG(std::vector<std::string>, servers, {},
          "The servers, HOST:PORT,... (all the servers of the jobs you act "
          "on). Default: the environment variable DEPOT_SERVERS.");
ABSL_FLAG(std::string, output, "text",
          "text (tables for people) or json (one JSON object on stdout, for "
          "scripts).");
ABSL_FLAG(double, timeout_seconds, 30,
          "Deadline of each RPC. A checkpoint or drain waits for the "
          "servers' writes: give large jobs more.");
ABSL_FLAG(double, sample_seconds, 1,
          "status: seconds between the two readings the rates come from; 0: "
          "one reading, no rates.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM file of the CA that signed the servers' --tls_cert: TLS, the "
          "server's certificate checked. Empty: plaintext.");
ABSL_FLAG(std::string, tls_cert, "",
          "mTLS: PEM file of depotctl's client certificate (with --tls_key), "
          "for servers started with --tls_client_ca.");
ABSL_FLAG(std::string, tls_key, "", "mTLS: PEM file of --tls_cert's key.");
ABSL_FLAG(std::string, token_file, "",
          "File whose first line is the bearer token (servers started with "
          "--auth_token_file). Or set DEPOT_TOKEN. Needs --tls_ca.");
ABSL_FLAG(bool, yes, false, "delete: really delete.");
ABSL_FLAG(std::vector<std::string>, from, {},
          "import: the checkpoint directories of the servers that wrote the "
          "checkpoint (their --checkpoint_dir), comma-separated, any order; "
          "each server reads the files its shard needs from them.");
ABSL_FLAG(bool, shutdown, false,
          "drain: then shut the server down (as SIGTERM does).");
ABSL_FLAG(bool, resume, false, "drain: undo a drain (take new jobs again).");

namespace {

constexpr char kUsage[] = R"(depotctl: look at and operate a fleet of depot-servers.

usage: depotctl [flags] COMMAND [ARGS]

Commands:
  status                    every server: state, uptime, jobs, memory against
                            the budget, steps and updates per second, bytes in
                            and out per second, the last checkpoint's age; then
                            each job's shard on it (step, workers it waits for)
  jobs                      every job across the servers: servers holding it,
                            workers, step, workers a step waits for, state,
                            the newest checkpoint every server has
  checkpoint JOB            checkpoint JOB on every server now (best between
                            steps: a job that is stepping may be checkpointed at
                            different steps, which is reported)
  checkpoints list [JOB]    the checkpoints each server holds of JOB (or of
                            every job), and the steps complete on all
  checkpoints verify [JOB]  the same, each checkpoint read back and checked
                            (CRCs, contents) by its server
  rollback JOB STEP         put JOB back at STEP on every server (each must be
                            at STEP or hold its checkpoint, else nothing
                            changes); the trainers get RolledBackError(STEP)
  drain SERVER              SERVER (HOST:PORT) takes no new job, reports
                            NOT_SERVING, checkpoints every job it holds;
                            --shutdown then stops it, --resume undoes a drain
  import JOB STEP --from=DIR,...
                            replace JOB's state on every server by the
                            checkpoint of STEP that servers of any count wrote
                            into those directories (restoring onto another
                            server count); every server verifies its part
                            first, nothing changes unless all can
  delete JOB --yes          delete JOB and its checkpoints on every server

JOB is the job's name (DepotOptimizer's / JobConfig's `name`).

Exit codes: 0 done; 1 an RPC failed (the error is printed on stderr);
2 bad command line (or delete without --yes); 3 done but not all is well
(a server did not answer, a job is missing from a server, a checkpoint did not
verify or was taken at different steps); 4 no such job.

Examples:
  export DEPOT_SERVERS=cpu1:50051,cpu2:50051,cpu3:50051
  depotctl status
  depotctl jobs --output=json | jq '.jobs[].name'
  depotctl checkpoints verify gpt
  depotctl rollback gpt 1200
  depotctl drain cpu2:50051 --shutdown

Security (docs/security.md): --tls_ca for TLS, --tls_cert/--tls_key for
mTLS, --token_file or DEPOT_TOKEN for a bearer token. A tenant sees and acts on
its own jobs; an admin tenant (--admin_tenants) sees every job and may drain.

Flags:)";

int Usage(const std::string& message) {
  std::fprintf(stderr, "depotctl: %s (see depotctl --help)\n", message.c_str());
  return depot::ctl::kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  depot::SetFlagsUsage("tools/depotctl/main.cc", kUsage);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  std::vector<std::string> args(positional.begin() + 1, positional.end());
  if (args.empty()) return Usage("no command");

  depot::ctl::CommandOptions options;
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output != "text" && output != "json") {
    return Usage("--output must be text or json, got \"" + output + "\"");
  }
  options.json = output == "json";
  const double sample = absl::GetFlag(FLAGS_sample_seconds);
  const double timeout = absl::GetFlag(FLAGS_timeout_seconds);
  if (!(sample >= 0 && sample <= 3600)) {
    return Usage("--sample_seconds must be in [0, 3600]");
  }
  if (!(timeout > 0 && timeout <= 86400)) {
    return Usage("--timeout_seconds must be in (0, 86400]");
  }
  options.sample = absl::Seconds(sample);

  depot::ClientOptions security;
  security.tls_ca_file = absl::GetFlag(FLAGS_tls_ca);
  security.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  security.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  security.auth_token_file = absl::GetFlag(FLAGS_token_file);
  if (const char* token = std::getenv("DEPOT_TOKEN");
      token != nullptr && *token != '\0' && security.auth_token_file.empty()) {
    security.auth_token = token;
  }

  const std::string& command = args[0];
  std::vector<std::string> servers = absl::GetFlag(FLAGS_servers);
  if (command == "drain") {
    if (args.size() != 2) return Usage("drain takes one SERVER (HOST:PORT)");
    if (absl::GetFlag(FLAGS_shutdown) && absl::GetFlag(FLAGS_resume)) {
      return Usage("--shutdown and --resume exclude each other");
    }
    servers = {args[1]};
  } else if (servers.empty()) {
    if (const char* env = std::getenv("DEPOT_SERVERS");
        env != nullptr && *env != '\0') {
      servers = absl::StrSplit(env, ',', absl::SkipWhitespace());
    }
  }
  absl::StatusOr<depot::ctl::Fleet> fleet = depot::ctl::Fleet::Connect(
      servers, security, absl::Seconds(timeout));
  if (!fleet.ok()) return Usage(std::string(fleet.status().message()));

  if (command == "status" && args.size() == 1) {
    return depot::ctl::Status(*fleet, options);
  }
  if (command == "jobs" && args.size() == 1) {
    return depot::ctl::Jobs(*fleet, options);
  }
  if (command == "checkpoint" && args.size() == 2) {
    return depot::ctl::Checkpoint(*fleet, args[1], options);
  }
  if (command == "checkpoints" && args.size() >= 2 && args.size() <= 3 &&
      (args[1] == "list" || args[1] == "verify")) {
    return depot::ctl::ListCheckpoints(*fleet,
                                       args.size() == 3 ? args[2] : "",
                                       args[1] == "verify", options);
  }
  if (command == "rollback" && args.size() == 3) {
    uint64_t step = 0;
    if (!absl::SimpleAtoi(args[2], &step)) {
      return Usage("rollback's STEP must be a step number, got \"" + args[2] +
                   "\"");
    }
    return depot::ctl::RollBack(*fleet, args[1], step, options);
  }
  if (command == "import" && args.size() == 3) {
    uint64_t step = 0;
    if (!absl::SimpleAtoi(args[2], &step)) {
      return Usage("import's STEP must be a step number, got \"" + args[2] +
                   "\"");
    }
    if (absl::GetFlag(FLAGS_from).empty()) {
      return Usage("import needs --from=DIR,... (the old servers' "
                   "checkpoint directories)");
    }
    return depot::ctl::Import(*fleet, args[1], step, absl::GetFlag(FLAGS_from),
                              options);
  }
  if (command == "drain") {
    return depot::ctl::Drain(*fleet, absl::GetFlag(FLAGS_shutdown),
                             absl::GetFlag(FLAGS_resume), options);
  }
  if (command == "delete" && args.size() == 2) {
    return depot::ctl::Delete(*fleet, args[1], absl::GetFlag(FLAGS_yes),
                              options);
  }
  const bool known = command == "status" || command == "jobs" ||
                     command == "checkpoint" || command == "checkpoints" ||
                     command == "rollback" || command == "import" ||
                     command == "delete";
  return Usage(known ? "wrong arguments for \"" + command + "\""
                     : "unknown command \"" + command + "\"");
}
