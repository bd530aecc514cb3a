#include "state_blob.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace depot::client_internal {
namespace {

constexpr char kMagic[8] = {'D', 'E', 'P', 'O', 'T', 'S', 'T', '\0'};
// Version 3: the fingerprint leaves the server count out, so the state loads
// onto any number of servers. Version 2 had the same layout with a
// fingerprint that included it; version 1 had no JobSpec either.
constexpr uint32_t kVersion = kStateBlobVersion;
constexpr uint32_t kVersionWithServerCount = 2;
constexpr uint32_t kVersionWithoutSpec = 1;
// magic, version, servers, fingerprint, hash.
constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8 + 8;

uint64_t Fnv1a64(std::string_view bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return hash;
}

void PutU64(std::string& out, uint64_t value) {
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<char>(value >> (8 * i)));
}

void PutU32(std::string& out, uint32_t value) {
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<char>(value >> (8 * i)));
}

// Reads little-endian integers from a byte string; a read past its end fails.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}

  bool U64(uint64_t& value) { return Fixed(8, value); }
  bool U32(uint32_t& value) {
    uint64_t wide = 0;
    if (!Fixed(4, wide)) return false;
    value = static_cast<uint32_t>(wide);
    return true;
  }
  bool Bytes(uint64_t n, std::string_view& out) {
    if (n > bytes_.size() - pos_) return false;
    out = bytes_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  size_t remaining() const { return bytes_.size() - pos_; }

 private:
  bool Fixed(int n, uint64_t& value) {
    if (static_cast<size_t>(n) > remaining()) return false;
    value = 0;
    for (int i = 0; i < n; ++i) {
      value |=
          static_cast<uint64_t>(static_cast<unsigned char>(bytes_[pos_ + i]))
          << (8 * i);
    }
    pos_ += n;
    return true;
  }

  std::string_view bytes_;
  size_t pos_ = 0;
};

absl::Status Corrupt(absl::string_view what) {
  return absl::DataLossError(absl::StrCat(
      "the saved optimizer state is corrupt or truncated: ", what));
}

}  // namespace

uint64_t StateFingerprint(const JobConfig& config, uint32_t version) {
  JobConfig unnamed = config;
  unnamed.name.clear();
  return version >= 3 ? Fingerprint(unnamed)
                      : FingerprintWithServerCount(unnamed);
}

std::string EncodeStateBlob(const StateBlob& blob) {
  // One string of the exact size, each chunk serialized in place and the
  // hash written over its placeholder at the end: a state may be most of
  // the trainer's memory, so no part of it is held twice here.
  const std::string spec =
      blob.spec.has_value() ? blob.spec->SerializeAsString() : std::string();
  size_t size = kHeaderBytes + 8 + spec.size();
  for (const std::vector<v1::StateChunk>& chunks : blob.servers) {
    size += 8;
    for (const v1::StateChunk& chunk : chunks) size += 8 + chunk.ByteSizeLong();
  }
  std::string out(kMagic, sizeof(kMagic));
  out.reserve(size);
  PutU32(out, blob.version);
  PutU32(out, static_cast<uint32_t>(blob.servers.size()));
  PutU64(out, blob.fingerprint);
  PutU64(out, 0);  // the hash, below
  PutU64(out, spec.size());
  out += spec;
  for (const std::vector<v1::StateChunk>& chunks : blob.servers) {
    PutU64(out, chunks.size());
    for (const v1::StateChunk& chunk : chunks) {
      const size_t bytes = chunk.ByteSizeLong();
      PutU64(out, bytes);
      const size_t at = out.size();
      out.resize(at + bytes);
      chunk.SerializeWithCachedSizesToArray(
          reinterpret_cast<uint8_t*>(out.data() + at));
    }
  }
  std::string hash;
  PutU64(hash, Fnv1a64(std::string_view(out).substr(kHeaderBytes)));
  out.replace(kHeaderBytes - 8, 8, hash);
  return out;
}

absl::StatusOr<StateBlob> DecodeStateBlob(std::string_view bytes) {
  if (bytes.size() < kHeaderBytes) return Corrupt("shorter than its header");
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return Corrupt("it does not start with the Depot state magic");
  }
  Reader reader(bytes.substr(sizeof(kMagic)));
  uint32_t version = 0;
  uint32_t servers = 0;
  uint64_t hash = 0;
  StateBlob blob;
  reader.U32(version);
  reader.U32(servers);
  reader.U64(blob.fingerprint);
  reader.U64(hash);
  if (version < kVersionWithoutSpec || version > kVersion) {
    return Corrupt(absl::StrCat("format version ", version,
                                ", this client reads ", kVersionWithoutSpec,
                                " to ", kVersion));
  }
  blob.version = version;
  if (Fnv1a64(bytes.substr(kHeaderBytes)) != hash) {
    return Corrupt("its hash does not match its contents");
  }
  if (version >= kVersionWithServerCount) {
    uint64_t length = 0;
    std::string_view spec;
    if (!reader.U64(length) || !reader.Bytes(length, spec)) {
      return Corrupt("the saved job spec is cut short");
    }
    if (!spec.empty() &&
        !blob.spec.emplace().ParseFromArray(spec.data(),
                                            static_cast<int>(spec.size()))) {
      return Corrupt("the saved job spec does not parse");
    }
  }
  blob.servers.resize(servers);
  for (std::vector<v1::StateChunk>& chunks : blob.servers) {
    uint64_t count = 0;
    if (!reader.U64(count)) return Corrupt("a server's chunk count is missing");
    for (uint64_t i = 0; i < count; ++i) {
      uint64_t length = 0;
      std::string_view message;
      if (!reader.U64(length) || !reader.Bytes(length, message)) {
        return Corrupt("a chunk is cut short");
      }
      if (!chunks.emplace_back().ParseFromArray(
              message.data(), static_cast<int>(message.size()))) {
        return Corrupt("a chunk does not parse");
      }
    }
  }
  if (reader.remaining() != 0) return Corrupt("bytes after the last chunk");
  return blob;
}

}  // namespace depot::client_internal
