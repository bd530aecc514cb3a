// JobShape: everything the server derives from a job's config before holding
// any state: the layout, the shard plan, which shard this server holds, the
// fingerprint and the bytes of state the shard needs. A pure function of
// (config, server index), so the memory budget can be checked before anything
// is allocated; it also carries the job's owner (JobKey), which the
// fingerprint does not cover.
#ifndef DEPOT_SERVER_JOB_SHAPE_H_
#define DEPOT_SERVER_JOB_SHAPE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "depot/job_config.h"
#include "depot/layout.h"
#include "depot/shard_plan.h"
#include "server/job_key.h"

namespace depot {

class JobShape {
 public:
  // INVALID_ARGUMENT when the config is invalid (ValidateJobConfig) or
  // server_index >= config.num_servers. `tenant` owns the job (JobKey).
  static absl::StatusOr<JobShape> Create(JobConfig config,
                                         uint32_t server_index,
                                         std::string tenant = "");

  const JobConfig& config() const { return config_; }
  // The tenant that owns the job ("": the implicit tenant).
  const std::string& tenant() const { return tenant_; }
  // The job's identity on this server: its tenant and its name.
  JobKey key() const { return JobKey{tenant_, config_.name}; }
  const Layout& layout() const { return layout_; }
  const ShardPlan& plan() const { return plan_; }
  uint64_t fingerprint() const { return fingerprint_; }
  uint32_t server_index() const { return server_index_; }
  const ShardRange& shard() const { return plan_.shard(server_index_); }
  // Optimizer state slots per parameter besides the master weights: the most
  // any param group needs (JobStateSlots).
  int slots() const { return slots_; }
  // The config that describes the slot arrays (JobSlotConfig): the dtype of
  // slot k is OptimizerSlotDType(slot_config(), k).
  const OptimizerConfig& slot_config() const { return slot_config_; }
  // shard elements * OptimizerStateBytesPerParam (4 for the master plus each
  // slot's dtype size): the job's optimizer state.
  uint64_t state_bytes() const { return state_bytes_; }
  // shard elements * 2 * weight dtype size: the weights each chunk keeps of
  // its last two steps, for pulls at a step (server/shard_pull.cc). Counted
  // against the budget with the state (JobStore).
  uint64_t kept_weights_bytes() const { return kept_weights_bytes_; }

 private:
  JobShape(JobConfig config, Layout layout, ShardPlan plan,
           uint32_t server_index, std::string tenant);

  JobConfig config_;
  std::string tenant_;
  Layout layout_;
  ShardPlan plan_;
  uint64_t fingerprint_;
  uint32_t server_index_;
  OptimizerConfig slot_config_;
  int slots_;
  uint64_t state_bytes_;
  uint64_t kept_weights_bytes_;
};

}  // namespace depot

#endif  // DEPOT_SERVER_JOB_SHAPE_H_
