// The bound on a graceful shutdown, kept from outside it: once the first stop
// signal has come, a thread waits for a second stop signal or for the bound
// to pass, whichever is first, and then hands a line saying which to
// `expire` (depot-server's main logs it and exits at once). Nothing a job or
// a client does can then keep the process up, not even a handler stuck where
// the shutdown cannot reach it or a disk that does not answer; whatever a
// checkpoint write leaves behind then is a temporary file or a shard file
// without its manifest, which never looks complete.
#ifndef DEPOT_SERVER_SHUTDOWN_WATCHDOG_H_
#define DEPOT_SERVER_SHUTDOWN_WATCHDOG_H_

#include <signal.h>

#include <functional>
#include <string>
#include <thread>

#include "absl/time/time.h"

namespace depot {

// "SIGTERM", "SIGINT", else "signal N": for log lines.
std::string SignalName(int signal_number);

// Starts the watchdog's thread and returns it (main detaches it). It takes
// the signals of `signals` with sigtimedwait, so they must be blocked in the
// calling thread (which the new thread inherits) and, for a signal sent to
// the process, in every other thread. `expire` runs on the watchdog's thread,
// at most once; the thread ends after it.
std::thread StartShutdownWatchdog(
    sigset_t signals, absl::Duration bound,
    std::function<void(const std::string& why)> expire);

}  // namespace depot

#endif  // DEPOT_SERVER_SHUTDOWN_WATCHDOG_H_
