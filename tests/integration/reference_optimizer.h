// ReferenceOptimizer: what a job's state must be, computed in-process with the
// same kernel the server uses (MakeOptimizerKernel) but over the whole flat
// space at once, with none of the server's chunking, threads or arrival order.
// A server is correct when its master weights equal this bit for bit.
#ifndef DEPOT_TESTS_INTEGRATION_REFERENCE_OPTIMIZER_H_
#define DEPOT_TESTS_INTEGRATION_REFERENCE_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "depot/dtype.h"
#include "depot/job_config.h"
#include "depot/layout.h"
#include "server/optimizer/optimizer_kernel.h"

namespace depot::testing {

class ReferenceOptimizer {
 public:
  // REQUIRES: ValidateJobConfig(config).ok().
  explicit ReferenceOptimizer(const JobConfig& config);

  // Sets the master weights from N elements of `dtype`; padding becomes zero.
  // The optimizer slots keep their initial values (InitOptimizerSlots).
  void InitWeights(const void* weights, DType dtype);

  // Applies step `step` (the steps must come in order 1, 2, ...) from the
  // workers' gradients, grads[r] being worker r's N elements of the job's grad
  // dtype: sum = g0 + g1 + ... in rank order in fp32, then the kernel on each
  // tensor segment with its group's lr and weight_decay (`group_hparams`
  // override the job's config).
  void Step(uint64_t step, const std::vector<const void*>& grads,
            const std::vector<GroupHyperParams>& group_hparams);

  // The fp32 master weights, N elements, padding zero.
  const std::vector<float>& master() const { return master_; }

  // The master weights converted to `dtype`: what a Step or Pull returns.
  std::string WeightsAs(DType dtype) const;

 private:
  JobConfig config_;
  Layout layout_;
  std::unique_ptr<OptimizerKernel> kernel_;
  std::vector<float> master_;
  // Each slot's N elements in its dtype (OptimizerSlotDType), as raw bytes;
  // operator new's alignment suits both float and bf16 elements.
  std::vector<unsigned char> slots_[2];
  std::vector<float> sum_;
  std::vector<float> addend_;
};

// A ReferenceOptimizer for `config` after InitWeights(MakeInitialWeights(seed))
// in `init_dtype` and steps 1..last_step with MakeGradients/StepHyperParams.
ReferenceOptimizer TrainReference(const JobConfig& config, DType init_dtype,
                                  uint64_t seed, uint64_t last_step);

}  // namespace depot::testing

#endif  // DEPOT_TESTS_INTEGRATION_REFERENCE_OPTIMIZER_H_
