// The optimizer update of the tensors of one chunk, with torch.optim's
// per-tensor semantics: each tensor segment is updated by its param group's
// kernel with its own optimizer step count, and a segment no worker has a
// gradient for is left alone (docs/protocol.md, "Tensors without a
// gradient"). ShardState runs it for every chunk update; depot-bench kernel
// runs it to time the per-tensor bookkeeping against one pass per chunk.
#ifndef DEPOT_SERVER_TENSOR_UPDATE_H_
#define DEPOT_SERVER_TENSOR_UPDATE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "depot/job_config.h"
#include "depot/layout.h"
#include "depot/shard_plan.h"
#include "server/optimizer/gradient_input.h"
#include "server/optimizer/optimizer_kernel.h"

namespace depot {

// One kernel per param group of a job (JobConfig::group_optimizers), or one
// for every group.
class GroupKernels {
 public:
  // REQUIRES: ValidateJobConfig(config).ok().
  explicit GroupKernels(const JobConfig& config);

  const OptimizerKernel& For(uint32_t param_group) const {
    return *kernels_[kernels_.size() == 1 ? 0 : param_group];
  }

 private:
  std::vector<std::unique_ptr<OptimizerKernel>> kernels_;
};

// Where one chunk's state lives: its master weights and each slot's array
// from the chunk's first element on.
struct ChunkArrays {
  float* master = nullptr;
  void* slots[3] = {nullptr, nullptr, nullptr};
  size_t slot_elem_bytes[3] = {0, 0, 0};
};

// For each of `segments`, how many workers' no_grad_tensors bitmaps (one per
// worker; empty: every tensor has a gradient) mark its tensor as absent.
// REQUIRES: every non-empty bitmap covers every segment's tensor.
std::vector<uint32_t> CountAbsentWorkers(
    const std::vector<std::string>& no_grad, const std::vector<Segment>& segments);

// True when bit `tensor` of a no_grad_tensors bitmap is set.
inline bool LacksGradient(const std::string& bitmap, size_t tensor) {
  return !bitmap.empty() &&
         ((static_cast<unsigned char>(bitmap[tensor / 8]) >> (tensor % 8)) & 1u);
}

// Updates the tensor segments of the chunk `range` (`segments`, in order:
// Layout::SegmentsIn) from `grad`, each with its group's kernel and
// hyperparameters and its count tensor_steps[i] + 1 (advanced here), skipping
// a segment whose absent_workers[i] equals config.num_workers; writes the
// chunk's weights, padding and skipped segments included, to `weights`
// (range.size() elements of the weight dtype).
void UpdateChunkTensors(const JobConfig& config, const GroupKernels& kernels,
                        const ChunkRange& range,
                        const std::vector<Segment>& segments,
                        const std::vector<uint32_t>& absent_workers,
                        const GradientInput& grad,
                        const std::vector<GroupHyperParams>& step_groups,
                        const ChunkArrays& arrays,
                        std::vector<uint64_t>& tensor_steps, void* weights);

}  // namespace depot

#endif  // DEPOT_SERVER_TENSOR_UPDATE_H_
