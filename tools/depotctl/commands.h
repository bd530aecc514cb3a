// depotctl's commands (docs/operations.md, "depotctl"). Each prints its
// result on stdout (a table, or with json one JSON object), its errors on
// stderr, and returns the process's exit code.
#ifndef DEPOT_TOOLS_DEPOTCTL_COMMANDS_H_
#define DEPOT_TOOLS_DEPOTCTL_COMMANDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "tools/depotctl/fleet.h"

namespace depot::ctl {

// Exit codes a script can use.
enum ExitCode : int {
  kExitOk = 0,
  // An RPC the command needed failed (the server's error is printed).
  kExitFailed = 1,
  // A bad command line.
  kExitUsage = 2,
  // Done, but not everything is well: a server did not answer (status,
  // jobs), a job is not on every server it should be, a checkpoint was not
  // taken at one step everywhere, a checkpoint failed to verify.
  kExitDegraded = 3,
  // The job is on no server that answered.
  kExitNotFound = 4,
};

struct CommandOptions {
  bool json = false;
  // status: the interval between two readings for rates; zero: no rates.
  absl::Duration sample = absl::Seconds(1);
};

int Status(const Fleet& fleet, const CommandOptions& options);
int Jobs(const Fleet& fleet, const CommandOptions& options);
int Checkpoint(const Fleet& fleet, const std::string& job,
               const CommandOptions& options);
// `job` empty: every job.
int ListCheckpoints(const Fleet& fleet, const std::string& job, bool verify,
                    const CommandOptions& options);
int RollBack(const Fleet& fleet, const std::string& job, uint64_t step,
             const CommandOptions& options);
// Replaces JOB's state on every server by the server-side checkpoint of
// `step` that servers of any count wrote into `dirs` (ImportCheckpoint):
// every server verifies its part first, and nothing changes unless all can.
int Import(const Fleet& fleet, const std::string& job, uint64_t step,
           const std::vector<std::string>& dirs, const CommandOptions& options);
// `fleet` holds the one server to drain.
int Drain(const Fleet& fleet, bool shutdown, bool resume,
          const CommandOptions& options);
// Without `confirmed` it only says what it would delete.
int Delete(const Fleet& fleet, const std::string& job, bool confirmed,
           const CommandOptions& options);

}  // namespace depot::ctl

#endif  // DEPOT_TOOLS_DEPOTCTL_COMMANDS_H_
