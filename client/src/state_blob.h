// The byte string of Job::SaveState / LoadState. Little-endian:
//
//   8 bytes  magic "DEPOTST\0"
//   u32      format version (3; versions 1 and 2 are still read)
//   u32      number of servers S
//   u64      state fingerprint: Fingerprint() of the job's config with the
//            name cleared, so a state loads into a job of another name; it
//            leaves out the server count (version 3), so a state loads onto
//            any number of servers, its chunks going to the servers that own
//            them now (versions 1 and 2 hashed the server count too, and load
//            only onto as many servers as they were saved from)
//   u64      FNV-1a 64 hash of everything after this field
//   version 2 on: u64 length L and L bytes of the serialized depot.v1.JobSpec
//            the state was saved from, so that loading it into another config
//            can say which fields differ
//   S times: u64 chunk count C, then C times: u64 length L and L bytes of a
//            serialized depot.v1.StateChunk (the server's ExportState message;
//            version 2 states carry a step count per tensor segment, version 1
//            states one per chunk, which loads as every segment's count)
//
// The hash makes a flipped or truncated byte a DATA_LOSS before any server is
// touched.
#ifndef DEPOT_CLIENT_SRC_STATE_BLOB_H_
#define DEPOT_CLIENT_SRC_STATE_BLOB_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "depot/job_config.h"
#include "depot/v1/depot.pb.h"

namespace depot::client_internal {

// The format EncodeStateBlob writes by default.
inline constexpr uint32_t kStateBlobVersion = 3;

struct StateBlob {
  // The format (what the fingerprint covers); EncodeStateBlob writes it.
  uint32_t version = kStateBlobVersion;
  uint64_t fingerprint = 0;
  // The config the state was saved from (version 2); absent in version 1.
  std::optional<v1::JobSpec> spec;
  // [server][i]: the server's chunks in the order it exported them.
  std::vector<std::vector<v1::StateChunk>> servers;
};

// The fingerprint a blob of `config`'s job carries in format `version`: the
// name is not part of it, nor (version 3 on) the server count.
uint64_t StateFingerprint(const JobConfig& config,
                          uint32_t version = kStateBlobVersion);

std::string EncodeStateBlob(const StateBlob& blob);

// DATA_LOSS: wrong magic, unknown version, truncated, trailing bytes, hash
// mismatch or an unparsable chunk.
absl::StatusOr<StateBlob> DecodeStateBlob(std::string_view bytes);

}  // namespace depot::client_internal

#endif  // DEPOT_CLIENT_SRC_STATE_BLOB_H_
