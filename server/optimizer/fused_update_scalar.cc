// The fused update in plain C++: the reference every other instruction set
// must match bit for bit, and the fallback for CPUs without AVX2.
#include "server/optimizer/fused_loops.h"
#include "server/optimizer/fused_update.h"
#include "server/optimizer/vec_ops_scalar.h"

namespace depot::fused {

const IsaKernels& ScalarKernels() {
  using Loops = FusedLoops<scalar_isa::ScalarOps>;
  static constexpr IsaKernels kKernels = {&Loops::Update, &Loops::SumOnly,
                                          &Loops::Encode};
  return kKernels;
}

}  // namespace depot::fused
