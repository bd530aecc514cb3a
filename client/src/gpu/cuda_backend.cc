// libdepot_cuda.so's one export: the table of cuda_backend.h, over the CUDA
// device, the NCCL collective and the CUDA DeviceOptimizer of this build.
#include "gpu/cuda_backend.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "gpu/cuda_device.h"
#if defined(DEPOT_HAVE_NCCL)
#include "gpu/nccl_collective.h"
#endif

namespace depot::gpu {
namespace {

absl::Status NcclUniqueIdOf(char (&id)[128]) {
#if defined(DEPOT_HAVE_NCCL)
  absl::StatusOr<NcclUniqueId> made = NewNcclUniqueId();
  if (!made.ok()) return made.status();
  static_assert(sizeof(made->bytes) == sizeof(id));
  std::memcpy(id, made->bytes, sizeof(id));
  return absl::OkStatus();
#else
  (void)id;
  return absl::UnavailableError(
      "this build of Depot's CUDA backend has no NCCL (CMake did not find "
      "nccl.h and libnccl): a node of one GPU only");
#endif
}

absl::StatusOr<std::unique_ptr<Collective>> MakeCollective(
    const char (&id)[128], int rank, int size, int device_ordinal) {
#if defined(DEPOT_HAVE_NCCL)
  NcclUniqueId nccl_id;
  std::memcpy(nccl_id.bytes, id, sizeof(nccl_id.bytes));
  return MakeNcclCollective(nccl_id, rank, size, device_ordinal);
#else
  (void)id;
  (void)rank;
  (void)size;
  (void)device_ordinal;
  return absl::UnavailableError(
      "this build of Depot's CUDA backend has no NCCL (CMake did not find "
      "nccl.h and libnccl): a node of one GPU only");
#endif
}

const CudaBackend kBackend = {
    &MakeCudaDevice,
    &WrapCudaStream,
    &NcclUniqueIdOf,
    &MakeCollective,
    &MakeCudaDeviceOptimizer,
};

}  // namespace
}  // namespace depot::gpu

extern "C" __attribute__((visibility("default")))
const depot::gpu::CudaBackend* depot_cuda_backend(const char* abi) {
  if (abi == nullptr ||
      std::strcmp(abi, DEPOT_CUDA_BACKEND_ABI " " DEPOT_VERSION_STRING) != 0) {
    return nullptr;
  }
  return &depot::gpu::kBackend;
}
