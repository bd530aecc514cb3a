#include "server/tensor_update.h"

#include "server/step_hparams.h"

namespace depot {

GroupKernels::GroupKernels(const JobConfig& config) {
  if (config.group_optimizers.empty()) {
    kernels_.push_back(MakeOptimizerKernel(config.optimizer));
    return;
  }
  for (const OptimizerConfig& group : config.group_optimizers) {
    kernels_.push_back(MakeOptimizerKernel(group));
  }
}

std::vector<uint32_t> CountAbsentWorkers(
    const std::vector<std::string>& no_grad,
    const std::vector<Segment>& segments) {
  std::vector<uint32_t> absent(segments.size(), 0);
  for (const std::string& bitmap : no_grad) {
    if (bitmap.empty()) continue;
    for (size_t i = 0; i < segments.size(); ++i) {
      absent[i] += LacksGradient(bitmap, segments[i].tensor_index) ? 1 : 0;
    }
  }
  return absent;
}

void UpdateChunkTensors(const JobConfig& config, const GroupKernels& kernels,
                        const ChunkRange& range,
                        const std::vector<Segment>& segments,
                        const std::vector<uint32_t>& absent_workers,
                        const GradientInput& grad,
                        const std::vector<GroupHyperParams>& step_groups,
                        const ChunkArrays& arrays,
                        std::vector<uint64_t>& tensor_steps, void* weights) {
  const DType weight_dtype = config.weight_dtype;
  unsigned char* out = static_cast<unsigned char*>(weights);
  const size_t weight_bytes = DTypeSize(weight_dtype);
  // Padding between the segments, and segments no worker has a gradient for,
  // are not updated, but the answer covers the whole chunk.
  uint64_t pos = range.begin;
  const auto encode_unchanged = [&](uint64_t end) {
    const size_t offset = pos - range.begin;
    EncodeWeights(arrays.master + offset, end - pos,
                  {weight_dtype, out + offset * weight_bytes});
    pos = end;
  };
  for (size_t i = 0; i < segments.size(); ++i) {
    const Segment& segment = segments[i];
    if (absent_workers[i] == config.num_workers) continue;
    encode_unchanged(segment.begin);
    const size_t offset = segment.begin - range.begin;
    GradientInput segment_grad = grad;
    segment_grad.offset = offset;
    const OptimizerConfig& group = GroupOptimizer(config, segment.param_group);
    ParamRun run;
    run.master = arrays.master + offset;
    for (int k = 0; k < OptimizerStateSlots(group); ++k) {
      run.slots[k] = static_cast<unsigned char*>(arrays.slots[k]) +
                     offset * arrays.slot_elem_bytes[k];
    }
    run.n = segment.end - segment.begin;
    kernels.For(segment.param_group)
        .FusedUpdate(segment_grad, run,
                     ResolveHyperParams(group, step_groups,
                                        segment.param_group,
                                        ++tensor_steps[i]),
                     {weight_dtype, out + offset * weight_bytes});
    pos = segment.end;
  }
  encode_unchanged(range.end);
}

}  // namespace depot
