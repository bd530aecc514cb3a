#include "server/step_hparams.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"

namespace depot {

absl::Status ValidateGroupHyperParams(
    const Layout& layout, const std::vector<GroupHyperParams>& groups) {
  std::set<uint32_t> layout_groups;
  for (const TensorSpec& tensor : layout.tensors()) {
    layout_groups.insert(tensor.param_group);
  }
  std::set<uint32_t> seen;
  for (const GroupHyperParams& g : groups) {
    if (layout_groups.count(g.param_group) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("group_hparams: param group ", g.param_group,
                       " is not in the job's layout"));
    }
    if (!seen.insert(g.param_group).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group_hparams: param group ", g.param_group, " is listed twice"));
    }
    if (!std::isfinite(g.lr) || g.lr < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("group_hparams: lr of param group ", g.param_group,
                       " must be finite and >= 0, got ", g.lr));
    }
    if (!std::isfinite(g.weight_decay) || g.weight_decay < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group_hparams: weight_decay of param group ", g.param_group,
          " must be finite and >= 0, got ", g.weight_decay));
    }
  }
  return absl::OkStatus();
}

bool SameGroupHyperParams(const std::vector<GroupHyperParams>& a,
                          const std::vector<GroupHyperParams>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(),
                    [](const GroupHyperParams& x, const GroupHyperParams& y) {
                      return x.param_group == y.param_group && x.lr == y.lr &&
                             x.weight_decay == y.weight_decay;
                    });
}

UpdateHyperParams ResolveHyperParams(
    const OptimizerConfig& job_optimizer,
    const std::vector<GroupHyperParams>& step_groups, uint32_t param_group,
    uint64_t step) {
  UpdateHyperParams hparams;
  hparams.lr = job_optimizer.lr;
  hparams.weight_decay = job_optimizer.weight_decay;
  hparams.step = step;
  for (const GroupHyperParams& g : step_groups) {
    if (g.param_group == param_group) {
      hparams.lr = g.lr;
      hparams.weight_decay = g.weight_decay;
      break;
    }
  }
  return hparams;
}

}  // namespace depot
