#include "depot/shard_plan.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace depot {
namespace {

// floor(s * C / S) without forming s * C, which can overflow 64 bits: with
// C = q * S + r, s * C / S = s * q + (s * r) / S, and s * r < S * S < 2^64.
uint64_t FirstChunkOfServer(uint64_t server, uint64_t num_chunks,
                            uint64_t num_servers) {
  const uint64_t quotient = num_chunks / num_servers;
  const uint64_t remainder = num_chunks % num_servers;
  return server * quotient + (server * remainder) / num_servers;
}

// Flat index where chunk `index` starts; `num_chunks` (one past the last chunk)
// maps to the end of the space. Never overflows: index * chunk_elems <
// total_elems for every real chunk.
uint64_t ChunkStart(uint64_t index, uint64_t num_chunks, uint64_t chunk_elems,
                    uint64_t total_elems) {
  return index < num_chunks ? index * chunk_elems : total_elems;
}

}  // namespace

absl::StatusOr<ShardPlan> ShardPlan::Create(uint64_t total_elems,
                                            uint32_t num_servers,
                                            uint64_t chunk_elems) {
  if (total_elems == 0) {
    return absl::InvalidArgumentError("total_elems: must be > 0");
  }
  if (num_servers == 0) {
    return absl::InvalidArgumentError("num_servers: must be > 0");
  }
  if (num_servers > kMaxServers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_servers: at most ", kMaxServers, ", got ", num_servers));
  }
  if (chunk_elems == 0) {
    return absl::InvalidArgumentError("chunk_elems: must be > 0");
  }
  ShardPlan plan;
  plan.total_elems_ = total_elems;
  plan.chunk_elems_ = chunk_elems;
  plan.num_chunks_ =
      total_elems / chunk_elems + (total_elems % chunk_elems != 0 ? 1 : 0);
  plan.shards_.reserve(num_servers);
  for (uint32_t s = 0; s < num_servers; ++s) {
    ShardRange shard;
    shard.server = s;
    shard.first_chunk = FirstChunkOfServer(s, plan.num_chunks_, num_servers);
    shard.end_chunk =
        FirstChunkOfServer(s + uint64_t{1}, plan.num_chunks_, num_servers);
    shard.begin = ChunkStart(shard.first_chunk, plan.num_chunks_, chunk_elems,
                             total_elems);
    shard.end =
        ChunkStart(shard.end_chunk, plan.num_chunks_, chunk_elems, total_elems);
    plan.shards_.push_back(shard);
  }
  return plan;
}

ChunkRange ShardPlan::chunk(uint64_t index) const {
  return ChunkRange{
      index, ChunkStart(index, num_chunks_, chunk_elems_, total_elems_),
      ChunkStart(index + 1, num_chunks_, chunk_elems_, total_elems_)};
}

uint32_t ShardPlan::ServerOfChunk(uint64_t chunk_index) const {
  // Shard ends never decrease, and each shard starts where the previous ended,
  // so the first shard ending after the chunk holds it (empty shards are
  // skipped).
  const auto it = std::upper_bound(
      shards_.begin(), shards_.end(), chunk_index,
      [](uint64_t c, const ShardRange& shard) { return c < shard.end_chunk; });
  return it->server;
}

}  // namespace depot
