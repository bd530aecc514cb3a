#include "depot/node_partition.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace depot {

absl::StatusOr<NodePartition> NodePartition::Create(const ShardPlan& plan,
                                                    uint32_t local_ranks,
                                                    uint64_t bucket_chunks) {
  if (local_ranks == 0) {
    return absl::InvalidArgumentError("local_ranks: must be > 0");
  }
  if (bucket_chunks == 0 || bucket_chunks % local_ranks != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bucket_chunks: must be a positive multiple of local_ranks (",
        local_ranks, "), is ", bucket_chunks));
  }
  NodePartition partition;
  partition.local_ranks_ = local_ranks;
  partition.bucket_chunks_ = bucket_chunks;
  partition.chunk_elems_ = plan.chunk_elems();
  partition.num_chunks_ = plan.num_chunks();
  partition.num_buckets_ =
      (plan.num_chunks() + bucket_chunks - 1) / bucket_chunks;
  return partition;
}

ChunkSpan NodePartition::bucket(uint64_t bucket) const {
  const uint64_t first = bucket * bucket_chunks_;
  return {first, std::min(first + bucket_chunks_, num_chunks_)};
}

ChunkSpan NodePartition::padded_bucket(uint64_t b) const {
  const ChunkSpan real = bucket(b);
  const uint64_t g = local_ranks_;
  return {real.first, real.first + (real.size() + g - 1) / g * g};
}

ChunkSpan NodePartition::owned_padded(uint64_t b, uint32_t local_rank) const {
  const ChunkSpan padded = padded_bucket(b);
  const uint64_t part = padded.size() / local_ranks_;
  return {padded.first + local_rank * part,
          padded.first + (local_rank + uint64_t{1}) * part};
}

ChunkSpan NodePartition::owned(uint64_t b, uint32_t local_rank) const {
  const ChunkSpan part = owned_padded(b, local_rank);
  const uint64_t end = std::min(part.end, num_chunks_);
  return {std::min(part.first, end), end};
}

uint32_t NodePartition::OwnerOfChunk(uint64_t chunk) const {
  const ChunkSpan padded = padded_bucket(BucketOfChunk(chunk));
  const uint64_t part = padded.size() / local_ranks_;
  return static_cast<uint32_t>((chunk - padded.first) / part);
}

uint64_t NodePartition::padded_elems() const {
  if (num_buckets_ == 0) return 0;
  return padded_bucket(num_buckets_ - 1).end * chunk_elems_;
}

}  // namespace depot
