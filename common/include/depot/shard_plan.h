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

// The most servers a plan may have. A plan holds one ShardRange per server,
// whatever the job's size: without a bound, a CreateJob of a one-element job
// with num_servers 20,000,000 (a 139-byte request) made the server allocate
// and keep 780 MiB that no memory budget counts (found by depot-soak, issue
// 13).
inline constexpr uint32_t kMaxServers = uint32_t{1} << 16;

class DEPOT_API ShardPlan {
 public:
  // INVALID_ARGUMENT when total_elems, num_servers or chunk_elems is 0, or
  // num_servers is above kMaxServers.
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
