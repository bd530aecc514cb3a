// HostCollective: Collective (collective.h) between the threads of one
// process, each rank with its own HostDevice (or one shared), for tests of the
// GPU workers without GPUs. Each call is queued on the rank's stream; when the
// stream reaches it, it waits for the same call of every rank, computes this
// rank's result from the others' buffers, and waits again until every rank
// has read what it needs, so no rank's later work can change a buffer another
// still reads. Sums are taken in rank order in fp32 and rounded to the dtype
// once: deterministic, like the servers' sums.
//
// Ranks that call different collectives, or one with other counts or dtypes,
// at the same position are a bug of the caller: the call then computes
// nothing and the group records the mismatch (errors()), where NCCL would
// hang or corrupt memory.
//
// Abort on any rank ends the whole group's collectives (as a peer's
// ncclCommAbort ends the others' with a remote error): every call waiting
// or queued, on every rank, ends without computing, later calls fail, and
// the other ranks' AsyncError() names the rank that aborted.
#ifndef DEPOT_CLIENT_SRC_GPU_HOST_COLLECTIVE_H_
#define DEPOT_CLIENT_SRC_GPU_HOST_COLLECTIVE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "gpu/collective.h"

namespace depot::gpu {

class HostCollectiveGroup : public std::enable_shared_from_this<HostCollectiveGroup> {
 public:
  // A group of `size` ranks (>= 1).
  static std::shared_ptr<HostCollectiveGroup> Create(int size);

  // Rank `rank`'s collective, queuing its calls on streams of `device`.
  // REQUIRES: 0 <= rank < size, each rank joined once; `device` outlives it.
  std::unique_ptr<Collective> Join(int rank, Device& device);

  // Every mismatch seen so far.
  std::vector<std::string> errors() const;

  // Rank `rank`'s Abort (see the file comment); it returns once no rank
  // reads another's buffers any more.
  void Abort(int rank);
  // OK while the group runs, and for the rank that aborted it.
  absl::Status AsyncError(int rank) const;
  bool aborted() const;

 private:
  friend class HostCollective;
  enum class Op { kReduceScatter, kAllGather, kAllReduce };
  struct Call {
    Op op;
    const void* send;
    void* recv;
    size_t count;
    DType dtype;
  };
  struct Round {
    std::vector<Call> calls;
    int arrived = 0;
    int computed = 0;
    int written = 0;
    int left = 0;
    bool checked = false;
    bool mismatch = false;
  };

  explicit HostCollectiveGroup(int size) : size_(size) {}
  // Runs rank `rank`'s call number `sequence` (see the file comment).
  void Run(int rank, uint64_t sequence, const Call& call);
  // This rank's result of a round whose calls all match, as bytes.
  std::string Compute(int rank, const Round& round) const;

  const int size_;
  mutable absl::Mutex mu_;
  std::map<uint64_t, Round> rounds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> errors_ ABSL_GUARDED_BY(mu_);
  // The rank whose Abort ended the group (-1: none), and the ranks reading
  // others' buffers now (Compute, outside mu_), which Abort waits for.
  int aborted_by_ ABSL_GUARDED_BY(mu_) = -1;
  int computing_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace depot::gpu

#endif  // DEPOT_CLIENT_SRC_GPU_HOST_COLLECTIVE_H_
