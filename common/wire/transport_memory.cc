#include "wire/transport_memory.h"

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace depot {
namespace {

bool EnvironmentSetsMallocThresholds() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  return (tunables != nullptr &&
          std::strstr(tunables, "glibc.malloc.") != nullptr) ||
         std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr ||
         std::getenv("MALLOC_TRIM_THRESHOLD_") != nullptr;
}

bool SetThresholds() {
#if defined(__GLIBC__)
  if (EnvironmentSetsMallocThresholds()) return false;
  return mallopt(M_MMAP_THRESHOLD,
                 static_cast<int>(kTransportMmapThresholdBytes)) == 1 &&
         mallopt(M_TRIM_THRESHOLD,
                 static_cast<int>(kTransportTrimThresholdBytes)) == 1;
#else
  return false;
#endif
}

}  // namespace

bool RetainTransportBuffers() {
  static const bool set = SetThresholds();
  return set;
}

}  // namespace depot
