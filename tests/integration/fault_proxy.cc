#include "fault_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace depot::testing {

// Both sockets of one proxied connection.
struct FaultProxy::Link {
  int client_fd = -1;
  int server_fd = -1;
  std::atomic<bool> closed{false};

  // Ends the connection with a reset (SO_LINGER 0), as a cut does.
  void Reset() {
    if (closed.exchange(true)) return;
    for (int fd : {client_fd, server_fd}) {
      linger hard = {1, 0};
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof(hard));
      shutdown(fd, SHUT_RDWR);
    }
  }
  ~Link() {
    if (client_fd >= 0) close(client_fd);
    if (server_fd >= 0) close(server_fd);
  }
};

absl::StatusOr<std::unique_ptr<FaultProxy>> FaultProxy::Start(
    const std::string& target) {
  const size_t colon = target.rfind(':');
  int port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(target.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("FaultProxy: target \"", target, "\" is not host:port"));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("FaultProxy: socket failed");
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, 64) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    return absl::InternalError(absl::StrCat("FaultProxy: listen: ", why));
  }
  std::string address = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  std::unique_ptr<FaultProxy> proxy(new FaultProxy(
      fd, std::move(address), target.substr(0, colon), port));
  proxy->accept_thread_ = std::thread([p = proxy.get()] { p->AcceptLoop(); });
  return proxy;
}

FaultProxy::FaultProxy(int listen_fd, std::string address,
                       std::string target_host, int target_port)
    : listen_fd_(listen_fd),
      address_(std::move(address)),
      target_host_(std::move(target_host)),
      target_port_(target_port) {}

FaultProxy::~FaultProxy() {
  stopping_ = true;
  blackholed_ = false;
  shutdown(listen_fd_, SHUT_RDWR);
  accept_thread_.join();
  close(listen_fd_);
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    for (const std::shared_ptr<Link>& link : links_) link->Reset();
    threads.swap(threads_);
  }
  for (std::thread& thread : threads) thread.join();
}

void FaultProxy::Cut() {
  absl::MutexLock lock(&mu_);
  for (const std::shared_ptr<Link>& link : links_) link->Reset();
}

void FaultProxy::Blackhole() { blackholed_ = true; }
void FaultProxy::Heal() { blackholed_ = false; }
void FaultProxy::SetDelay(absl::Duration delay) {
  delay_ns_ = absl::ToInt64Nanoseconds(delay);
}

void FaultProxy::AcceptLoop() {
  while (!stopping_) {
    const int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) {
      if (stopping_) return;
      continue;
    }
    const int server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(target_port_.load()));
    inet_pton(AF_INET,
              target_host_ == "localhost" ? "127.0.0.1" : target_host_.c_str(),
              &addr.sin_addr);
    if (server < 0 ||
        connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) !=
            0) {
      if (server >= 0) close(server);
      close(client);
      continue;
    }
    for (int fd : {client, server}) {
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    auto link = std::make_shared<Link>();
    link->client_fd = client;
    link->server_fd = server;
    ++accepted_;
    absl::MutexLock lock(&mu_);
    links_.push_back(link);
    threads_.emplace_back([this, link] { Pump(link, true); });
    threads_.emplace_back([this, link] { Pump(link, false); });
  }
}

void FaultProxy::Pump(std::shared_ptr<Link> link, bool upstream) {
  const int from = upstream ? link->client_fd : link->server_fd;
  const int to = upstream ? link->server_fd : link->client_fd;
  char buffer[64 * 1024];
  while (!link->closed && !stopping_) {
    // While blackholed nothing is read, so nothing moves and the kernel's
    // buffers fill: the peers see a connection that just stops.
    if (blackholed_) {
      absl::SleepFor(absl::Milliseconds(5));
      continue;
    }
    pollfd p = {from, POLLIN, 0};
    const int ready = poll(&p, 1, 20);
    if (ready <= 0) continue;
    const ssize_t n = read(from, buffer, sizeof(buffer));
    if (n <= 0) break;
    const int64_t delay = delay_ns_.load();
    if (delay > 0) absl::SleepFor(absl::Nanoseconds(delay));
    while (blackholed_ && !link->closed && !stopping_) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ssize_t sent = 0;
    while (sent < n) {
      const ssize_t w = send(to, buffer + sent, n - sent, MSG_NOSIGNAL);
      if (w <= 0) break;
      sent += w;
    }
    if (sent < n) break;
  }
  // One side ended: end the other, as a real connection would.
  link->Reset();
}

}  // namespace depot::testing
