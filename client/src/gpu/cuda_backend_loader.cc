// LoadCudaBackend (cuda_backend.h): finds and opens libdepot_cuda.so.
#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gpu/cuda_backend.h"

namespace depot::gpu {
namespace {

// The directory of the object this function is in (libdepot_client.so, or
// the program that links the client statically), with a trailing '/'; empty
// when dladdr cannot tell.
std::string OwnDirectory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<const void*>(&OwnDirectory), &info) == 0 ||
      info.dli_fname == nullptr) {
    return "";
  }
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

absl::StatusOr<const CudaBackend*> Load() {
  std::vector<std::string> candidates;
  if (const char* named = std::getenv("DEPOT_CUDA_BACKEND");
      named != nullptr && *named != '\0') {
    candidates.push_back(named);
  } else {
    if (std::string dir = OwnDirectory(); !dir.empty()) {
      candidates.push_back(dir + kCudaBackendLibrary);
    }
    candidates.push_back(kCudaBackendLibrary);
  }
  std::vector<std::string> failures;
  for (const std::string& file : candidates) {
    // RTLD_LOCAL: the backend's symbols (its private copies of Depot's
    // common code) never resolve anyone else's.
    void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      failures.push_back(why != nullptr ? why : file + ": dlopen failed");
      continue;
    }
    using Entry = const CudaBackend* (*)(const char*);
    auto entry = reinterpret_cast<Entry>(dlsym(handle, "depot_cuda_backend"));
    if (entry == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          file, " is not Depot's CUDA backend: it has no depot_cuda_backend"));
    }
    const CudaBackend* backend =
        entry(DEPOT_CUDA_BACKEND_ABI " " DEPOT_VERSION_STRING);
    if (backend == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          file, " is Depot's CUDA backend from another build (this "
                "libdepot_client wants " DEPOT_CUDA_BACKEND_ABI
                " " DEPOT_VERSION_STRING
                "): install the libdepot_cuda.so built with it"));
    }
    return backend;  // never unloaded: its objects' vtables live there
  }
  return absl::UnavailableError(absl::StrCat(
      "a CUDA engine needs Depot's CUDA backend, ", kCudaBackendLibrary,
      ", which could not be loaded (a build without CUDA has none; it needs "
      "libcudart.so.13 and libnccl.so.2 on the loader's path; "
      "$DEPOT_CUDA_BACKEND may name the file): ",
      absl::StrJoin(failures, "; ")));
}

}  // namespace

absl::StatusOr<const CudaBackend*> LoadCudaBackend() {
  static const absl::StatusOr<const CudaBackend*>* const loaded =
      new absl::StatusOr<const CudaBackend*>(Load());
  return *loaded;
}

}  // namespace depot::gpu
