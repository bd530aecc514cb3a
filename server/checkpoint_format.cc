#include "server/checkpoint_format.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "depot/v1/depot.pb.h"
#include "server/crc32c.h"
#include "server/job_shape.h"
#include "wire/wire.h"

namespace depot {
namespace {

constexpr char kMagic[8] = {'D', 'E', 'P', 'O', 'T', 'C', 'K', 'P'};
constexpr size_t kFileHeaderBytes = 32;
constexpr size_t kSectionHeaderBytes = 32;
// A spec is a few KB per thousand tensors; this bounds what a damaged length
// field can make a reader allocate.
constexpr uint64_t kMaxSmallSectionBytes = uint64_t{256} << 20;

enum class FileKind : uint32_t { kShard = 1, kManifest = 2 };
// Section flags (version 2): of a chunk section, the chunk lacks the
// workers' state (ChunkSnapshot::lacks_worker_state); of a manifest, some
// chunk of its shard file does.
constexpr uint32_t kSectionFlagLacksWorkerState = 1;
enum class SectionKind : uint32_t {
  kJob = 1,
  kTensorSteps = 2,
  kChunk = 3,
  kManifest = 4,
};

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::string FileHeader(FileKind kind, uint64_t file_bytes, uint32_t sections) {
  std::string out(kMagic, sizeof(kMagic));
  PutU32(out, kCheckpointFormatVersion);
  PutU32(out, static_cast<uint32_t>(kind));
  PutU64(out, file_bytes);
  PutU32(out, sections);
  PutU32(out, Crc32c(out.data(), out.size()));
  return out;
}

// A section's payload as pieces, so that chunk data is written from where it
// lies.
using Pieces = std::vector<std::string_view>;

uint64_t PiecesBytes(const Pieces& pieces) {
  uint64_t n = 0;
  for (std::string_view piece : pieces) n += piece.size();
  return n;
}

// `payload_crc`, when set, is the payload's CRC-32C taken already (a
// capture's, ChunkSnapshot::payload_crc); else it is computed here.
// `flags` go in the header's second word (version 2; kSectionFlag*).
absl::Status WriteSection(const ByteSink& sink, SectionKind kind,
                          uint64_t index, const Pieces& payload,
                          std::optional<uint32_t> payload_crc = std::nullopt,
                          uint32_t flags = 0) {
  uint32_t crc = 0;
  if (payload_crc.has_value()) {
    crc = *payload_crc;
  } else {
    for (std::string_view piece : payload) {
      crc = Crc32cExtend(crc, piece.data(), piece.size());
    }
  }
  std::string header;
  PutU32(header, static_cast<uint32_t>(kind));
  PutU32(header, flags);
  PutU64(header, index);
  PutU64(header, PiecesBytes(payload));
  PutU32(header, crc);
  PutU32(header, Crc32c(header.data(), header.size()));
  if (absl::Status s = sink(header); !s.ok()) return s;
  for (std::string_view piece : payload) {
    if (piece.empty()) continue;
    if (absl::Status s = sink(piece); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string JobPayload(const ShardCheckpoint& checkpoint,
                       const ShardRange& shard, int slots) {
  v1::JobSpec spec;
  JobConfigToProto(checkpoint.config, &spec);
  const std::string spec_bytes = spec.SerializeAsString();
  std::string out;
  PutU64(out, checkpoint.fingerprint);
  PutU64(out, checkpoint.step);
  PutU32(out, checkpoint.server_index);
  PutU32(out, checkpoint.config.num_servers);
  PutU64(out, shard.first_chunk);
  PutU64(out, shard.end_chunk);
  PutU32(out, static_cast<uint32_t>(slots));
  PutU32(out, static_cast<uint32_t>(spec_bytes.size()));
  out += spec_bytes;
  return out;
}
constexpr size_t kJobFixedBytes = 48;

std::string TensorStepsPayload(const ShardCheckpoint& checkpoint) {
  std::string out;
  for (const ChunkSnapshot& chunk : checkpoint.chunks) {
    for (const uint64_t count : chunk.tensor_steps) PutU64(out, count);
  }
  return out;
}

Pieces ChunkPieces(const ChunkSnapshot& chunk) {
  Pieces pieces = {chunk.master};
  for (const std::string& slot : chunk.slots) pieces.push_back(slot);
  return pieces;
}

// Encodes the sections of a shard file (EncodeShardCheckpoint), or only
// counts their bytes when `sink` is null.
absl::Status EncodeShardSections(const ShardCheckpoint& checkpoint,
                                 const ByteSink* sink, uint64_t* bytes) {
  absl::StatusOr<JobShape> shape =
      JobShape::Create(checkpoint.config, checkpoint.server_index);
  if (!shape.ok()) return shape.status();
  const std::string job =
      JobPayload(checkpoint, shape->shard(), shape->slots());
  const std::string steps = TensorStepsPayload(checkpoint);
  *bytes =
      kFileHeaderBytes + 2 * kSectionHeaderBytes + job.size() + steps.size();
  for (const ChunkSnapshot& chunk : checkpoint.chunks) {
    *bytes += kSectionHeaderBytes + PiecesBytes(ChunkPieces(chunk));
  }
  if (sink == nullptr) return absl::OkStatus();
  const uint32_t sections = 2 + static_cast<uint32_t>(checkpoint.chunks.size());
  if (absl::Status s = (*sink)(FileHeader(FileKind::kShard, *bytes, sections));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = WriteSection(*sink, SectionKind::kJob, 0, {job});
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          WriteSection(*sink, SectionKind::kTensorSteps, 0, {steps});
      !s.ok()) {
    return s;
  }
  for (const ChunkSnapshot& chunk : checkpoint.chunks) {
    if (absl::Status s = WriteSection(
            *sink, SectionKind::kChunk, chunk.index, ChunkPieces(chunk),
            chunk.payload_crc,
            chunk.lacks_worker_state ? kSectionFlagLacksWorkerState : 0);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// Reads a checkpoint file front to back, verifying as it goes; every error
// is DATA_LOSS naming the file and the section being read.
class SectionReader {
 public:
  explicit SectionReader(std::string path) : path_(std::move(path)) {}
  SectionReader(const SectionReader&) = delete;
  SectionReader& operator=(const SectionReader&) = delete;
  ~SectionReader() {
    if (fd_ >= 0) ::close(fd_);
  }

  // Opens the file and checks its header: magic, version, kind, CRC.
  absl::Status Open(FileKind kind) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path_));
    }
    struct stat st;
    if (::fstat(fd_, &st) != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat ", path_));
    }
    actual_bytes_ = static_cast<uint64_t>(st.st_size);
    section_ = "file header";
    char header[kFileHeaderBytes];
    if (absl::Status s = ReadExact(header, sizeof(header)); !s.ok()) return s;
    if (std::memcmp(header, kMagic, sizeof(kMagic)) != 0) {
      return Corrupt("not a Depot checkpoint file (bad magic)");
    }
    const uint32_t crc = Crc32c(header, kFileHeaderBytes - 4);
    if (crc != GetU32(header + 28))
      return CrcMismatch(GetU32(header + 28), crc);
    version_ = GetU32(header + 8);
    if (version_ < kOldestCheckpointFormatVersion ||
        version_ > kCheckpointFormatVersion) {
      return Corrupt(absl::StrCat(
          "format version ", version_, ", this server reads versions ",
          kOldestCheckpointFormatVersion, " to ", kCheckpointFormatVersion));
    }
    if (GetU32(header + 12) != static_cast<uint32_t>(kind)) {
      return Corrupt(absl::StrCat("file kind ", GetU32(header + 12),
                                  ", expected ", static_cast<uint32_t>(kind)));
    }
    file_bytes_ = GetU64(header + 16);
    sections_ = GetU32(header + 24);
    return absl::OkStatus();
  }

  uint32_t sections() const { return sections_; }
  // The flags of the section begun last (BeginSection).
  uint32_t flags() const { return flags_; }

  // Bytes of the file after those read so far (by its size when opened):
  // what the sizes a file declares are checked against before anything of
  // those sizes is allocated, so that a small damaged or crafted file cannot
  // make a reader allocate (or loop over) more than the file holds.
  uint64_t bytes_left() const {
    return actual_bytes_ > offset_ ? actual_bytes_ - offset_ : 0;
  }

  absl::Status Truncated(uint64_t needed) const {
    return Corrupt(absl::StrCat("truncated: the file ends at byte ",
                                actual_bytes_, " (the header says ",
                                file_bytes_, " bytes), ", needed,
                                " more bytes needed after byte ", offset_));
  }

  // Reads the next section's header, which must be of `kind` and, for a
  // chunk, of `index`, with a payload of `expected_bytes` (any size up to
  // kMaxSmallSectionBytes when 0), and no flags but `allowed_flags` (none
  // in version 1), which flags() then returns. `name` names the section in
  // errors.
  absl::StatusOr<uint64_t> BeginSection(SectionKind kind, uint64_t index,
                                        uint64_t expected_bytes,
                                        std::string name,
                                        uint32_t allowed_flags = 0) {
    section_ = std::move(name);
    char header[kSectionHeaderBytes];
    if (absl::Status s = ReadExact(header, sizeof(header)); !s.ok()) return s;
    const uint32_t crc = Crc32c(header, kSectionHeaderBytes - 4);
    if (crc != GetU32(header + 28)) {
      return CrcMismatch(GetU32(header + 28), crc, " of the section header");
    }
    if (GetU32(header) != static_cast<uint32_t>(kind) ||
        GetU64(header + 8) != index) {
      return Corrupt(absl::StrCat("found section kind ", GetU32(header),
                                  " index ", GetU64(header + 8)));
    }
    flags_ = GetU32(header + 4);
    if ((flags_ & ~(version_ >= 2 ? allowed_flags : 0)) != 0) {
      return Corrupt(absl::StrCat("unknown section flags ", flags_,
                                  " in format version ", version_));
    }
    const uint64_t bytes = GetU64(header + 16);
    if (expected_bytes != 0 ? bytes != expected_bytes
                            : bytes > kMaxSmallSectionBytes) {
      return Corrupt(absl::StrCat("payload of ", bytes, " bytes, expected ",
                                  expected_bytes));
    }
    if (bytes > bytes_left()) return Truncated(bytes);
    payload_crc_ = GetU32(header + 24);
    running_crc_ = 0;
    return bytes;
  }

  // Reads n bytes of the current section's payload into `out`.
  absl::Status ReadPayload(char* out, size_t n) {
    if (absl::Status s = ReadExact(out, n); !s.ok()) return s;
    running_crc_ = Crc32cExtend(running_crc_, out, n);
    return absl::OkStatus();
  }

  // After the whole payload: its CRC must match.
  absl::Status EndSection() {
    if (running_crc_ != payload_crc_) {
      return CrcMismatch(payload_crc_, running_crc_, " of the payload");
    }
    return absl::OkStatus();
  }

  // After the last section: nothing may follow, and the size is the header's.
  absl::Status Finish() {
    section_ = "end of file";
    char extra;
    const ssize_t n = ::read(fd_, &extra, 1);
    if (n != 0 || offset_ != file_bytes_) {
      return Corrupt(absl::StrCat("the sections end at byte ", offset_,
                                  ", the header says the file has ",
                                  file_bytes_, " bytes",
                                  n > 0 ? " and more bytes follow" : ""));
    }
    return absl::OkStatus();
  }

  absl::Status Corrupt(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat(
        "checkpoint file ", path_, ", section '", section_, "': ", what));
  }

 private:
  absl::Status CrcMismatch(uint32_t stored, uint32_t computed,
                           absl::string_view of = "") const {
    return Corrupt(absl::StrFormat(
        "CRC-32C mismatch%s (stored %08x, computed %08x): the file is damaged",
        of, stored, computed));
  }

  absl::Status ReadExact(char* out, size_t n) {
    size_t done = 0;
    while (done < n) {
      const ssize_t got = ::read(fd_, out + done, n - done);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        return absl::ErrnoToStatus(
            errno, absl::StrCat("cannot read ", path_, " at byte ", offset_));
      }
      if (got == 0) {
        return Corrupt(absl::StrCat("truncated: the file ends at byte ",
                                    offset_ + done, " (the header says ",
                                    file_bytes_, " bytes)"));
      }
      done += static_cast<size_t>(got);
    }
    offset_ += n;
    return absl::OkStatus();
  }

  const std::string path_;
  int fd_ = -1;
  std::string section_;
  uint64_t offset_ = 0;
  uint64_t actual_bytes_ = 0;  // the file's size when opened
  uint64_t file_bytes_ = 0;
  uint32_t sections_ = 0;
  uint32_t version_ = 0;
  uint32_t flags_ = 0;
  uint32_t payload_crc_ = 0;
  uint32_t running_crc_ = 0;
};

// Reads a whole small section into a string.
absl::StatusOr<std::string> ReadSmallSection(SectionReader& reader,
                                             SectionKind kind,
                                             uint64_t expected_bytes,
                                             std::string name,
                                             uint32_t allowed_flags = 0) {
  absl::StatusOr<uint64_t> bytes = reader.BeginSection(
      kind, 0, expected_bytes, std::move(name), allowed_flags);
  if (!bytes.ok()) return bytes.status();
  std::string payload(*bytes, '\0');
  if (absl::Status s = reader.ReadPayload(payload.data(), payload.size());
      !s.ok()) {
    return s;
  }
  if (absl::Status s = reader.EndSection(); !s.ok()) return s;
  return payload;
}

}  // namespace

absl::Status EncodeShardCheckpoint(const ShardCheckpoint& checkpoint,
                                   const ByteSink& sink,
                                   uint64_t* encoded_bytes) {
  uint64_t bytes = 0;
  absl::Status s = EncodeShardSections(checkpoint, &sink, &bytes);
  if (encoded_bytes != nullptr) *encoded_bytes = bytes;
  return s;
}

uint64_t ShardCheckpointBytes(const ShardCheckpoint& checkpoint) {
  uint64_t bytes = 0;
  EncodeShardSections(checkpoint, nullptr, &bytes).IgnoreError();
  return bytes;
}

absl::Status EncodeManifest(const CheckpointManifest& manifest,
                            const ByteSink& sink) {
  std::string payload;
  PutU64(payload, manifest.fingerprint);
  PutU64(payload, manifest.step);
  PutU32(payload, manifest.server_index);
  PutU32(payload, manifest.num_servers);
  PutU64(payload, manifest.shard_file_bytes);
  PutU32(payload, static_cast<uint32_t>(manifest.job_name.size()));
  PutU32(payload, static_cast<uint32_t>(manifest.shard_file.size()));
  payload += manifest.job_name;
  payload += manifest.shard_file;
  const uint64_t bytes =
      kFileHeaderBytes + kSectionHeaderBytes + payload.size();
  if (absl::Status s = sink(FileHeader(FileKind::kManifest, bytes, 1));
      !s.ok()) {
    return s;
  }
  return WriteSection(
      sink, SectionKind::kManifest, 0, {payload}, std::nullopt,
      manifest.lacks_worker_state ? kSectionFlagLacksWorkerState : 0);
}

absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& path) {
  SectionReader reader(path);
  if (absl::Status s = reader.Open(FileKind::kManifest); !s.ok()) return s;
  absl::StatusOr<std::string> payload =
      ReadSmallSection(reader, SectionKind::kManifest, 0, "manifest",
                       kSectionFlagLacksWorkerState);
  if (!payload.ok()) return payload.status();
  constexpr size_t kFixed = 40;
  if (payload->size() < kFixed) return reader.Corrupt("payload too short");
  const char* p = payload->data();
  CheckpointManifest manifest;
  manifest.lacks_worker_state =
      (reader.flags() & kSectionFlagLacksWorkerState) != 0;
  manifest.fingerprint = GetU64(p);
  manifest.step = GetU64(p + 8);
  manifest.server_index = GetU32(p + 16);
  manifest.num_servers = GetU32(p + 20);
  manifest.shard_file_bytes = GetU64(p + 24);
  const uint64_t name_bytes = GetU32(p + 32);
  const uint64_t file_bytes = GetU32(p + 36);
  if (kFixed + name_bytes + file_bytes != payload->size()) {
    return reader.Corrupt("name lengths do not match the payload");
  }
  manifest.job_name = payload->substr(kFixed, name_bytes);
  manifest.shard_file = payload->substr(kFixed + name_bytes, file_bytes);
  if (absl::Status s = reader.Finish(); !s.ok()) return s;
  return manifest;
}

absl::StatusOr<ShardCheckpoint> ReadShardCheckpoint(const std::string& path) {
  SectionReader reader(path);
  if (absl::Status s = reader.Open(FileKind::kShard); !s.ok()) return s;

  absl::StatusOr<std::string> job =
      ReadSmallSection(reader, SectionKind::kJob, 0, "job");
  if (!job.ok()) return job.status();
  if (job->size() < kJobFixedBytes) return reader.Corrupt("payload too short");
  ShardCheckpoint checkpoint;
  const char* p = job->data();
  checkpoint.fingerprint = GetU64(p);
  checkpoint.step = GetU64(p + 8);
  checkpoint.server_index = GetU32(p + 16);
  const uint64_t first_chunk = GetU64(p + 24);
  const uint64_t end_chunk = GetU64(p + 32);
  const uint32_t slots = GetU32(p + 40);
  if (kJobFixedBytes + GetU32(p + 44) != job->size()) {
    return reader.Corrupt("the spec's length does not match the payload");
  }
  v1::JobSpec spec;
  if (!spec.ParseFromArray(p + kJobFixedBytes,
                           static_cast<int>(job->size() - kJobFixedBytes))) {
    return reader.Corrupt("the job spec does not parse");
  }
  absl::StatusOr<JobConfig> config = JobConfigFromProto(spec);
  if (!config.ok()) {
    return reader.Corrupt(
        absl::StrCat("the job spec is invalid: ", config.status().message()));
  }
  absl::StatusOr<JobShape> shape =
      JobShape::Create(*config, checkpoint.server_index);
  if (!shape.ok()) {
    return reader.Corrupt(
        absl::StrCat("the job spec is invalid: ", shape.status().message()));
  }
  const ShardRange& shard = shape->shard();
  if (first_chunk != shard.first_chunk || end_chunk != shard.end_chunk ||
      slots != static_cast<uint32_t>(shape->slots()) ||
      GetU32(p + 20) != config->num_servers) {
    return reader.Corrupt(absl::StrCat(
        "chunks [", first_chunk, ", ", end_chunk, ") with ", slots,
        " slots do not match the spec's shard [", shard.first_chunk, ", ",
        shard.end_chunk, ") with ", shape->slots()));
  }
  checkpoint.config = *std::move(config);
  if (reader.sections() != 2 + shard.num_chunks()) {
    return reader.Corrupt(
        absl::StrCat("the file header counts ", reader.sections(),
                     " sections, the shard needs ", 2 + shard.num_chunks()));
  }

  // Each chunk has a section, and a section header alone has 32 bytes: a
  // spec of more chunks than that cannot be this file's (checked before the
  // loops over the chunks below).
  if (shard.num_chunks() > reader.bytes_left() / kSectionHeaderBytes) {
    return reader.Truncated(shard.num_chunks() * kSectionHeaderBytes);
  }
  // One count per tensor segment of each chunk, in order.
  std::vector<size_t> segments;
  uint64_t counts = 0;
  for (uint64_t index = shard.first_chunk; index < shard.end_chunk; ++index) {
    const ChunkRange range = shape->plan().chunk(index);
    segments.push_back(
        shape->layout().SegmentsIn(range.begin, range.end).size());
    counts += segments.back();
  }
  absl::StatusOr<std::string> steps = ReadSmallSection(
      reader, SectionKind::kTensorSteps, counts * 8, "tensor steps");
  if (!steps.ok()) return steps.status();
  const char* next_count = steps->data();

  for (uint64_t index = shard.first_chunk; index < shard.end_chunk; ++index) {
    const ChunkRange range = shape->plan().chunk(index);
    ChunkSnapshot& chunk = checkpoint.chunks.emplace_back();
    chunk.index = index;
    chunk.applied_step = checkpoint.step;
    for (size_t i = 0; i < segments[index - shard.first_chunk]; ++i) {
      const uint64_t count = GetU64(next_count);
      next_count += 8;
      if (count > checkpoint.step) {
        return reader.Corrupt(absl::StrCat(
            "chunk ", index, " has an optimizer step count of ", count,
            ", above the checkpoint's step ", checkpoint.step));
      }
      chunk.tensor_steps.push_back(count);
      chunk.optimizer_step = std::max(chunk.optimizer_step, count);
    }
    // The section's size first (no overflow: a chunk larger than the file
    // is refused), then its buffers, once the file is known to hold them.
    if (range.size() > reader.bytes_left() / sizeof(float)) {
      return reader.Truncated(range.size() * sizeof(float));
    }
    uint64_t bytes = range.size() * sizeof(float);
    for (int k = 0; k < shape->slots(); ++k) {
      bytes += range.size() *
               DTypeSize(OptimizerSlotDType(shape->slot_config(), k));
    }
    if (absl::StatusOr<uint64_t> s = reader.BeginSection(
            SectionKind::kChunk, index, bytes, absl::StrCat("chunk ", index),
            kSectionFlagLacksWorkerState);
        !s.ok()) {
      return s.status();
    }
    chunk.lacks_worker_state =
        (reader.flags() & kSectionFlagLacksWorkerState) != 0;
    chunk.master.resize(range.size() * sizeof(float));
    for (int k = 0; k < shape->slots(); ++k) {
      chunk.slots.emplace_back(
          range.size() * DTypeSize(OptimizerSlotDType(shape->slot_config(), k)),
          '\0');
    }
    if (absl::Status s =
            reader.ReadPayload(chunk.master.data(), chunk.master.size());
        !s.ok()) {
      return s;
    }
    for (std::string& slot : chunk.slots) {
      if (absl::Status s = reader.ReadPayload(slot.data(), slot.size());
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = reader.EndSection(); !s.ok()) return s;
  }
  if (absl::Status s = reader.Finish(); !s.ok()) return s;
  return checkpoint;
}

}  // namespace depot
