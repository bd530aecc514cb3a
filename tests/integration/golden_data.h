// GoldenData: the optimizer trajectories tests/golden/generate.py recorded with
// PyTorch (and Lion in float64), read back for the tests that replay them
// through real servers. tests/golden/README.md describes the files.
//
// Vectors here are *packed*: the tensors' elements concatenated in manifest
// order, without the padding a Layout puts between them. ToFlat/ToPacked move
// between that and a job's flat index space.
#ifndef DEPOT_TESTS_INTEGRATION_GOLDEN_DATA_H_
#define DEPOT_TESTS_INTEGRATION_GOLDEN_DATA_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "depot/job_config.h"
#include "depot/layout.h"

namespace depot::testing {

// One recorded run of one optimizer.
struct GoldenCase {
  std::string name;
  // What produced the trajectory, e.g. "torch.optim.Adam float32 ...".
  std::string reference;
  // The case's kind and the fields the manifest sets, under their
  // OptimizerConfig names; every other field keeps its default (lr and
  // weight_decay included: the per-step values below are what apply).
  OptimizerConfig optimizer;
  // hparams[s]: every group's lr and weight_decay at step s + 1.
  std::vector<std::vector<GroupHyperParams>> hparams;
  // The recorded runs, by variant ("torch_default", "torch_avx2", "float64";
  // tests/golden/README.md says what each means): trajectories[v][s] is the
  // packed weights after step s + 1.
  std::map<std::string, std::vector<std::vector<float>>> trajectories;
};

struct GoldenData {
  std::string torch_version;
  std::vector<TensorSpec> tensors;
  uint64_t steps = 0;
  std::vector<float> initial_weights;     // packed
  std::vector<std::vector<float>> grads;  // grads[s]: packed, step s + 1
  std::vector<GoldenCase> cases;

  // The case called `name`, or null.
  const GoldenCase* Find(absl::string_view name) const;
};

// Reads manifest.json and the float32 files it names from `dir`. NOT_FOUND when
// a file is missing; DATA_LOSS when a file is malformed or its size disagrees
// with the manifest; INVALID_ARGUMENT for an optimizer field or kind this
// loader does not know.
absl::StatusOr<GoldenData> LoadGoldenData(const std::string& dir);

// Packed values placed at their tensors' offsets in `layout`; padding is zero.
// REQUIRES: packed.size() == layout.param_elems().
std::vector<float> ToFlat(const Layout& layout,
                          const std::vector<float>& packed);

// The tensors' elements of a flat vector, packed.
// REQUIRES: flat.size() == layout.total_elems().
std::vector<float> ToPacked(const Layout& layout,
                            const std::vector<float>& flat);

}  // namespace depot::testing

#endif  // DEPOT_TESTS_INTEGRATION_GOLDEN_DATA_H_
