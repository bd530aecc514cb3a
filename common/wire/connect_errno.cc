#include "wire/connect_errno.h"

#include <cerrno>

#include "absl/base/internal/sysinfo.h"

namespace depot {

void GuardGrpcConnectErrno() {
  const int saved = errno;
  // Internal to absl, but the very call absl::Mutex makes (through
  // CycleClock::Frequency) when it first orders waiters by priority; its
  // result is computed once per process and cached.
  static_cast<void>(absl::base_internal::NominalCPUFrequency());
  errno = saved;
}

}  // namespace depot
