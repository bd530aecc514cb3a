// The CUDA backend: the engine's CUDA and NCCL pieces (CudaDevice, the NCCL
// collective, the CUDA DeviceOptimizer) in their own shared library,
// libdepot_cuda.so, which libdepot_client.so loads with dlopen only when a
// trainer asks for a CUDA engine (docs/packaging.md, "The CUDA backend").
//
// Why a separate library: the transfer engine lives in libdepot_client.so
// (one copy of the client per process: a second library with its own copy of
// the generated protobuf code would register the .proto files twice, which
// aborts), and that library must load on a machine without CUDA. So nothing
// in it links libcudart or libnccl; libdepot_cuda.so does, and it holds no
// protobuf or gRPC code.
//
// The boundary is C++ (both libraries come from the same build, and both use
// the system's shared Abseil): one exported C function returns a table of
// factories, after checking that the caller was built from the same sources
// (kCudaBackendAbi). Objects made by the backend are destroyed through their
// virtual destructors; the backend is never unloaded.
#ifndef DEPOT_CLIENT_SRC_GPU_CUDA_BACKEND_H_
#define DEPOT_CLIENT_SRC_GPU_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "depot/job_config.h"
#include "gpu/collective.h"
#include "gpu/device.h"
#include "gpu/device_optimizer.h"

namespace depot::gpu {

// The backend's file name, as dlopen looks for it (its SONAME).
inline constexpr char kCudaBackendLibrary[] = "libdepot_cuda.so.0";
// Caller and backend must agree on this string, else the backend refuses.
// Bump the number whenever CudaBackend or an interface it passes changes.
#define DEPOT_CUDA_BACKEND_ABI "depot-cuda-backend/2"

struct CudaBackend {
  // MakeCudaDevice (cuda_device.h).
  absl::StatusOr<std::unique_ptr<Device>> (*make_device)(int ordinal);
  // A Stream of `device` (one make_device made) over a cudaStream_t the
  // caller owns (torch's current stream); the Stream never destroys it.
  absl::StatusOr<std::unique_ptr<Stream>> (*wrap_stream)(Device& device,
                                                         void* cuda_stream);
  // NCCL: a new unique id (128 bytes) and a communicator from one.
  // UNAVAILABLE when the backend was built without NCCL.
  absl::Status (*nccl_unique_id)(char (&id)[128]);
  absl::StatusOr<std::unique_ptr<Collective>> (*make_collective)(
      const char (&id)[128], int rank, int size, int device_ordinal);
  // MakeCudaDeviceOptimizer (device_optimizer.h).
  absl::StatusOr<std::unique_ptr<DeviceOptimizer>> (*make_optimizer)(
      const JobConfig& config);
};

// Loads libdepot_cuda.so (once per process; later calls return the same
// table or the same error): first from the directory libdepot_client.so (or
// the program) was loaded from, then by the dynamic loader's search
// ($LD_LIBRARY_PATH, the cache). $DEPOT_CUDA_BACKEND names the file to load
// instead. UNAVAILABLE, naming the file and dlerror's reason, when it cannot
// be loaded (a build without CUDA has no backend; a machine without the CUDA
// runtime cannot load it); FAILED_PRECONDITION when it is from another build.
absl::StatusOr<const CudaBackend*> LoadCudaBackend();

}  // namespace depot::gpu

// Exported by libdepot_cuda.so: the table, or null when `abi` is not
// DEPOT_CUDA_BACKEND_ABI " " PROJECT_VERSION (this build's).
extern "C" const depot::gpu::CudaBackend* depot_cuda_backend(const char* abi);

#endif  // DEPOT_CLIENT_SRC_GPU_CUDA_BACKEND_H_
