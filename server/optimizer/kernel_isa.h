// KernelIsa: the instruction set the fused update kernel runs with, chosen at
// run time so that one binary runs on any x86-64 CPU. Every instruction set
// gives bitwise-identical results (docs/optimizers.md, "Instruction sets"):
// IEEE division and square root, no fused multiply-adds, the same operation
// order, and conversions that round exactly like depot/dtype.h.
#ifndef DEPOT_SERVER_OPTIMIZER_KERNEL_ISA_H_
#define DEPOT_SERVER_OPTIMIZER_KERNEL_ISA_H_

#include <string_view>

#include "absl/status/statusor.h"

namespace depot {

// The environment variable that forces an instruction set (tests and
// benchmarks): scalar, avx2 or avx512. Unset or empty: the best one the CPU
// has.
inline constexpr char kKernelIsaEnv[] = "DEPOT_KERNEL_ISA";

enum class KernelIsa {
  // Plain C++, the reference: any x86-64 (or other) CPU.
  kScalar,
  // AVX2 + F16C (no FMA).
  kAvx2,
  // AVX-512 F, BW, VL, DQ; fp32 -> bf16 with integer rounding.
  kAvx512,
  // As kAvx512, with AVX512-BF16's vcvtneps2bf16 for fp32 -> bf16.
  kAvx512Bf16,
};

// "scalar", "avx2", "avx512", "avx512+bf16".
std::string_view KernelIsaName(KernelIsa isa);

// Whether this CPU (and OS) can run `isa`.
bool CpuSupportsKernelIsa(KernelIsa isa);

// The fastest instruction set this CPU supports.
KernelIsa BestKernelIsa();

// Resolves a request as DEPOT_KERNEL_ISA spells it: "" for the best; "scalar",
// "avx2"; "avx512" for kAvx512Bf16 where the CPU has AVX512-BF16, else
// kAvx512. INVALID_ARGUMENT for another name, FAILED_PRECONDITION for an
// instruction set this CPU lacks.
absl::StatusOr<KernelIsa> ResolveKernelIsa(std::string_view request);

// ResolveKernelIsa(getenv(DEPOT_KERNEL_ISA)), with the variable named in the
// error. Programs call it at startup to fail with a clear message; the
// result is what ActiveKernelIsa returns.
absl::StatusOr<KernelIsa> KernelIsaFromEnvironment();

// The instruction set the kernels use by default, resolved once per process
// from DEPOT_KERNEL_ISA. If the variable is invalid, prints the error and
// aborts (call KernelIsaFromEnvironment first to fail gracefully).
KernelIsa ActiveKernelIsa();

}  // namespace depot

#endif  // DEPOT_SERVER_OPTIMIZER_KERNEL_ISA_H_
