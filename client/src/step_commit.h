// The client's side of a two-phase step's global decision (docs/protocol.md,
// "Two phases"). Each server's stream hands in its shard's GradStats; once all
// have, they are combined in server order and Megatron's rules decide the
// clip coefficient and whether to skip. Every worker receives the same
// statistics from every server and combines them in the same order, so every
// worker commits the same decision, which the servers check.
#ifndef DEPOT_CLIENT_SRC_STEP_COMMIT_H_
#define DEPOT_CLIENT_SRC_STEP_COMMIT_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "depot/client.h"
#include "depot/job_config.h"
#include "depot/v1/depot.pb.h"

namespace depot::client_internal {

// The global statistics and the decision taken from them.
struct GradDecision {
  double grad_norm = 0.0;
  uint64_t zero_count = 0;
  bool found_inf = false;
  StepCommit commit;
};

// Combines the shards' statistics in the order given (server order): the sum
// of squares and the zero count are added in double / integers, the max and
// the non-finite flag taken over all. grad_norm is sqrt(sum of squares) or the
// max |g| (config.clip_grad_norm_type); the step is skipped when a value is
// not finite or grad_norm exceeds grad_norm_skip_threshold (> 0); otherwise,
// with clip_grad > 0, clip_coef = clip_grad / (grad_norm + 1e-6) when that is
// < 1 (Megatron's clip_grad_by_total_norm_fp32), else 1.
GradDecision DecideStep(const OptimizerConfig& config,
                        const std::vector<v1::GradStats>& shards);

// Waits for the GradStats of every server of one step, then hands the same
// decision to each. Thread safety: all methods may be called concurrently.
class CommitBarrier {
 public:
  // `servers`: the servers whose streams report (each exactly once).
  CommitBarrier(const OptimizerConfig& config, std::vector<uint32_t> servers);

  // Records server's statistics, then blocks until every server's are in (and
  // returns the commit), Abort is called (returns its status), or `deadline`
  // passes (DEADLINE_EXCEEDED). INTERNAL when `server` is not one of the
  // servers or reports twice.
  absl::StatusOr<StepCommit> Report(uint32_t server, const v1::GradStats& stats,
                                    absl::Time deadline);

  // Wakes every waiting Report with `status` (not OK), e.g. because another
  // server's stream failed. The first call wins.
  void Abort(absl::Status status);

  // The decision, once every server has reported.
  std::optional<GradDecision> decision() const;

 private:
  bool DoneOrAborted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const OptimizerConfig config_;
  const std::vector<uint32_t> servers_;

  mutable absl::Mutex mu_;
  // Indexed like servers_.
  std::vector<std::optional<v1::GradStats>> stats_ ABSL_GUARDED_BY(mu_);
  size_t reported_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<GradDecision> decision_ ABSL_GUARDED_BY(mu_);
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace depot::client_internal

#endif  // DEPOT_CLIENT_SRC_STEP_COMMIT_H_
