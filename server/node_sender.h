// NodeSender: which part of its worker a Step stream speaks for
// (docs/protocol.md, "Node workers").
//
// A worker is either one process, which may send any chunk, or a node of G
// local ranks (GPUs) whose streams each come from one local rank g and may
// carry only the chunks depot::NodePartition gives g. The Step header declares
// which (StepHeader.local_ranks, local_rank, bucket_chunks); FromHeader checks
// it, and every chunk (and weights override) the stream sends is checked
// against it before it touches any state.
#ifndef DEPOT_SERVER_NODE_SENDER_H_
#define DEPOT_SERVER_NODE_SENDER_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "depot/node_partition.h"
#include "depot/shard_plan.h"

namespace depot {

// How a worker is split into processes, as its Step headers declare it:
// local_ranks 0 (and bucket_chunks 0) when the worker is one process. Every
// stream of one worker's step must declare the same NodeShape.
struct NodeShape {
  uint32_t local_ranks = 0;
  uint64_t bucket_chunks = 0;

  bool operator==(const NodeShape&) const = default;
};

// "one process (local_ranks 0)" or "2 local ranks, bucket_chunks 4".
std::string DescribeNodeShape(const NodeShape& shape);

class NodeSender {
 public:
  // More local ranks than any node has GPUs: a header above it is malformed.
  static constexpr uint32_t kMaxLocalRanks = 1024;

  // A stream of a worker that is one process: it may send any chunk.
  NodeSender() = default;

  // The sender a Step header declares for a job of `plan`.
  // INVALID_ARGUMENT: local_ranks 0 with local_rank or bucket_chunks set;
  // local_ranks above kMaxLocalRanks; bucket_chunks 0 or not a multiple of
  // local_ranks (NodePartition::Create); local_rank >= local_ranks.
  static absl::StatusOr<NodeSender> FromHeader(const ShardPlan& plan,
                                               uint32_t local_ranks,
                                               uint32_t local_rank,
                                               uint64_t bucket_chunks);

  bool is_node() const { return partition_.has_value(); }
  uint32_t local_rank() const { return local_rank_; }
  NodeShape shape() const;

  // OK when this sender may send chunk `chunk` of `step` of worker
  // `worker_rank` (always, for a worker that is one process); otherwise
  // INVALID_ARGUMENT naming the chunk's owner: "<what> 5 of step 3 belongs to
  // local rank 1 of worker 0's 2 local ranks (bucket_chunks 4), but local
  // rank 0 sent it", where <what> is e.g. "chunk". REQUIRES: chunk <
  // plan.num_chunks() of the plan given to FromHeader.
  absl::Status CheckOwns(absl::string_view what, uint64_t chunk, uint64_t step,
                         uint32_t worker_rank) const;

 private:
  NodeSender(NodePartition partition, uint32_t local_rank)
      : partition_(partition), local_rank_(local_rank) {}

  std::optional<NodePartition> partition_;
  uint32_t local_rank_ = 0;
};

}  // namespace depot

#endif  // DEPOT_SERVER_NODE_SENDER_H_
