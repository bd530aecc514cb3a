// The fused update with AVX-512 F, BW, VL, DQ and AVX512-BF16's
// vcvtneps2bf16. Compiled with those -m flags (CMakeLists.txt); only called
// where the CPU has them (KernelsFor).
#include "server/optimizer/fused_update.h"

#if defined(__x86_64__)
#include "server/optimizer/fused_loops.h"
#include "server/optimizer/vec_ops_avx512.h"
#endif

namespace depot::fused {

const IsaKernels& Avx512Bf16Kernels() {
#if defined(__x86_64__)
  using Loops = FusedLoops<avx512_isa::Avx512Ops</*kNativeBf16=*/true>>;
  static constexpr IsaKernels kKernels = {&Loops::Update, &Loops::SumOnly,
                                          &Loops::Encode};
  return kKernels;
#else
  // Never selected off x86-64 (CpuSupportsKernelIsa).
  return ScalarKernels();
#endif
}

}  // namespace depot::fused
