#include "tests/bench/netns.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <thread>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace depot::bench {
namespace {

constexpr char kNetnsPrefix[] = "depot-bench-";
constexpr char kNetnsDir[] = "/run/netns/";

absl::Status ErrnoError(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// The full path of `tool` (ip, tc): execv needs one, and root's PATH in a CI
// container may lack the sbin directories.
std::string FindTool(const std::string& tool) {
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) {
    const std::string path = absl::StrCat(dir, tool);
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return tool;
}

// The first non-empty line of a tool's output: its error, without the usage
// text that may follow.
std::string FirstLine(absl::string_view output) {
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty()) return std::string(line);
  }
  return "(no output)";
}

// Runs argv[0] (ip or tc) with argv and waits for it. INTERNAL with its
// output unless it exits 0.
absl::Status RunTool(const std::vector<std::string>& argv) {
  std::vector<std::string> args = argv;
  args[0] = FindTool(argv[0]);
  std::vector<char*> raw;
  for (std::string& arg : args) raw.push_back(arg.data());
  raw.push_back(nullptr);
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return ErrnoError("pipe2");
  sigset_t empty_mask;
  sigemptyset(&empty_mask);
  const pid_t pid = fork();
  if (pid < 0) {
    close(out[0]);
    close(out[1]);
    return ErrnoError("fork");
  }
  if (pid == 0) {
    // The caller may block SIGINT and SIGTERM; the tool must not inherit that.
    sigprocmask(SIG_SETMASK, &empty_mask, nullptr);
    dup2(out[1], STDOUT_FILENO);
    dup2(out[1], STDERR_FILENO);
    execv(raw[0], raw.data());
    _exit(127);
  }
  close(out[1]);
  std::string output;
  char buffer[4096];
  for (;;) {
    const ssize_t n = read(out[0], buffer, sizeof(buffer));
    if (n > 0) {
      output.append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(out[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(
      "`", absl::StrJoin(argv, " "), "` failed",
      WIFEXITED(status) && WEXITSTATUS(status) == 127 ? " (not found?)" : "",
      ": ", FirstLine(output)));
}

// Every IPv4 address on an interface of this namespace, host byte order.
std::set<uint32_t> LocalIpv4Addresses() {
  std::set<uint32_t> addresses;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return addresses;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || it->ifa_addr->sa_family != AF_INET) continue;
    addresses.insert(
        ntohl(reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr.s_addr));
  }
  freeifaddrs(list);
  return addresses;
}

std::string Ipv4String(uint32_t host_order) {
  in_addr addr = {htonl(host_order)};
  char text[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &addr, text, sizeof(text));
  return text;
}

// The first address of a /30 in 10.213.0.0/16 that no local interface uses,
// starting from one derived from the pid, so that concurrent runs differ.
absl::StatusOr<uint32_t> PickSubnet() {
  const std::set<uint32_t> used = LocalIpv4Addresses();
  constexpr uint32_t kBase = (10u << 24) | (213u << 16);
  constexpr uint32_t kSubnets = 1u << 14;  // /30s in a /16
  for (uint32_t i = 0; i < kSubnets; ++i) {
    const uint32_t subnet =
        kBase + ((static_cast<uint32_t>(getpid()) + i) % kSubnets) * 4;
    if (used.lower_bound(subnet) == used.lower_bound(subnet + 4)) return subnet;
  }
  return absl::ResourceExhaustedError("no free /30 in 10.213.0.0/16");
}

// A depot-bench that was SIGKILLed cannot clean up after itself: remove the
// namespaces (and veth pairs) of runs whose process is gone.
void RemoveStaleNamespaces() {
  DIR* dir = opendir(kNetnsDir);
  if (dir == nullptr) return;
  std::vector<int> stale;
  while (dirent* entry = readdir(dir)) {
    absl::string_view name = entry->d_name;
    int pid = 0;
    if (!absl::ConsumePrefix(&name, kNetnsPrefix) ||
        !absl::SimpleAtoi(name, &pid) || pid <= 0) {
      continue;
    }
    if (kill(pid, 0) != 0 && errno == ESRCH) stale.push_back(pid);
  }
  closedir(dir);
  for (int pid : stale) {
    std::fprintf(stderr, "depot-bench: removing stale namespace %s%d\n",
                 kNetnsPrefix, pid);
    RunTool({"ip", "link", "del", absl::StrCat("dbv", pid, "o")}).IgnoreError();
    RunTool({"ip", "netns", "del", absl::StrCat(kNetnsPrefix, pid)})
        .IgnoreError();
  }
}

// A socket of `type` created inside namespace `netns` (empty: this one). A
// socket belongs to the namespace it was created in for its whole life, and
// setns() moves only the calling thread, so a short-lived thread enters the
// namespace, creates it and ends.
absl::StatusOr<int> SocketIn(const std::string& netns) {
  if (netns.empty()) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return ErrnoError("socket");
    return fd;
  }
  absl::Status status;
  int fd = -1;
  std::thread([&] {
    const std::string path = absl::StrCat(kNetnsDir, netns);
    const int ns = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0) {
      status = ErrnoError(absl::StrCat("open ", path));
      return;
    }
    if (setns(ns, CLONE_NEWNET) != 0) {
      status = ErrnoError(absl::StrCat("setns ", netns));
    } else {
      fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) status = ErrnoError("socket");
    }
    close(ns);
  }).join();
  if (!status.ok()) return status;
  return fd;
}

absl::StatusOr<sockaddr_in> Ipv4Address(const std::string& address, int port) {
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("not an IPv4 address: ", address));
  }
  return addr;
}

// Closes the fd when it goes out of scope.
struct ScopedFd {
  int fd = -1;
  ~ScopedFd() {
    if (fd >= 0) close(fd);
  }
};

// What the receiving end of MeasureTcpStream saw.
struct Received {
  absl::Status status;
  uint64_t bytes = 0;  // after the first read
  double seconds = 0;  // from the end of the first read to the last
};

// Accepts one connection on `listener` and reads it to its end.
Received Receive(int listener) {
  Received result;
  pollfd pfd = {listener, POLLIN, 0};
  if (poll(&pfd, 1, 10000) != 1) {
    result.status = absl::DeadlineExceededError("no connection to accept");
    return result;
  }
  ScopedFd conn{accept4(listener, nullptr, nullptr, SOCK_CLOEXEC)};
  if (conn.fd < 0) {
    result.status = ErrnoError("accept4");
    return result;
  }
  std::vector<char> buffer(1 << 20);
  bool first = true;
  auto start = std::chrono::steady_clock::now();
  auto last = start;
  for (;;) {
    const ssize_t n = read(conn.fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      result.status = ErrnoError("read");
      return result;
    }
    if (n == 0) break;
    last = std::chrono::steady_clock::now();
    if (first) {
      // The first read includes whatever the handshake let through before the
      // clock could start; time the stream from its end.
      start = last;
      first = false;
    } else {
      result.bytes += static_cast<uint64_t>(n);
    }
  }
  result.seconds = std::chrono::duration<double>(last - start).count();
  return result;
}

}  // namespace

absl::StatusOr<double> ParseLinkRate(const std::string& rate) {
  const std::string lower = absl::AsciiStrToLower(rate);
  absl::string_view number = lower;
  double scale = 0;
  for (const auto& [unit, factor] :
       std::vector<std::pair<std::string, double>>{{"tbit", 1e12},
                                                   {"gbit", 1e9},
                                                   {"mbit", 1e6},
                                                   {"kbit", 1e3},
                                                   {"bit", 1}}) {
    if (absl::ConsumeSuffix(&number, unit)) {
      scale = factor;
      break;
    }
  }
  double value = 0;
  if (scale == 0 || !absl::SimpleAtod(number, &value) ||
      !(value * scale >= 1e3) || value * scale > 1e13) {
    return absl::InvalidArgumentError(absl::StrCat(
        "link rate '", rate,
        "' is not a number followed by bit, kbit, mbit, gbit or tbit between "
        "1kbit and 10tbit (e.g. 10gbit)"));
  }
  return value * scale;
}

absl::StatusOr<std::unique_ptr<ShapedLink>> ShapedLink::Create(
    const std::string& rate) {
  absl::StatusOr<double> bits_per_s = ParseLinkRate(rate);
  if (!bits_per_s.ok()) return bits_per_s.status();
  if (geteuid() != 0) {
    return absl::FailedPreconditionError(
        "a network namespace and veth pair need root");
  }
  RemoveStaleNamespaces();
  auto link = absl::WrapUnique(new ShapedLink());
  if (absl::Status s = link->Build(rate, *bits_per_s); !s.ok()) {
    link->Teardown();
    return s;
  }
  return link;
}

absl::Status ShapedLink::Build(const std::string& rate, double bits_per_s) {
  const int pid = static_cast<int>(getpid());
  netns_ = absl::StrCat(kNetnsPrefix, pid);
  // Interface names are limited to 15 characters.
  outer_veth_ = absl::StrCat("dbv", pid, "o");
  inner_veth_ = absl::StrCat("dbv", pid, "i");
  absl::StatusOr<uint32_t> subnet = PickSubnet();
  if (!subnet.ok()) return subnet.status();
  outer_address_ = Ipv4String(*subnet + 1);
  inner_address_ = Ipv4String(*subnet + 2);

  if (absl::Status s = RunTool({"ip", "netns", "add", netns_}); !s.ok())
    return s;
  netns_created_ = true;
  if (absl::Status s =
          RunTool({"ip", "link", "add", outer_veth_, "type", "veth", "peer",
                   "name", inner_veth_, "netns", netns_});
      !s.ok()) {
    return s;
  }
  veth_created_ = true;
  // A burst of 2 ms at the rate (at least 256 KiB, four 64 KiB GSO packets):
  // with less, tbf held a single TCP stream well under 10gbit on veth; the
  // burst lets through at most 1.5% of a 100M-parameter step above the rate.
  // (fq maxrate paces each flow on its own, so several connections would
  // exceed the rate, and is not built into every kernel.)
  const uint64_t burst = std::max<uint64_t>(
      static_cast<uint64_t>(bits_per_s / 8 * 0.002), 256 << 10);
  const std::vector<std::string> tbf = {"root",    "tbf",   "rate",
                                        rate,      "burst", absl::StrCat(burst),
                                        "latency", "10ms"};
  std::vector<std::vector<std::string>> commands = {
      {"ip", "addr", "add", absl::StrCat(outer_address_, "/30"), "dev",
       outer_veth_},
      {"ip", "link", "set", outer_veth_, "up"},
      {"ip", "-n", netns_, "addr", "add", absl::StrCat(inner_address_, "/30"),
       "dev", inner_veth_},
      {"ip", "-n", netns_, "link", "set", inner_veth_, "up"},
      {"ip", "-n", netns_, "link", "set", "lo", "up"},
      {"tc", "qdisc", "add", "dev", outer_veth_},
      {"tc", "-n", netns_, "qdisc", "add", "dev", inner_veth_},
  };
  for (int k = 5; k < 7; ++k)
    commands[k].insert(commands[k].end(), tbf.begin(), tbf.end());
  for (const std::vector<std::string>& command : commands) {
    if (absl::Status s = RunTool(command); !s.ok()) return s;
  }
  return absl::OkStatus();
}

ShapedLink::~ShapedLink() { Teardown(); }

void ShapedLink::Teardown() {
  // Deleting one end of a veth pair deletes both.
  if (veth_created_) {
    if (absl::Status s = RunTool({"ip", "link", "del", outer_veth_}); !s.ok())
      std::fprintf(stderr, "depot-bench: %s\n", s.ToString().c_str());
    veth_created_ = false;
  }
  if (netns_created_) {
    if (absl::Status s = RunTool({"ip", "netns", "del", netns_}); !s.ok())
      std::fprintf(stderr, "depot-bench: %s\n", s.ToString().c_str());
    netns_created_ = false;
  }
}

std::vector<std::string> ShapedLink::ExecPrefix() const {
  return {FindTool("ip"), "netns", "exec", netns_};
}

absl::StatusOr<double> MeasureTcpStream(const TcpEndpoint& from,
                                        const TcpEndpoint& to,
                                        absl::Duration duration) {
  absl::StatusOr<int> listen_fd = SocketIn(to.netns);
  if (!listen_fd.ok()) return listen_fd.status();
  ScopedFd listener{*listen_fd};
  absl::StatusOr<sockaddr_in> bind_addr = Ipv4Address(to.address, 0);
  if (!bind_addr.ok()) return bind_addr.status();
  socklen_t len = sizeof(*bind_addr);
  if (bind(listener.fd, reinterpret_cast<sockaddr*>(&*bind_addr), len) != 0 ||
      listen(listener.fd, 1) != 0 ||
      getsockname(listener.fd, reinterpret_cast<sockaddr*>(&*bind_addr),
                  &len) != 0) {
    return ErrnoError(absl::StrCat("listen on ", to.address));
  }

  Received received;
  std::thread receiver([&] { received = Receive(listener.fd); });
  absl::Status sent = [&]() -> absl::Status {
    absl::StatusOr<int> send_fd = SocketIn(from.netns);
    if (!send_fd.ok()) return send_fd.status();
    ScopedFd sender{*send_fd};
    absl::StatusOr<sockaddr_in> local = Ipv4Address(from.address, 0);
    if (!local.ok()) return local.status();
    if (bind(sender.fd, reinterpret_cast<sockaddr*>(&*local), sizeof(*local)) !=
            0 ||
        connect(sender.fd, reinterpret_cast<sockaddr*>(&*bind_addr),
                sizeof(*bind_addr)) != 0) {
      return ErrnoError(
          absl::StrCat("connect ", from.address, " -> ", to.address));
    }
    const std::vector<char> buffer(1 << 20, 'x');
    const auto end =
        std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(duration);
    while (std::chrono::steady_clock::now() < end) {
      const ssize_t n =
          send(sender.fd, buffer.data(), buffer.size(), MSG_NOSIGNAL);
      if (n < 0 && errno != EINTR) return ErrnoError("send");
    }
    return absl::OkStatus();  // closing the socket ends the stream
  }();
  // A failed connect leaves the receiver waiting for a connection; shutting
  // the listener down wakes it.
  if (!sent.ok()) shutdown(listener.fd, SHUT_RDWR);
  receiver.join();
  if (!sent.ok()) return sent;
  if (!received.status.ok()) return received.status;
  if (received.seconds <= 0 || received.bytes == 0)
    return absl::InternalError("the TCP stream carried no data");
  return received.bytes * 8.0 / received.seconds;
}

}  // namespace depot::bench
