// An address the server cannot bind: ProbeBind's reasons, and the one-line
// error DepotDaemon::Start returns for its gRPC and metrics addresses.
#include "server/bind_probe.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/daemon.h"
#include "server/server_options.h"

namespace depot {
namespace {

// A TCP socket listening on 127.0.0.1 at a free port, as another server's.
class TakenPort {
 public:
  TakenPort() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address = {};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&address), length), 0);
    EXPECT_EQ(listen(fd_, 1), 0);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length),
              0);
    port_ = ntohs(address.sin_port);
  }
  ~TakenPort() { close(fd_); }
  TakenPort(const TakenPort&) = delete;
  TakenPort& operator=(const TakenPort&) = delete;

  int port() const { return port_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

ServerOptions LocalOptions() {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.metrics_listen = "127.0.0.1:0";
  options.threads = 1;
  options.memory_limit_bytes = 1 << 20;
  return options;
}

TEST(ProbeBindTest, AFreePortBinds) {
  EXPECT_TRUE(ProbeBind(HostPort{"127.0.0.1", 0}).ok());
  EXPECT_TRUE(ProbeBind(HostPort{"localhost", 0}).ok());
}

TEST(ProbeBindTest, APortInUseIsUnavailable) {
  TakenPort taken;
  const absl::Status status = ProbeBind(HostPort{"127.0.0.1", taken.port()});
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(status.message(), "address in use");
}

TEST(ProbeBindTest, AnAddressOfAnotherMachineIsInvalid) {
  // 192.0.2.0/24 is TEST-NET-1 (RFC 5737): never a local address.
  const absl::Status status = ProbeBind(HostPort{"192.0.2.1", 0});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "not an address of this machine");
}

TEST(DaemonBindTest, MetricsPortInUseIsOneActionableLine) {
  TakenPort taken;
  ServerOptions options = LocalOptions();
  options.metrics_listen = taken.address();
  const absl::Status status =
      DepotDaemon::Start(ResolveServerOptions(options).value()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(status.message(),
            absl::StrCat("cannot serve metrics on ", taken.address(),
                         ": address in use (another depot-server? pass "
                         "--metrics_listen=HOST:PORT, port 0 picks a free "
                         "one, or an empty value to disable metrics)"));
}

TEST(DaemonBindTest, GrpcPortInUseIsOneActionableLine) {
  TakenPort taken;
  ServerOptions options = LocalOptions();
  options.listen = taken.address();
  const absl::Status status =
      DepotDaemon::Start(ResolveServerOptions(options).value()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(status.message(),
            absl::StrCat("cannot listen on ", taken.address(),
                         ": address in use (another depot-server? pass "
                         "--listen=HOST:PORT; port 0 picks a free one, which "
                         "--port_file reports)"));
}

TEST(DaemonBindTest, AForeignAddressSaysSoWithoutGuessingAnotherServer) {
  ServerOptions options = LocalOptions();
  options.listen = "192.0.2.1:0";
  const absl::Status status =
      DepotDaemon::Start(ResolveServerOptions(options).value()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(status.message(),
            "cannot listen on 192.0.2.1:0: not an address of this machine "
            "(pass --listen=HOST:PORT; port 0 picks a free one, which "
            "--port_file reports)");
}

}  // namespace
}  // namespace depot
