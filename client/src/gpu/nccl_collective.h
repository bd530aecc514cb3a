// Collective (collective.h) over NCCL, for the GPUs of one node. Built when
// CUDA is (DEPOT_HAVE_CUDA) and NCCL's library is found.
#ifndef DEPOT_CLIENT_SRC_GPU_NCCL_COLLECTIVE_H_
#define DEPOT_CLIENT_SRC_GPU_NCCL_COLLECTIVE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "gpu/collective.h"

namespace depot::gpu {

// A communicator's identity: made by one rank (NewNcclUniqueId), sent to the
// node's other ranks (DepotOptimizer sends it over torch.distributed), and
// passed by every rank to MakeNcclCollective.
struct NcclUniqueId {
  char bytes[128];
};

// UNAVAILABLE when NCCL cannot make one (no GPU, no driver).
absl::StatusOr<NcclUniqueId> NewNcclUniqueId();

// Rank `rank` of `size` in the communicator of `id`, on CUDA device
// `device_ordinal`; every rank must call it (it returns once all have).
// Streams passed to its calls must be a CudaDevice's of that ordinal.
// INVALID_ARGUMENT for a rank outside [0, size); UNAVAILABLE when NCCL fails.
absl::StatusOr<std::unique_ptr<Collective>> MakeNcclCollective(
    const NcclUniqueId& id, int rank, int size, int device_ordinal);

}  // namespace depot::gpu

#endif  // DEPOT_CLIENT_SRC_GPU_NCCL_COLLECTIVE_H_
