// The fused update with AVX2 + F16C. Compiled with -mavx2 -mf16c and no -mfma
// (CMakeLists.txt); only called where the CPU has both (KernelsFor).
#include "server/optimizer/fused_update.h"

#if defined(__x86_64__)
#include "server/optimizer/fused_loops.h"
#include "server/optimizer/vec_ops_avx2.h"
#endif

namespace depot::fused {

const IsaKernels& Avx2Kernels() {
#if defined(__x86_64__)
  using Loops = FusedLoops<avx2_isa::Avx2Ops>;
  static constexpr IsaKernels kKernels = {&Loops::Update, &Loops::SumOnly,
                                          &Loops::Encode};
  return kKernels;
#else
  // Never selected off x86-64 (CpuSupportsKernelIsa).
  return ScalarKernels();
#endif
}

}  // namespace depot::fused
