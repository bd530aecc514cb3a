// Collective: the collectives of one node's G local ranks (one GPU each),
// which the GPU workers use around the trip to the servers: a reduce-scatter
// of the flat gradient buffer (rank g then owns part g, summed over the
// node), an all-gather of the updated weights, and an all-reduce of a few
// scalars (a gradient's sum of squares, a non-finite flag). NCCL implements
// it on GPUs (nccl_collective.h); HostCollective (host_collective.h) between
// the threads of one process, on HostDevice, for tests.
//
// As with NCCL, every rank makes the same calls in the same order, each
// queued on a stream of its own device: it runs when that stream reaches it,
// and the stream's later work waits for it. Buffers are device memory.
#ifndef DEPOT_CLIENT_SRC_GPU_COLLECTIVE_H_
#define DEPOT_CLIENT_SRC_GPU_COLLECTIVE_H_

#include <cstddef>

#include "absl/status/status.h"
#include "depot/dtype.h"
#include "gpu/device.h"

namespace depot::gpu {

class Collective {
 public:
  virtual ~Collective() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // recv[0, count) = the sum over ranks r of send_r[rank() * count,
  // (rank() + 1) * count). `send` holds size() * count elements of `dtype`.
  virtual absl::Status ReduceScatterSum(const void* send, void* recv,
                                        size_t count, DType dtype,
                                        Stream& stream) = 0;
  // recv[r * count, (r + 1) * count) = send of rank r, for every rank r.
  virtual absl::Status AllGather(const void* send, void* recv, size_t count,
                                 DType dtype, Stream& stream) = 0;
  // data[0, count) = the sum over ranks of data[0, count) (fp32, in place).
  virtual absl::Status AllReduceSum(float* data, size_t count,
                                    Stream& stream) = 0;

  // Stops this rank's collectives for good (ncclCommAbort): those queued
  // and not yet done end at once, without computing (their buffers hold
  // whatever they held), so that the streams they hold up can move on;
  // later calls queue nothing and return FAILED_PRECONDITION. For a rank
  // whose peers stopped making calls (a process died, a peer hung), which
  // NCCL cannot tell from a slow one. May be called from any thread, also
  // while another is inside a call of this collective; once is enough.
  virtual void Abort() = 0;
  // OK, or the error that ended the node's collectives without this rank's
  // Abort (ncclCommGetAsyncError: a peer's connection failed; another
  // rank's HostCollective aborted). Any thread.
  virtual absl::Status AsyncError() = 0;
};

}  // namespace depot::gpu

#endif  // DEPOT_CLIENT_SRC_GPU_COLLECTIVE_H_
