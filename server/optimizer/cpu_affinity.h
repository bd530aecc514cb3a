// Pinning threads to CPUs: the update thread pool (server/thread_pool.h) and
// depot-bench kernel pin their i-th thread to the i-th CPU the process may run
// on, so that a chunk's update is not migrated between cores mid-pass and the
// threads spread over distinct cores.
#ifndef DEPOT_SERVER_OPTIMIZER_CPU_AFFINITY_H_
#define DEPOT_SERVER_OPTIMIZER_CPU_AFFINITY_H_

#include <vector>

#include "absl/status/status.h"

namespace depot {

// The CPUs in this process's affinity mask (sched_getaffinity), in increasing
// order; empty when the mask cannot be read.
std::vector<int> AllowedCpus();

// Pins the calling thread to cpus[index % cpus.size()].
// FAILED_PRECONDITION when cpus is empty, INTERNAL when the system refuses.
absl::Status PinCurrentThread(int index, const std::vector<int>& cpus);

}  // namespace depot

#endif  // DEPOT_SERVER_OPTIMIZER_CPU_AFFINITY_H_
