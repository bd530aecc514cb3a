#include "metrics_scrape.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace depot::testing {
namespace {

// A connected TCP socket, closed on destruction.
class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

absl::StatusOr<int> Connect(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("not host:port: '", host_port, "'"));
  }
  const std::string host = host_port.substr(0, colon);
  const std::string port = host_port.substr(colon + 1);
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* addresses = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &addresses);
      rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("resolve ", host_port, ": ", gai_strerror(rc)));
  }
  int fd = -1;
  for (struct addrinfo* a = addresses; a != nullptr; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(addresses);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("connect ", host_port, ": ", std::strerror(errno)));
  }
  // A server that stops answering fails the read instead of hanging the test.
  struct timeval timeout = {30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  return fd;
}

// The Content-Length header's value, if the header block has one.
std::optional<size_t> ContentLength(absl::string_view headers) {
  for (absl::string_view line : absl::StrSplit(headers, "\r\n")) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    if (!absl::EqualsIgnoreCase(line.substr(0, colon), "content-length")) {
      continue;
    }
    size_t length = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(colon + 1)),
                         &length)) {
      return length;
    }
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::string> HttpGet(const std::string& host_port,
                                    const std::string& path) {
  absl::StatusOr<int> fd = Connect(host_port);
  if (!fd.ok()) return fd.status();
  Socket socket(*fd);
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host_port, "\r\n\r\n");
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(socket.fd(), request.data() + sent,
                           request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::UnavailableError(
          absl::StrCat("send to ", host_port, ": ", std::strerror(errno)));
    }
    sent += static_cast<size_t>(n);
  }

  // Read until the server closes or, when it says how long the body is, until
  // the body is complete (a keep-alive server would not close).
  std::string response;
  size_t header_end = std::string::npos;
  std::optional<size_t> body_length;
  char buffer[16384];
  for (;;) {
    if (header_end != std::string::npos && body_length.has_value() &&
        response.size() >= header_end + 4 + *body_length) {
      break;
    }
    const ssize_t n = recv(socket.fd(), buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::UnavailableError(
          absl::StrCat("read from ", host_port, ": ", std::strerror(errno)));
    }
    if (n == 0) break;
    response.append(buffer, static_cast<size_t>(n));
    if (header_end == std::string::npos) {
      header_end = response.find("\r\n\r\n");
      if (header_end != std::string::npos) {
        body_length =
            ContentLength(absl::string_view(response).substr(0, header_end));
      }
    }
  }
  if (header_end == std::string::npos) {
    return absl::InternalError(
        absl::StrCat("incomplete HTTP answer from ", host_port, path));
  }
  const std::string status_line = response.substr(0, response.find("\r\n"));
  std::vector<absl::string_view> fields =
      absl::StrSplit(status_line, ' ', absl::SkipEmpty());
  if (fields.size() < 2 || fields[1] != "200") {
    return absl::InternalError(absl::StrCat("GET http://", host_port, path,
                                            " answered '", status_line, "'"));
  }
  std::string body = response.substr(header_end + 4);
  if (body_length.has_value() && body.size() > *body_length) {
    body.resize(*body_length);
  }
  return body;
}

absl::StatusOr<std::string> ScrapeMetrics(const std::string& host_port) {
  return HttpGet(host_port, "/metrics");
}

absl::StatusOr<double> MetricValue(absl::string_view exposition,
                                   absl::string_view series) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (line.empty() || line.front() == '#') continue;
    if (!absl::StartsWith(line, series)) continue;
    absl::string_view rest = line.substr(series.size());
    // The series must end here: `depot_jobs` must not match `depot_jobs_x 1`.
    if (rest.empty() || rest.front() != ' ') continue;
    std::vector<absl::string_view> tokens =
        absl::StrSplit(rest, ' ', absl::SkipEmpty());
    double value = 0.0;
    if (tokens.empty() || !absl::SimpleAtod(tokens[0], &value)) {
      return absl::InternalError(
          absl::StrCat("unparsable sample line: '", line, "'"));
    }
    return value;
  }
  return absl::NotFoundError(absl::StrCat("no sample for ", series));
}

namespace {

// Scrapes until `reached(value of series)` or the deadline; `goal` describes
// the condition for the error message.
absl::Status WaitForMetric(const std::string& host_port,
                           absl::string_view series,
                           const std::function<bool(double)>& reached,
                           absl::string_view goal, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  // Each probe is a full scrape; the short pause between probes only keeps the
  // loop from spinning on a busy machine. Nothing depends on its length.
  absl::Duration pause = absl::Milliseconds(1);
  absl::Status last =
      absl::NotFoundError(absl::StrCat("no sample for ", series));
  while (absl::Now() < deadline) {
    absl::StatusOr<std::string> text = ScrapeMetrics(host_port);
    if (text.ok()) {
      absl::StatusOr<double> current = MetricValue(*text, series);
      if (current.ok() && reached(*current)) return absl::OkStatus();
      last = current.ok() ? absl::FailedPreconditionError(
                                absl::StrCat(series, " is ", *current))
                          : current.status();
    } else {
      last = text.status();
    }
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("waiting for ", series, " ", goal, ": ", last.message()));
}

}  // namespace

absl::Status WaitForMetricAtLeast(const std::string& host_port,
                                  absl::string_view series, double value,
                                  absl::Duration timeout) {
  return WaitForMetric(
      host_port, series, [value](double v) { return v >= value; },
      absl::StrCat(">= ", value), timeout);
}

absl::Status WaitForMetricAtMost(const std::string& host_port,
                                 absl::string_view series, double value,
                                 absl::Duration timeout) {
  return WaitForMetric(
      host_port, series, [value](double v) { return v <= value; },
      absl::StrCat("<= ", value), timeout);
}

}  // namespace depot::testing
