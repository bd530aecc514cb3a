// CudaDevice: Device (device.h) on a CUDA GPU, with the CUDA runtime. Built
// only when CMake finds nvcc (DEPOT_HAVE_CUDA); the rest of the engine does
// not depend on it.
#ifndef DEPOT_CLIENT_SRC_GPU_CUDA_DEVICE_H_
#define DEPOT_CLIENT_SRC_GPU_CUDA_DEVICE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "gpu/device.h"

namespace depot::gpu {

// The device of CUDA ordinal `ordinal`. UNAVAILABLE, saying why, when there
// is no such device (no GPU, no driver, an ordinal past the count).
absl::StatusOr<std::unique_ptr<Device>> MakeCudaDevice(int ordinal);

// The cudaStream_t of a stream a CudaDevice made (as void*, so that this
// header needs no CUDA header), for libraries that take one (NCCL).
// INVALID_ARGUMENT for a stream of another kind of device.
absl::StatusOr<void*> CudaStreamHandle(Stream& stream);

// A Stream of `device` (a CudaDevice) over a cudaStream_t (as void*) that the
// caller owns and keeps alive, such as torch.cuda.current_stream().cuda_stream
// (0 is the legacy default stream). Destroying the Stream leaves it alone.
// INVALID_ARGUMENT when `device` is not a CudaDevice.
absl::StatusOr<std::unique_ptr<Stream>> WrapCudaStream(Device& device,
                                                       void* cuda_stream);

}  // namespace depot::gpu

#endif  // DEPOT_CLIENT_SRC_GPU_CUDA_DEVICE_H_
