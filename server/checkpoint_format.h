// The checkpoint file format (docs/checkpoints.md): a shard file holds one
// server's shard of one job at one step — the job's spec and fingerprint, the
// step, every tensor segment's optimizer step count, and each chunk's master
// weights and optimizer slots — and a manifest, written after it, names it and
// marks the step complete for that server. Both are a 32-byte file header
// followed by sections, each with its own header; every header and every
// payload carries a CRC-32C, so a reader finds any truncation or flipped bit
// and says in which file and section.
//
// Encoding is streamed through a ByteSink (no second copy of the state);
// decoding reads a file sequentially and stages what it reads.
#ifndef DEPOT_SERVER_CHECKPOINT_FORMAT_H_
#define DEPOT_SERVER_CHECKPOINT_FORMAT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "depot/job_config.h"
#include "server/shard_state.h"

namespace depot {

// The version this code writes, and the oldest it reads (a reader of a later
// version keeps reading the earlier ones). Version 2 adds section flags:
// whether a chunk, or some chunk of a manifest's shard file, lacks the
// workers' state (ChunkSnapshot::lacks_worker_state); version 1 has none.
inline constexpr uint32_t kCheckpointFormatVersion = 2;
inline constexpr uint32_t kOldestCheckpointFormatVersion = 1;

// What a manifest says: the step is complete on this server, in that file.
struct CheckpointManifest {
  std::string job_name;
  uint64_t fingerprint = 0;
  uint32_t server_index = 0;
  uint32_t num_servers = 0;
  uint64_t step = 0;
  std::string shard_file;  // its name, in the manifest's directory
  uint64_t shard_file_bytes = 0;
  // Some chunk of the shard file lacks the workers' state.
  bool lacks_worker_state = false;
};

// Receives the encoded bytes in order; an error stops the encoding.
using ByteSink = std::function<absl::Status(std::string_view bytes)>;

// Encodes `checkpoint`. REQUIRES: its chunks are the shard's chunks of
// (config, server_index), in order, with the job's slot count and sizes.
// Returns the sink's first error. `encoded_bytes`, when not null, receives
// the file's size.
absl::Status EncodeShardCheckpoint(const ShardCheckpoint& checkpoint,
                                   const ByteSink& sink,
                                   uint64_t* encoded_bytes = nullptr);
// The file size EncodeShardCheckpoint produces, without encoding.
uint64_t ShardCheckpointBytes(const ShardCheckpoint& checkpoint);

absl::Status EncodeManifest(const CheckpointManifest& manifest,
                            const ByteSink& sink);

// Reads and verifies the shard file at `path`. DATA_LOSS, naming the file and
// the section, when it is truncated, longer than it says, has a bad CRC, or
// holds values that do not fit its own spec (the chunks of the shard, their
// sizes, one count per tensor segment, each at most the step). NOT_FOUND when
// the file does not exist; another code for other I/O errors.
absl::StatusOr<ShardCheckpoint> ReadShardCheckpoint(const std::string& path);

// Reads and verifies the manifest at `path`; errors as ReadShardCheckpoint.
absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& path);

}  // namespace depot

#endif  // DEPOT_SERVER_CHECKPOINT_FORMAT_H_
