// How messages describe a step that waits for workers: the worker ranks it
// waits for (the server's stalled-step log, the client's error) and what the
// servers said about a step that ran into its deadline (Job::Step's
// DEADLINE_EXCEEDED; docs/protocol.md, "A step waiting for absent workers").
#ifndef DEPOT_STEP_WAIT_H_
#define DEPOT_STEP_WAIT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace depot {

// "worker rank 1 (of 2)", "worker ranks 1, 3 (of 4)"; runs of three or more
// consecutive ranks are written as ranges ("worker ranks 0-5, 9 (of 16)"),
// and past 16 items the rest is counted (", and 30 more"). `ranks` must be
// ascending and without repeats; empty gives "no worker rank".
std::string DescribeWorkerRanks(const std::vector<uint32_t>& ranks,
                                uint32_t num_workers);

// What one server's GetJob said about a job's steps (depot.v1.JobStatus).
struct ServerStepWait {
  std::string server;  // host:port
  // The GetJob's outcome; the fields below mean something only when OK.
  absl::Status status;
  uint64_t completed_step = 0;
  uint64_t pending_step = 0;  // 0: no step waits
  std::vector<uint32_t> missing_workers;
  double waiting_seconds = 0.0;
};

// The message of a step that did not complete within `timeout`:
//   step 12 did not complete within 30s (ClientOptions::step_timeout):
//   servers A, B are waiting for worker ranks 1, 3 (of 4) to send their
//   gradients (for up to 29.8 s). Is every worker running, each with its own
//   rank? [first error: server A: Deadline Exceeded]
// Servers that say the same are named together, in the order given (four
// addresses, then a count). Besides waiting for workers, a server may have
// every worker's gradients for the chunks sent so far, have completed the
// step, hold none of its gradients, or have given no answer (its status).
std::string DescribeStepDeadline(uint64_t step, absl::Duration timeout,
                                 uint32_t num_workers,
                                 const std::vector<ServerStepWait>& servers,
                                 std::string_view first_error);

}  // namespace depot

#endif  // DEPOT_STEP_WAIT_H_
