// The per-step, per-param-group hyperparameters a Step header carries: their
// validation, their comparison across the headers of one step, and how they
// override the job's optimizer config.
#ifndef DEPOT_SERVER_STEP_HPARAMS_H_
#define DEPOT_SERVER_STEP_HPARAMS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "depot/job_config.h"
#include "depot/layout.h"
#include "server/optimizer/optimizer_kernel.h"

namespace depot {

// INVALID_ARGUMENT when a param group is not in the layout or is listed twice,
// or an lr or weight_decay is negative or not finite.
absl::Status ValidateGroupHyperParams(
    const Layout& layout, const std::vector<GroupHyperParams>& groups);

// True when both lists hold the same entries in the same order.
bool SameGroupHyperParams(const std::vector<GroupHyperParams>& a,
                          const std::vector<GroupHyperParams>& b);

// The hyperparameters of an update of `param_group` at optimizer step `step`:
// the group's entry in step_groups if there is one, else the job's lr and
// weight_decay.
UpdateHyperParams ResolveHyperParams(
    const OptimizerConfig& job_optimizer,
    const std::vector<GroupHyperParams>& step_groups, uint32_t param_group,
    uint64_t step);

}  // namespace depot

#endif  // DEPOT_SERVER_STEP_HPARAMS_H_
