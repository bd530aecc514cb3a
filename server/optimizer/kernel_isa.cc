#include "server/optimizer/kernel_isa.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace depot {

std::string_view KernelIsaName(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kScalar:
      return "scalar";
    case KernelIsa::kAvx2:
      return "avx2";
    case KernelIsa::kAvx512:
      return "avx512";
    case KernelIsa::kAvx512Bf16:
      return "avx512+bf16";
  }
  return "unknown";
}

bool CpuSupportsKernelIsa(KernelIsa isa) {
#if defined(__x86_64__)
  // Also checks that the OS saves the AVX / AVX-512 registers (XCR0).
  __builtin_cpu_init();
  const bool avx2 =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512dq");
  switch (isa) {
    case KernelIsa::kScalar:
      return true;
    case KernelIsa::kAvx2:
      return avx2;
    case KernelIsa::kAvx512:
      return avx512;
    case KernelIsa::kAvx512Bf16:
      return avx512 && __builtin_cpu_supports("avx512bf16");
  }
  return false;
#else
  return isa == KernelIsa::kScalar;
#endif
}

KernelIsa BestKernelIsa() {
  for (KernelIsa isa :
       {KernelIsa::kAvx512Bf16, KernelIsa::kAvx512, KernelIsa::kAvx2}) {
    if (CpuSupportsKernelIsa(isa)) return isa;
  }
  return KernelIsa::kScalar;
}

absl::StatusOr<KernelIsa> ResolveKernelIsa(std::string_view request) {
  if (request.empty()) return BestKernelIsa();
  KernelIsa isa;
  if (request == "scalar") {
    isa = KernelIsa::kScalar;
  } else if (request == "avx2") {
    isa = KernelIsa::kAvx2;
  } else if (request == "avx512") {
    isa = CpuSupportsKernelIsa(KernelIsa::kAvx512Bf16) ? KernelIsa::kAvx512Bf16
                                                       : KernelIsa::kAvx512;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown kernel instruction set \"", std::string(request),
                     "\" (expected scalar, avx2 or avx512)"));
  }
  if (!CpuSupportsKernelIsa(isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("this CPU does not support the \"", std::string(request),
                     "\" kernel instruction set; the best it supports is ",
                     std::string(KernelIsaName(BestKernelIsa()))));
  }
  return isa;
}

absl::StatusOr<KernelIsa> KernelIsaFromEnvironment() {
  const char* value = std::getenv(kKernelIsaEnv);
  absl::StatusOr<KernelIsa> isa =
      ResolveKernelIsa(value == nullptr ? "" : value);
  if (!isa.ok()) {
    return absl::Status(
        isa.status().code(),
        absl::StrCat(kKernelIsaEnv, ": ", isa.status().message()));
  }
  return isa;
}

KernelIsa ActiveKernelIsa() {
  static const KernelIsa active = [] {
    absl::StatusOr<KernelIsa> isa = KernelIsaFromEnvironment();
    if (!isa.ok()) {
      std::fprintf(stderr, "%s\n", std::string(isa.status().message()).c_str());
      std::abort();
    }
    return *isa;
  }();
  return active;
}

}  // namespace depot
