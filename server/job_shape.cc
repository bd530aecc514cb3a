#include "server/job_shape.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "depot/dtype.h"

namespace depot {
namespace {

// shard elements * bytes per element, saturated: a layout may have up to 2^62
// elements, and a job that large must fail the budget check, not wrap around.
uint64_t StateBytes(uint64_t shard_elems, uint64_t per_elem) {
  if (shard_elems > std::numeric_limits<uint64_t>::max() / per_elem) {
    return std::numeric_limits<uint64_t>::max();
  }
  return shard_elems * per_elem;
}

}  // namespace

absl::StatusOr<JobShape> JobShape::Create(JobConfig config,
                                          uint32_t server_index,
                                          std::string tenant) {
  absl::StatusOr<JobGeometry> geometry = MakeJobGeometry(config);
  if (!geometry.ok()) return geometry.status();
  if (server_index >= config.num_servers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "server_index ", server_index, " is out of range: the job has ",
        config.num_servers, " servers"));
  }
  return JobShape(std::move(config), std::move(geometry->layout),
                  std::move(geometry->plan), server_index, std::move(tenant));
}

JobShape::JobShape(JobConfig config, Layout layout, ShardPlan plan,
                   uint32_t server_index, std::string tenant)
    : config_(std::move(config)),
      tenant_(std::move(tenant)),
      layout_(std::move(layout)),
      plan_(std::move(plan)),
      fingerprint_(Fingerprint(config_)),
      server_index_(server_index),
      slot_config_(JobSlotConfig(config_)),
      slots_(OptimizerStateSlots(slot_config_)),
      state_bytes_(StateBytes(plan_.shard(server_index).size(),
                              OptimizerStateBytesPerParam(slot_config_))),
      kept_weights_bytes_(StateBytes(plan_.shard(server_index).size(),
                                     2 * DTypeSize(config_.weight_dtype))) {}

}  // namespace depot
