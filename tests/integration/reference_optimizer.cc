#include "reference_optimizer.h"

#include <utility>

#include "training_data.h"

namespace depot::testing {

ReferenceOptimizer::ReferenceOptimizer(const JobConfig& config)
    : config_(config),
      layout_(*Layout::Create(config.tensors, config.alignment_elems)),
      kernel_(MakeOptimizerKernel(config.optimizer)) {
  const uint64_t n = layout_.total_elems();
  master_.assign(n, 0.0f);
  ParamRun whole;
  for (int k = 0; k < OptimizerStateSlots(config.optimizer); ++k) {
    slots_[k].assign(n * DTypeSize(OptimizerSlotDType(config.optimizer, k)), 0);
    whole.slots[k] = slots_[k].data();
  }
  whole.n = n;
  InitOptimizerSlots(config.optimizer, whole);
  sum_.resize(n);
  addend_.resize(n);
}

void ReferenceOptimizer::InitWeights(const void* weights, DType dtype) {
  const uint64_t n = layout_.total_elems();
  std::vector<float> upcast(n);
  ConvertToFloat(dtype, weights, upcast.data(), n);
  master_.assign(n, 0.0f);
  for (const Segment& segment : layout_.SegmentsIn(0, n)) {
    for (uint64_t i = segment.begin; i < segment.end; ++i)
      master_[i] = upcast[i];
  }
}

void ReferenceOptimizer::Step(
    uint64_t step, const std::vector<const void*>& grads,
    const std::vector<GroupHyperParams>& group_hparams) {
  const uint64_t n = layout_.total_elems();
  ConvertToFloat(config_.grad_dtype, grads[0], sum_.data(), n);
  for (size_t rank = 1; rank < grads.size(); ++rank) {
    ConvertToFloat(config_.grad_dtype, grads[rank], addend_.data(), n);
    for (uint64_t i = 0; i < n; ++i) sum_[i] = sum_[i] + addend_[i];
  }
  // Padding of the sum is never read: the kernel runs on tensor segments only.
  for (const Segment& segment : layout_.SegmentsIn(0, n)) {
    UpdateHyperParams hparams{config_.optimizer.lr,
                              config_.optimizer.weight_decay, step};
    for (const GroupHyperParams& group : group_hparams) {
      if (group.param_group == segment.param_group) {
        hparams.lr = group.lr;
        hparams.weight_decay = group.weight_decay;
      }
    }
    ParamRun run;
    run.master = master_.data() + segment.begin;
    for (int k = 0; k < OptimizerStateSlots(config_.optimizer); ++k) {
      run.slots[k] =
          slots_[k].data() +
          segment.begin * DTypeSize(OptimizerSlotDType(config_.optimizer, k));
    }
    run.n = segment.end - segment.begin;
    kernel_->Update(sum_.data() + segment.begin, run, hparams);
  }
}

std::string ReferenceOptimizer::WeightsAs(DType dtype) const {
  std::string bytes(master_.size() * DTypeSize(dtype), '\0');
  ConvertFromFloat(master_.data(), dtype, bytes.data(), master_.size());
  return bytes;
}

ReferenceOptimizer TrainReference(const JobConfig& config, DType init_dtype,
                                  uint64_t seed, uint64_t last_step) {
  ReferenceOptimizer reference(config);
  const Layout layout = *Layout::Create(config.tensors, config.alignment_elems);
  reference.InitWeights(MakeInitialWeights(layout, init_dtype, seed).data(),
                        init_dtype);
  for (uint64_t step = 1; step <= last_step; ++step) {
    std::vector<std::string> grads;
    std::vector<const void*> pointers;
    for (uint32_t rank = 0; rank < config.num_workers; ++rank) {
      grads.push_back(
          MakeGradients(layout, config.grad_dtype, seed, step, rank));
    }
    for (const std::string& g : grads) pointers.push_back(g.data());
    reference.Step(step, pointers, StepHyperParams(step));
  }
  return reference;
}

}  // namespace depot::testing
