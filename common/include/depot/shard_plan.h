// ShardPlan: [0, N) cut into chunks of chunk_elems (the last may be shorter) and the
// chunks dealt out to servers as contiguous ranges. A pure function of
// (N, num_servers, chunk_elems): every client and server computes the same plan.
//
// With C chunks and S servers, server s holds chunks [s*C/S, (s+1)*C/S) (integer
// division), so shard sizes differ by at most one chunk. A server may hold no chunk
// when C < S.
#ifndef DEPOT_SHARD_PLAN_H_
#define DEPOT_SHARD_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "depot/export.h"

namespace depot {

struct ChunkRange {
  uint64_t index = 0;
  uint64_t begin = 0;  // flat index, inclusive
  uint64_t end = 0;    // flat index, exclusive
  uint64_t size() const { return end - begin; }
};

struct ShardRange {
  uint32_t server = 0;
  uint64_t begin = 0;        // flat index, inclusive
  uint64_t end = 0;          // flat index, exclusive
  uint64_t first_chunk = 0;  // inclusive
  uint64_t end_chunk = 0;    // exclusive
  uint64_t size() const { return end - begin; }
  uint64_t num_chunks() const { return end_chunk - first_chunk; }
};

class DEPOT_API ShardPlan {
 public:
  // INVALID_ARGUMENT when total_elems, num_servers or chunk_elems is 0.
  static absl::StatusOr<ShardPlan> Create(uint64_t total_elems,
                                          uint32_t num_servers,
                                          uint64_t chunk_elems);

  uint64_t total_elems() const { return total_elems_; }
  uint64_t chunk_elems() const { return chunk_elems_; }
  uint64_t num_chunks() const { return num_chunks_; }
  uint32_t num_servers() const { return static_cast<uint32_t>(shards_.size()); }

  // REQUIRES: index < num_chunks().
  ChunkRange chunk(uint64_t index) const;
  // REQUIRES: server < num_servers().
  const ShardRange& shard(uint32_t server) const { return shards_[server]; }
  // REQUIRES: chunk_index < num_chunks().
  uint32_t ServerOfChunk(uint64_t chunk_index) const;

 private:
  ShardPlan() = default;

  uint64_t total_elems_ = 0;
  uint64_t chunk_elems_ = 0;
  uint64_t num_chunks_ = 0;
  std::vector<ShardRange> shards_;
};

}  // namespace depot

#endif  // DEPOT_SHARD_PLAN_H_
