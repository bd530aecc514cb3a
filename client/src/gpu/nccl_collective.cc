#include "gpu/nccl_collective.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cuda_runtime_api.h"
#include "gpu/cuda_device.h"
#include "nccl.h"

namespace depot::gpu {
namespace {

static_assert(sizeof(NcclUniqueId::bytes) == NCCL_UNIQUE_ID_BYTES);

absl::Status NcclError(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat(what, ": ", ncclGetErrorString(result)));
}

absl::StatusOr<ncclDataType_t> ToNccl(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kFloat16:
      return ncclFloat16;
  }
  return absl::InvalidArgumentError("collective: unknown dtype");
}

class NcclCollective : public Collective {
 public:
  NcclCollective(ncclComm_t comm, int rank, int size)
      : comm_(comm), rank_(rank), size_(size) {}
  ~NcclCollective() override {
    absl::MutexLock lock(&mu_);
    // An aborted communicator is freed already.
    if (!aborted_) ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status ReduceScatterSum(const void* send, void* recv, size_t count,
                                DType dtype, Stream& stream) override {
    absl::StatusOr<ncclDataType_t> type = ToNccl(dtype);
    if (!type.ok()) return type.status();
    absl::StatusOr<void*> s = CudaStreamHandle(stream);
    if (!s.ok()) return s.status();
    return Call("ncclReduceScatter", [&] {
      return ncclReduceScatter(send, recv, count, *type, ncclSum, comm_,
                               static_cast<cudaStream_t>(*s));
    });
  }

  absl::Status AllGather(const void* send, void* recv, size_t count,
                         DType dtype, Stream& stream) override {
    absl::StatusOr<ncclDataType_t> type = ToNccl(dtype);
    if (!type.ok()) return type.status();
    absl::StatusOr<void*> s = CudaStreamHandle(stream);
    if (!s.ok()) return s.status();
    return Call("ncclAllGather", [&] {
      return ncclAllGather(send, recv, count, *type, comm_,
                           static_cast<cudaStream_t>(*s));
    });
  }

  absl::Status AllReduceSum(float* data, size_t count,
                            Stream& stream) override {
    absl::StatusOr<void*> s = CudaStreamHandle(stream);
    if (!s.ok()) return s.status();
    return Call("ncclAllReduce", [&] {
      return ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_,
                           static_cast<cudaStream_t>(*s));
    });
  }

  // ncclCommAbort ends the kernels still waiting for peers and frees the
  // communicator. A call being queued now is given a second to leave NCCL
  // first (queuing returns at once, except at a first collective, whose
  // connection to a dead peer can block: aborting from another thread is
  // what ends that, as PyTorch's watchdog does).
  void Abort() override {
    absl::MutexLock lock(&mu_);
    if (aborted_) return;
    aborted_ = true;
    const auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return calls_ == 0;
    };
    mu_.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(1));
    ncclCommAbort(comm_);
  }

  absl::Status AsyncError() override {
    absl::MutexLock lock(&mu_);
    if (aborted_) return absl::OkStatus();  // this rank's own Abort
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) != ncclSuccess ||
        async == ncclSuccess || async == ncclInProgress) {
      return absl::OkStatus();
    }
    return absl::UnavailableError(
        absl::StrCat("NCCL: ", ncclGetErrorString(async), " (",
                     ncclGetLastError(comm_), ")"));
  }

 private:
  // Runs `call` (a collective queued on comm_) unless the communicator was
  // aborted.
  template <typename F>
  absl::Status Call(const char* what, F call) {
    {
      absl::MutexLock lock(&mu_);
      if (aborted_) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, ": the node's collectives were aborted on this rank"));
      }
      ++calls_;
    }
    const ncclResult_t result = call();
    absl::MutexLock lock(&mu_);
    --calls_;
    return NcclError(result, what);
  }

  const ncclComm_t comm_;
  const int rank_;
  const int size_;
  absl::Mutex mu_;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;  // inside an NCCL call now
};

}  // namespace

absl::StatusOr<NcclUniqueId> NewNcclUniqueId() {
  ncclUniqueId id;
  if (absl::Status s = NcclError(ncclGetUniqueId(&id), "ncclGetUniqueId");
      !s.ok()) {
    return s;
  }
  NcclUniqueId out;
  std::memcpy(out.bytes, id.internal, sizeof(out.bytes));
  return out;
}

absl::StatusOr<std::unique_ptr<Collective>> MakeNcclCollective(
    const NcclUniqueId& id, int rank, int size, int device_ordinal) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MakeNcclCollective: rank ", rank, " is not in [0, ", size, ")"));
  }
  if (const cudaError_t error = cudaSetDevice(device_ordinal);
      error != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat(
        "MakeNcclCollective: cudaSetDevice(", device_ordinal,
        "): ", cudaGetErrorString(error)));
  }
  ncclUniqueId nccl_id;
  std::memcpy(nccl_id.internal, id.bytes, sizeof(id.bytes));
  ncclComm_t comm;
  if (absl::Status s = NcclError(ncclCommInitRank(&comm, size, nccl_id, rank),
                                 "ncclCommInitRank");
      !s.ok()) {
    return s;
  }
  return std::unique_ptr<Collective>(new NcclCollective(comm, rank, size));
}

}  // namespace depot::gpu
