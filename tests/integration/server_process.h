// ServerProcess: a real depot-server child process for integration tests.
//
// Start() runs the binary with --listen=127.0.0.1:0
// --metrics_listen=127.0.0.1:0
// --port_file=<private temp dir>/port plus any extra flags, waits (on inotify,
// never a fixed sleep) until the server has written its port file, then waits
// on the grpc.health.v1 Watch stream until the "depot.v1.Depot" service is
// SERVING. The child's stdout and stderr go to a log file whose text is
// attached to every error.
//
// The destructor SIGKILLs a child that is still running, reaps it and removes
// the temp dir, so a failing test never leaves a server behind. The child also
// gets PR_SET_PDEATHSIG(SIGKILL): call Start() from the thread that outlives
// the server (the test's main thread), since the signal fires when the
// *starting thread* exits.
#ifndef DEPOT_TESTS_INTEGRATION_SERVER_PROCESS_H_
#define DEPOT_TESTS_INTEGRATION_SERVER_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace depot::testing {

// How a reaped child ended: exit_code is set when it exited, signal when a
// signal killed it (the other is -1).
struct ProcessExit {
  int exit_code = -1;
  int signal = -1;
  bool ExitedWith(int code) const { return exit_code == code; }
};

class ServerProcess {
 public:
  // The depot-server binary the tests were built against, or
  // $DEPOT_SERVER_BINARY when it is set and not empty.
  static std::string DefaultBinary();

  // Starts the server and waits until it is SERVING, or `timeout` passes
  // (DEADLINE_EXCEEDED) or it exits first (INTERNAL with its log).
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(
      const std::vector<std::string>& extra_flags = {},
      absl::Duration timeout = absl::Seconds(60));
  // Start, for a server with --tls_cert: its health service is asked over
  // TLS, trusting the CA in the PEM file `tls_ca_file`.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> StartTls(
      const std::vector<std::string>& extra_flags,
      const std::string& tls_ca_file,
      absl::Duration timeout = absl::Seconds(60));

  // Runs `binary` with exactly `args` (no flags added) and does not wait for it
  // to be ready: for tests of the command line itself.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Spawn(
      const std::string& binary, const std::vector<std::string>& args);

  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess();

  // The bound addresses, "127.0.0.1:PORT" (empty until Start() has read them).
  const std::string& grpc_address() const { return grpc_address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  pid_t pid() const { return pid_; }

  // Sends `signal` to the child. FAILED_PRECONDITION once it has been reaped.
  absl::Status Signal(int signal);

  // Waits for the child to exit and reaps it. DEADLINE_EXCEEDED if it is still
  // running after `timeout` (it is left running). Once reaped, returns the same
  // ProcessExit again.
  absl::StatusOr<ProcessExit> Wait(absl::Duration timeout);

  // SIGKILL and reap.
  absl::StatusOr<ProcessExit> Kill();

  // Everything the child wrote to stdout and stderr so far.
  std::string Log() const;

 private:
  ServerProcess() = default;

  // Creates the private temp dir and the inotify watch on it.
  absl::Status PrepareTempDir();
  // fork/exec of `binary` with `args`, output to the log file.
  absl::Status Exec(const std::string& binary,
                    const std::vector<std::string>& args);
  // Blocks until the port file exists (inotify on the temp dir) and reads it.
  absl::Status WaitForPortFile(absl::Time deadline);
  // Blocks until the health service reports "depot.v1.Depot" SERVING.
  absl::Status WaitForServing(absl::Time deadline);
  // `status` with the server's log appended, for errors a person must debug.
  absl::Status WithLog(const absl::Status& status) const;

  pid_t pid_ = -1;
  int pidfd_ = -1;       // readable once the child has exited
  int inotify_fd_ = -1;  // watches temp_dir_ for the port file's rename
  bool reaped_ = false;
  ProcessExit exit_;
  std::string temp_dir_;
  std::string port_file_;
  std::string log_file_;
  std::string grpc_address_;
  std::string metrics_address_;
  std::string tls_ca_file_;  // StartTls: the health check's CA
};

}  // namespace depot::testing

#endif  // DEPOT_TESTS_INTEGRATION_SERVER_PROCESS_H_
