#include "server_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace depot::testing {
namespace {

absl::Status ErrnoError(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Milliseconds from now until `deadline`, clamped to [0, INT_MAX] for poll().
int PollTimeoutMs(absl::Time deadline) {
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  if (ms <= 0) return 0;
  return ms > INT32_MAX ? INT32_MAX : static_cast<int>(ms);
}

// poll() that restarts after EINTR. Returns poll's result.
int PollRetrying(struct pollfd* fds, nfds_t n, absl::Time deadline) {
  for (;;) {
    const int ready = poll(fds, n, PollTimeoutMs(deadline));
    if (ready >= 0 || errno != EINTR) return ready;
  }
}

ProcessExit DecodeWaitStatus(int status) {
  ProcessExit exit;
  if (WIFEXITED(status)) exit.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) exit.signal = WTERMSIG(status);
  return exit;
}

std::string TempRoot() {
  const char* tmpdir = std::getenv("TMPDIR");
  return tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp";
}

}  // namespace

std::string ServerProcess::DefaultBinary() {
  // A relocated build (tests/gpu/bundle.sh's bundle, run on another machine)
  // names its server; otherwise the one of this build tree.
  const char* binary = std::getenv("DEPOT_SERVER_BINARY");
  return binary != nullptr && *binary != '\0' ? binary : DEPOT_SERVER_PATH;
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Spawn(
    const std::string& binary, const std::vector<std::string>& args) {
  auto process = absl::WrapUnique(new ServerProcess());
  if (absl::Status s = process->PrepareTempDir(); !s.ok()) return s;
  if (absl::Status s = process->Exec(binary, args); !s.ok()) return s;
  return process;
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(
    const std::vector<std::string>& extra_flags, absl::Duration timeout) {
  return StartTls(extra_flags, /*tls_ca_file=*/"", timeout);
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::StartTls(
    const std::vector<std::string>& extra_flags, const std::string& tls_ca_file,
    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  auto process = absl::WrapUnique(new ServerProcess());
  process->tls_ca_file_ = tls_ca_file;
  if (absl::Status s = process->PrepareTempDir(); !s.ok()) return s;
  std::vector<std::string> args = {
      "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
      absl::StrCat("--port_file=", process->port_file_)};
  args.insert(args.end(), extra_flags.begin(), extra_flags.end());
  if (absl::Status s = process->Exec(DefaultBinary(), args); !s.ok()) return s;
  if (absl::Status s = process->WaitForPortFile(deadline); !s.ok()) return s;
  if (absl::Status s = process->WaitForServing(deadline); !s.ok()) return s;
  return process;
}

absl::Status ServerProcess::PrepareTempDir() {
  std::string pattern = TempRoot() + "/depot-it.XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) return ErrnoError("mkdtemp");
  temp_dir_ = pattern;
  port_file_ = temp_dir_ + "/port";
  log_file_ = temp_dir_ + "/server.log";
  // The watch exists before the child does, so the rename cannot be missed.
  inotify_fd_ = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (inotify_fd_ < 0) return ErrnoError("inotify_init1");
  if (inotify_add_watch(inotify_fd_, temp_dir_.c_str(),
                        IN_MOVED_TO | IN_CLOSE_WRITE) < 0) {
    return ErrnoError("inotify_add_watch");
  }
  return absl::OkStatus();
}

absl::Status ServerProcess::Exec(const std::string& binary,
                                 const std::vector<std::string>& args) {
  // Everything the child needs is prepared before fork(): between fork and exec
  // only async-signal-safe calls are allowed (the test process has gRPC
  // threads).
  std::vector<std::string> argv_strings = {binary};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : argv_strings) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const int log_fd =
      open(log_file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) return ErrnoError(absl::StrCat("open ", log_file_));
  sigset_t empty_mask;
  sigemptyset(&empty_mask);
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return ErrnoError("fork");
  }
  if (pid == 0) {
    // A crashed or killed test must not leave servers behind.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    sigprocmask(SIG_SETMASK, &empty_mask, nullptr);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    execv(binary.c_str(), argv.data());
    static constexpr char kExecFailed[] = "ServerProcess: execv failed\n";
    [[maybe_unused]] ssize_t ignored =
        write(STDERR_FILENO, kExecFailed, sizeof(kExecFailed) - 1);
    _exit(127);
  }
  close(log_fd);
  pid_ = pid;
  pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd_ < 0) return ErrnoError("pidfd_open");
  return absl::OkStatus();
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  if (pidfd_ >= 0) close(pidfd_);
  if (inotify_fd_ >= 0) close(inotify_fd_);
  if (!temp_dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(temp_dir_, ignored);
  }
}

absl::Status ServerProcess::Signal(int signal) {
  if (reaped_) {
    return absl::FailedPreconditionError("the server has already exited");
  }
  if (kill(pid_, signal) != 0) return ErrnoError("kill");
  return absl::OkStatus();
}

absl::StatusOr<ProcessExit> ServerProcess::Wait(absl::Duration timeout) {
  if (reaped_) return exit_;
  struct pollfd fd = {pidfd_, POLLIN, 0};
  const int ready = PollRetrying(&fd, 1, absl::Now() + timeout);
  if (ready < 0) return ErrnoError("poll");
  if (ready == 0) {
    return absl::DeadlineExceededError(
        absl::StrCat("depot-server (pid ", pid_, ") still running after ",
                     absl::FormatDuration(timeout)));
  }
  int status = 0;
  pid_t reaped;
  while ((reaped = waitpid(pid_, &status, 0)) < 0 && errno == EINTR) {
  }
  if (reaped < 0) return ErrnoError("waitpid");
  reaped_ = true;
  exit_ = DecodeWaitStatus(status);
  return exit_;
}

absl::StatusOr<ProcessExit> ServerProcess::Kill() {
  if (!reaped_) {
    if (absl::Status s = Signal(SIGKILL); !s.ok()) return s;
  }
  return Wait(absl::Seconds(30));
}

std::string ServerProcess::Log() const {
  std::ifstream in(log_file_);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status ServerProcess::WithLog(const absl::Status& status) const {
  return absl::Status(
      status.code(),
      absl::StrCat(status.message(), "\n--- depot-server output ---\n", Log()));
}

absl::Status ServerProcess::WaitForPortFile(absl::Time deadline) {
  for (;;) {
    struct stat st;
    // The server renames a complete file into place, so existing means written.
    if (stat(port_file_.c_str(), &st) == 0 && st.st_size > 0) break;
    struct pollfd fds[2] = {{inotify_fd_, POLLIN, 0}, {pidfd_, POLLIN, 0}};
    const int ready = PollRetrying(fds, 2, deadline);
    if (ready < 0) return ErrnoError("poll");
    if (ready == 0) {
      return WithLog(absl::DeadlineExceededError(
          absl::StrCat("depot-server did not write ", port_file_)));
    }
    if (fds[1].revents != 0) {
      absl::StatusOr<ProcessExit> exit = Wait(absl::ZeroDuration());
      return WithLog(absl::InternalError(absl::StrCat(
          "depot-server exited (code ", exit.ok() ? exit->exit_code : -1,
          ", signal ", exit.ok() ? exit->signal : -1,
          ") before writing its port file")));
    }
    // Drain the events; the loop re-checks the file itself.
    char events[4096];
    while (read(inotify_fd_, events, sizeof(events)) > 0) {
    }
  }
  std::ifstream in(port_file_);
  std::stringstream text;
  text << in.rdbuf();
  std::vector<std::string> lines =
      absl::StrSplit(text.str(), '\n', absl::SkipWhitespace());
  if (lines.empty()) {
    return WithLog(absl::InternalError(
        absl::StrCat("port file ", port_file_, " is empty")));
  }
  grpc_address_ = std::string(absl::StripAsciiWhitespace(lines[0]));
  if (lines.size() > 1) {
    metrics_address_ = std::string(absl::StripAsciiWhitespace(lines[1]));
  }
  return absl::OkStatus();
}

absl::Status ServerProcess::WaitForServing(absl::Time deadline) {
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::InsecureChannelCredentials();
  if (!tls_ca_file_.empty()) {
    std::ifstream in(tls_ca_file_);
    std::stringstream ca;
    ca << in.rdbuf();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ca.str();
    credentials = grpc::SslCredentials(ssl);
  }
  auto channel = grpc::CreateChannel(grpc_address_, credentials);
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  context.set_wait_for_ready(true);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("depot.v1.Depot");
  // Watch pushes every status change, so nothing here polls.
  auto reader = stub->Watch(&context, request);
  grpc::health::v1::HealthCheckResponse response;
  while (reader->Read(&response)) {
    if (response.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      context.TryCancel();
      reader->Finish().IgnoreError();
      return absl::OkStatus();
    }
  }
  const grpc::Status status = reader->Finish();
  return WithLog(absl::UnavailableError(
      absl::StrCat("depot-server at ", grpc_address_,
                   " never reported SERVING: ", status.error_message())));
}

}  // namespace depot::testing
