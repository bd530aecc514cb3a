// Restoring a job's server-side checkpoint onto another server count (the
// ImportCheckpoint RPC, docs/checkpoints.md "Restoring onto another server
// count"). The n old servers each wrote their shard of step t into their own
// --checkpoint_dir; a new server's shard (ShardPlan for m servers) is a
// contiguous chunk range that lies in one or more of the old shards, which are
// contiguous chunk ranges too. Chunk sizes are the same: chunk_elems is part
// of the config, and the fingerprint (which excludes the server count) must
// match.
#ifndef DEPOT_SERVER_CHECKPOINT_IMPORT_H_
#define DEPOT_SERVER_CHECKPOINT_IMPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/job_shape.h"
#include "server/shard_state.h"

namespace depot {

// What ReadCheckpointForShard read.
struct CheckpointForShard {
  uint32_t old_num_servers = 0;
  // The old shard files read, in old server order.
  std::vector<std::string> shard_files;
  // The chunks of the new shard, in index order, each at the step (empty
  // when not kept).
  std::vector<ChunkSnapshot> chunks;
};

// Reads the checkpoint of `step` of `shape`'s job, written by any number of
// servers into `checkpoint_dirs`, for `shape`'s shard. The job is looked for
// by its key (its tenant's directory there, and its name), so a tenant
// imports only its own tenant's checkpoints. First every manifest
// of the step in every directory is read and checked (LoadManifest), and the
// step must be complete: one manifest for each old server with a non-empty
// shard, all of one server count, each with the job's fingerprint. Only then
// are the old shard files that hold chunks of `shape`'s shard read and
// verified (LoadShardFile), one at a time, and their chunks of the new shard
// kept when `keep_chunks` (else dropped: a check only).
// INVALID_ARGUMENT: no directory given. NOT_FOUND: no manifest of the step in
// any directory. FAILED_PRECONDITION: the step is incomplete (naming the
// missing manifest), manifests of several server counts or two of one
// server, or another config's fingerprint. DATA_LOSS naming the file (and
// section) for a damaged manifest or shard file, or one that is missing.
absl::StatusOr<CheckpointForShard> ReadCheckpointForShard(
    const std::vector<std::string>& checkpoint_dirs, const JobShape& shape,
    uint64_t step, bool keep_chunks);

}  // namespace depot

#endif  // DEPOT_SERVER_CHECKPOINT_IMPORT_H_
