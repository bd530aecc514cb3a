#include "server/checkpoint_import.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "depot/shard_plan.h"
#include "server/checkpoint_directory.h"

namespace depot {
namespace {

// One old server's part of the step: where its manifest lies, and what it
// says.
struct OldShard {
  std::string step_dir;
  CheckpointManifest manifest;
};

}  // namespace

absl::StatusOr<CheckpointForShard> ReadCheckpointForShard(
    const std::vector<std::string>& checkpoint_dirs, const JobShape& shape,
    uint64_t step, bool keep_chunks) {
  const std::string& name = shape.config().name;
  if (checkpoint_dirs.empty()) {
    return absl::InvalidArgumentError(
        "name the checkpoint directories of the servers that wrote the "
        "checkpoint");
  }
  // Every manifest first: nothing is read of a step that is not complete.
  std::vector<std::string> step_dirs;
  std::map<uint32_t, OldShard> old_shards;
  uint32_t old_num_servers = 0;
  for (const std::string& root : checkpoint_dirs) {
    // The importing job's tenant's checkpoints only (JobKey).
    const std::string step_dir =
        CheckpointStepDirectory(root, shape.key(), step);
    step_dirs.push_back(step_dir);
    for (const std::string& file : ManifestsIn(step_dir)) {
      absl::StatusOr<CheckpointManifest> manifest =
          LoadManifest(step_dir, file, name, step);
      if (!manifest.ok()) return manifest.status();
      if (manifest->fingerprint != shape.fingerprint()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint manifest ", step_dir, "/", file,
            " is of another config of job \"", name, "\" (fingerprint ",
            absl::Hex(manifest->fingerprint), ", the job's is ",
            absl::Hex(shape.fingerprint()), ")"));
      }
      if (old_num_servers != 0 && manifest->num_servers != old_num_servers) {
        return absl::FailedPreconditionError(absl::StrCat(
            step_dir, "/", file, " is of a job of ", manifest->num_servers,
            " servers, another manifest of step ", step, " of one of ",
            old_num_servers, ": name the directories of one run"));
      }
      old_num_servers = manifest->num_servers;
      const uint32_t server = manifest->server_index;
      auto [it, added] =
          old_shards.try_emplace(server, OldShard{step_dir, *manifest});
      if (!added) {
        return absl::FailedPreconditionError(
            absl::StrCat("two manifests of server ", server, " of step ", step,
                         ": in ", it->second.step_dir, " and in ", step_dir));
      }
    }
  }
  if (old_shards.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no checkpoint of step ", step, " of job \"", name,
                     "\" (no manifest) in ", absl::StrJoin(step_dirs, ", ")));
  }
  absl::StatusOr<ShardPlan> old_plan = ShardPlan::Create(
      shape.plan().total_elems(), old_num_servers, shape.plan().chunk_elems());
  if (!old_plan.ok()) return old_plan.status();
  for (uint32_t server = 0; server < old_num_servers; ++server) {
    // A server without chunks writes no checkpoint.
    if (old_plan->shard(server).num_chunks() == 0) continue;
    if (old_shards.count(server) == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the checkpoint of step ", step, " of job \"", name,
          "\" is incomplete: the manifest of server ", server, " of ",
          old_num_servers, " (manifest-", server, "-of-", old_num_servers,
          ") is in none of ", absl::StrJoin(step_dirs, ", ")));
    }
  }

  CheckpointForShard result;
  result.old_num_servers = old_num_servers;
  const ShardRange& shard = shape.shard();
  for (const auto& [server, old] : old_shards) {
    const ShardRange& old_range = old_plan->shard(server);
    if (old_range.end_chunk <= shard.first_chunk ||
        old_range.first_chunk >= shard.end_chunk) {
      continue;  // none of this shard's chunks are in it
    }
    absl::StatusOr<ShardCheckpoint> read =
        LoadShardFile(old.step_dir, old.manifest);
    if (!read.ok()) return read.status();
    result.shard_files.push_back(
        absl::StrCat(old.step_dir, "/", old.manifest.shard_file));
    if (!keep_chunks) continue;
    for (ChunkSnapshot& chunk : read->chunks) {
      if (chunk.index >= shard.first_chunk && chunk.index < shard.end_chunk) {
        result.chunks.push_back(std::move(chunk));
      }
    }
  }
  // The old shards are the old plan's, which the reader checked against each
  // file's spec; this is the last word that they tile the new shard.
  if (keep_chunks) {
    bool tiled = result.chunks.size() == shard.num_chunks();
    for (size_t i = 0; tiled && i < result.chunks.size(); ++i) {
      tiled = result.chunks[i].index == shard.first_chunk + i &&
              result.chunks[i].applied_step == step;
    }
    if (!tiled) {
      return absl::DataLossError(
          absl::StrCat("the checkpoint files of step ", step, " (",
                       absl::StrJoin(result.shard_files, ", "),
                       ") do not hold chunks ", shard.first_chunk, " to ",
                       shard.end_chunk, " exactly once, at step ", step));
    }
  }
  return result;
}

}  // namespace depot
