// NodePartition: how the G local ranks (GPUs) of one node split the job's
// chunks between them, when the node is one worker (docs/gpu.md, "The node is
// the worker"; docs/protocol.md, "Node workers").
//
// The chunks [0, C) of the ShardPlan are grouped into buckets of
// `bucket_chunks` whole chunks (the last bucket may hold fewer): bucket b is
// chunks [b * bucket_chunks, min((b + 1) * bucket_chunks, C)). bucket_chunks
// is a multiple of G, so that an NCCL reduce-scatter of a bucket's flat
// gradient gives every local rank the same number of whole chunks: local rank
// g owns part g of each bucket, chunks
//   [first + g * P / G, first + (g + 1) * P / G)  of the bucket's chunks,
// where P is the bucket's chunk count rounded up to a multiple of G. Only the
// last bucket can be rounded up; its missing chunks ("phantom" chunks, index
// >= C) pad the device buffers and are never sent. Every chunk has exactly one
// owner, so a node sends each chunk once.
//
// A pure function of (plan, G, bucket_chunks): every local rank, and every
// server checking a node's streams, computes the same partition.
#ifndef DEPOT_NODE_PARTITION_H_
#define DEPOT_NODE_PARTITION_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "depot/export.h"
#include "depot/shard_plan.h"

namespace depot {

// Chunks [first, end) (may be empty).
struct ChunkSpan {
  uint64_t first = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - first; }
  bool empty() const { return end <= first; }
};

class DEPOT_API NodePartition {
 public:
  // INVALID_ARGUMENT: local_ranks 0, bucket_chunks 0 or not a multiple of
  // local_ranks.
  static absl::StatusOr<NodePartition> Create(const ShardPlan& plan,
                                              uint32_t local_ranks,
                                              uint64_t bucket_chunks);

  uint32_t local_ranks() const { return local_ranks_; }
  uint64_t bucket_chunks() const { return bucket_chunks_; }
  uint64_t chunk_elems() const { return chunk_elems_; }
  uint64_t num_chunks() const { return num_chunks_; }
  uint64_t num_buckets() const { return num_buckets_; }

  // REQUIRES: bucket < num_buckets(). Its real chunks.
  ChunkSpan bucket(uint64_t bucket) const;
  // Its chunks rounded up to a multiple of local_ranks() (phantoms included).
  ChunkSpan padded_bucket(uint64_t bucket) const;
  // Chunks of the bucket that local rank `local_rank` owns, phantoms
  // excluded (may be empty). REQUIRES: local_rank < local_ranks().
  ChunkSpan owned(uint64_t bucket, uint32_t local_rank) const;
  // Its part of padded_bucket(bucket), phantoms included: what the
  // reduce-scatter gives it. Always padded_bucket(b).size() / G chunks.
  ChunkSpan owned_padded(uint64_t bucket, uint32_t local_rank) const;
  // REQUIRES: chunk < num_chunks().
  uint64_t BucketOfChunk(uint64_t chunk) const { return chunk / bucket_chunks_; }
  uint32_t OwnerOfChunk(uint64_t chunk) const;
  // Elements of a flat device buffer that holds every padded bucket, every
  // chunk (the last one too) chunk_elems() long:
  // padded_bucket(last).end * chunk_elems().
  uint64_t padded_elems() const;

 private:
  NodePartition() = default;

  uint32_t local_ranks_ = 1;
  uint64_t bucket_chunks_ = 1;
  uint64_t chunk_elems_ = 1;
  uint64_t num_chunks_ = 0;
  uint64_t num_buckets_ = 0;
};

}  // namespace depot

#endif  // DEPOT_NODE_PARTITION_H_
