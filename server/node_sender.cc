#include "server/node_sender.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace depot {

std::string DescribeNodeShape(const NodeShape& shape) {
  if (shape.local_ranks == 0) return "one process (local_ranks 0)";
  return absl::StrCat(shape.local_ranks, " local ranks, bucket_chunks ",
                      shape.bucket_chunks);
}

absl::StatusOr<NodeSender> NodeSender::FromHeader(const ShardPlan& plan,
                                                  uint32_t local_ranks,
                                                  uint32_t local_rank,
                                                  uint64_t bucket_chunks) {
  if (local_ranks == 0) {
    if (local_rank != 0 || bucket_chunks != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Step header: local_ranks is 0 (the worker is one process) but "
          "local_rank is ",
          local_rank, " and bucket_chunks ", bucket_chunks,
          "; a node worker sets local_ranks, one process sets none of the "
          "three"));
    }
    return NodeSender();
  }
  if (local_ranks > kMaxLocalRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("Step header: local_ranks is ", local_ranks,
                     ", more than the ", kMaxLocalRanks,
                     " local ranks a node may have"));
  }
  absl::StatusOr<NodePartition> partition =
      NodePartition::Create(plan, local_ranks, bucket_chunks);
  if (!partition.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Step header: ", partition.status().message()));
  }
  if (local_rank >= local_ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("Step header: local_rank ", local_rank,
                     " is out of range: the node has ", local_ranks,
                     " local ranks"));
  }
  return NodeSender(*std::move(partition), local_rank);
}

NodeShape NodeSender::shape() const {
  if (!partition_.has_value()) return NodeShape();
  return NodeShape{partition_->local_ranks(), partition_->bucket_chunks()};
}

absl::Status NodeSender::CheckOwns(absl::string_view what, uint64_t chunk,
                                   uint64_t step, uint32_t worker_rank) const {
  if (!partition_.has_value()) return absl::OkStatus();
  const uint32_t owner = partition_->OwnerOfChunk(chunk);
  if (owner == local_rank_) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " ", chunk, " of step ", step, " belongs to local rank ", owner,
      " of worker ", worker_rank, "'s ", partition_->local_ranks(),
      " local ranks (bucket_chunks ", partition_->bucket_chunks(),
      "), but local rank ", local_rank_, " sent it"));
}

}  // namespace depot
