#include "server/bind_probe.h"

#include <errno.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace depot {
namespace {

absl::Status BindError(int error) {
  switch (error) {
    case EADDRINUSE:
      return absl::UnavailableError("address in use");
    case EACCES:
      return absl::PermissionDeniedError(
          "permission denied (ports below 1024 need privileges)");
    case EADDRNOTAVAIL:
      return absl::InvalidArgumentError("not an address of this machine");
    default:
      return absl::InternalError(
          absl::StrCat("cannot bind: ", std::strerror(error)));
  }
}

// Binds one socket to `info`'s address; the error as BindError.
absl::Status TryBind(const addrinfo& info) {
  const int fd =
      socket(info.ai_family, info.ai_socktype | SOCK_CLOEXEC, info.ai_protocol);
  if (fd < 0) return BindError(errno);
  const int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  const int bound = bind(fd, info.ai_addr, info.ai_addrlen);
  const int error = errno;
  close(fd);
  return bound == 0 ? absl::OkStatus() : BindError(error);
}

}  // namespace

absl::Status ProbeBind(const HostPort& address) {
  std::string host = address.host;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* infos = nullptr;
  const std::string port = absl::StrCat(address.port);
  if (const int error = getaddrinfo(host.c_str(), port.c_str(), &hints, &infos);
      error != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot resolve host \"", host, "\": ", gai_strerror(error)));
  }
  absl::Status first_error;
  for (const addrinfo* info = infos; info != nullptr; info = info->ai_next) {
    absl::Status bound = TryBind(*info);
    if (bound.ok()) {
      first_error = absl::OkStatus();
      break;
    }
    if (first_error.ok()) first_error = bound;
  }
  freeaddrinfo(infos);
  return first_error;
}

}  // namespace depot
