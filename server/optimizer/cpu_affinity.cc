#include "server/optimizer/cpu_affinity.h"

#include <pthread.h>
#include <sched.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace depot {

std::vector<int> AllowedCpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &mask)) cpus.push_back(cpu);
  }
  return cpus;
}

absl::Status PinCurrentThread(int index, const std::vector<int>& cpus) {
  if (cpus.empty()) {
    return absl::FailedPreconditionError(
        "cannot pin the thread: this process's CPU affinity mask is unknown");
  }
  const int cpu = cpus[static_cast<size_t>(index) % cpus.size()];
  cpu_set_t mask;
  CPU_ZERO(&mask);
  CPU_SET(cpu, &mask);
  const int error = pthread_setaffinity_np(pthread_self(), sizeof(mask), &mask);
  if (error != 0) {
    return absl::InternalError(absl::StrCat("cannot pin the thread to CPU ",
                                            cpu, ": ", strerror(error)));
  }
  return absl::OkStatus();
}

}  // namespace depot
