// The jobs and inputs the integration tests train with. Every input is a pure
// function of its arguments, so a test, its in-process reference and a second
// run in another order all see the same bytes.
#ifndef DEPOT_TESTS_INTEGRATION_TRAINING_DATA_H_
#define DEPOT_TESTS_INTEGRATION_TRAINING_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "depot/dtype.h"
#include "depot/job_config.h"
#include "depot/layout.h"

namespace depot::testing {

// A model of about 1.07M parameters in five tensors of two param groups (odd
// sizes, so there is padding), AdamW, chunks of 64Ki elements: 17 chunks, which
// two servers split 8 + 9.
JobConfig LargeJobConfig(std::string name, DType grad_dtype, DType weight_dtype,
                         uint32_t num_workers);

// The same shape scaled down (about 2.7K parameters, chunks of 256 elements, a
// dozen chunks), for tests about protocol behaviour rather than size.
JobConfig SmallJobConfig(std::string name, uint32_t num_workers,
                         uint32_t num_servers);

// N elements of `dtype` (packed bytes) in [-0.5, 0.5); padding holds large
// non-zero garbage, which the server must store as zero.
std::string MakeInitialWeights(const Layout& layout, DType dtype,
                               uint64_t seed);

// Worker `rank`'s gradient for `step`: N elements of `dtype` in [-0.1, 0.1),
// padding filled with garbage the server must ignore.
std::string MakeGradients(const Layout& layout, DType dtype, uint64_t seed,
                          uint64_t step, uint32_t rank);

// The per-group overrides used at `step`: none at step 1 (the job's lr and
// weight_decay apply), then a decaying lr for group 0 and a fixed lr without
// weight decay for group 1.
std::vector<GroupHyperParams> StepHyperParams(uint64_t step);

}  // namespace depot::testing

#endif  // DEPOT_TESTS_INTEGRATION_TRAINING_DATA_H_
