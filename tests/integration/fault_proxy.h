// FaultProxy: a TCP proxy on loopback between a client and one server, that
// injects the network faults a long training run meets (issue 12, "the
// client rides out faults"):
//
//   - Cut():       every open connection is reset at once (a switch reboot,
//                  a killed load balancer); new connections go through.
//   - Blackhole(): bytes stop moving both ways on every connection, which
//                  stays open (a partition, a dead host's switch port); new
//                  connections are accepted and then hang too. Heal() ends
//                  it: the bytes held so far are delivered.
//   - SetDelay():  each chunk of bytes is held that long before it is
//                  forwarded (a stalled or congested link).
//
// One thread per direction per connection, poll()-driven; nothing is
// mocked: the client speaks real gRPC through it to a real depot-server.
#ifndef DEPOT_TESTS_INTEGRATION_FAULT_PROXY_H_
#define DEPOT_TESTS_INTEGRATION_FAULT_PROXY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace depot::testing {

class FaultProxy {
 public:
  // Listens on 127.0.0.1:<free port> and forwards to `target` (host:port).
  static absl::StatusOr<std::unique_ptr<FaultProxy>> Start(
      const std::string& target);
  ~FaultProxy();

  // "127.0.0.1:<port>", for the client.
  const std::string& address() const { return address_; }

  void Cut();
  void Blackhole();
  void Heal();
  void SetDelay(absl::Duration delay);
  // Connections accepted so far (a reconnect shows as one more).
  int connections_accepted() const { return accepted_.load(); }
  // New connections go to `port` on the target host from now on (a server
  // restarted on another port keeps the address its clients know).
  void SetTargetPort(int port) { target_port_ = port; }

 private:
  struct Link;
  FaultProxy(int listen_fd, std::string address, std::string target_host,
             int target_port);
  void AcceptLoop();
  void Pump(std::shared_ptr<Link> link, bool upstream);

  const int listen_fd_;
  const std::string address_;
  const std::string target_host_;
  std::atomic<int> target_port_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> blackholed_{false};
  std::atomic<int64_t> delay_ns_{0};
  std::atomic<int> accepted_{0};
  absl::Mutex mu_;
  std::vector<std::shared_ptr<Link>> links_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::thread accept_thread_;
};

}  // namespace depot::testing

#endif  // DEPOT_TESTS_INTEGRATION_FAULT_PROXY_H_
