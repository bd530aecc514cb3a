#include "server/shutdown_watchdog.h"

#include <time.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace depot {

std::string SignalName(int signal_number) {
  switch (signal_number) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    default:
      return absl::StrCat("signal ", signal_number);
  }
}

std::thread StartShutdownWatchdog(
    sigset_t signals, absl::Duration bound,
    std::function<void(const std::string& why)> expire) {
  return std::thread([signals, bound, expire = std::move(expire)] {
    const absl::Time deadline = absl::Now() + bound;
    while (true) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        expire(absl::StrCat("the shutdown did not finish within ",
                            absl::FormatDuration(bound),
                            ": exiting without it"));
        return;
      }
      const timespec timeout = absl::ToTimespec(left);
      const int second = sigtimedwait(&signals, nullptr, &timeout);
      if (second > 0) {
        expire(absl::StrCat("second ", SignalName(second),
                            ": exiting without finishing the shutdown"));
        return;
      }
      // EAGAIN (the bound passed: checked above) or EINTR: look again.
    }
  });
}

}  // namespace depot
