// Fuzz target: checkpoint parsing (server/checkpoint_format.h), the reader
// of shard files and manifests that RollBack and ImportCheckpoint run on
// files the server did not necessarily write itself.
//
// Input: byte 0 holds flags; the rest is the file. Flags:
//   bit 0: a manifest (ReadManifest), else a shard file (ReadShardCheckpoint);
//   bit 1: repair the file's CRCs first (the file header's, each section
//          header's and each payload's, as far as the bytes go), so that the
//          fuzzer gets past the checksums to the checks behind them;
//   bit 2: repair the header's file size to the input's size.
// The file lies in a memfd, read through its /proc/self/fd path (no disk).
// Invariants besides "no crash, no sanitizer report, no allocation over
// libFuzzer's -malloc_limit_mb":
//   - every refusal is DATA_LOSS (the file exists and can be read);
//   - what a reader accepts, encoded again, is read back as the same thing.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "depot/v1/depot.pb.h"
#include "server/checkpoint_format.h"
#include "server/crc32c.h"
#include "server/job_shape.h"
#include "tests/fuzz/fuzz_support.h"
#include "wire/wire.h"

namespace {

constexpr size_t kFileHeaderBytes = 32;
constexpr size_t kSectionHeaderBytes = 32;

uint64_t GetU64(const std::string& s, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(s[at + i]);
  return v;
}
void PutU32(std::string& s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>(v >> (8 * i));
}
void PutU64(std::string& s, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) s[at + i] = static_cast<char>(v >> (8 * i));
}

void RepairCrcs(std::string& file) {
  if (file.size() < kFileHeaderBytes) return;
  PutU32(file, 28, depot::Crc32c(file.data(), 28));
  size_t at = kFileHeaderBytes;
  while (file.size() - at >= kSectionHeaderBytes) {
    const uint64_t bytes = GetU64(file, at + 16);
    const size_t have = file.size() - at - kSectionHeaderBytes;
    const size_t covered = bytes < have ? static_cast<size_t>(bytes) : have;
    PutU32(file, at + 24,
           depot::Crc32c(file.data() + at + kSectionHeaderBytes, covered));
    PutU32(file, at + 28, depot::Crc32c(file.data() + at, 28));
    if (bytes > have) return;
    at += kSectionHeaderBytes + covered;
  }
}

// The path of a memfd holding `bytes`.
std::string InMemoryFile(const std::string& bytes) {
  static const int fd = [] {
    const int fd = memfd_create("depot-fuzz-checkpoint", MFD_CLOEXEC);
    DEPOT_FUZZ_CHECK(fd >= 0, "memfd_create failed");
    return fd;
  }();
  DEPOT_FUZZ_CHECK(ftruncate(fd, 0) == 0, "ftruncate failed");
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = pwrite(fd, bytes.data() + done, bytes.size() - done,
                             static_cast<off_t>(done));
    DEPOT_FUZZ_CHECK(n > 0, "pwrite failed");
    done += static_cast<size_t>(n);
  }
  return "/proc/self/fd/" + std::to_string(fd);
}

std::string Encode(const depot::ShardCheckpoint& checkpoint) {
  std::string out;
  const absl::Status s =
      depot::EncodeShardCheckpoint(checkpoint, [&](std::string_view bytes) {
        out.append(bytes.data(), bytes.size());
        return absl::OkStatus();
      });
  DEPOT_FUZZ_CHECK(s.ok(), "a checkpoint read back does not encode: %s",
                   s.ToString().c_str());
  return out;
}

std::string Encode(const depot::CheckpointManifest& manifest) {
  std::string out;
  const absl::Status s =
      depot::EncodeManifest(manifest, [&](std::string_view bytes) {
        out.append(bytes.data(), bytes.size());
        return absl::OkStatus();
      });
  DEPOT_FUZZ_CHECK(s.ok(), "%s", s.ToString().c_str());
  return out;
}

void CheckRefusal(const absl::Status& s) {
  DEPOT_FUZZ_CHECK(s.code() == absl::StatusCode::kDataLoss, "%s",
                   s.ToString().c_str());
}

bool SameCheckpoint(const depot::ShardCheckpoint& a,
                    const depot::ShardCheckpoint& b) {
  if (a.fingerprint != b.fingerprint || a.step != b.step ||
      a.server_index != b.server_index || a.chunks.size() != b.chunks.size() ||
      depot::Fingerprint(a.config) != depot::Fingerprint(b.config)) {
    return false;
  }
  for (size_t i = 0; i < a.chunks.size(); ++i) {
    const depot::ChunkSnapshot& x = a.chunks[i];
    const depot::ChunkSnapshot& y = b.chunks[i];
    if (x.index != y.index || x.tensor_steps != y.tensor_steps ||
        x.master != y.master || x.slots != y.slots) {
      return false;
    }
  }
  return true;
}

// A small real checkpoint: 2 tensors, AdamW (2 slots), server 1 of 2.
depot::ShardCheckpoint SmallCheckpoint(depot::OptimizerKind kind) {
  depot::JobConfig job;
  job.name = "fuzz-ckpt";
  job.tensors = {{"a", 10, 0}, {"b", 7, 0}};
  job.optimizer.kind = kind;
  job.optimizer.lr = 0.01;
  job.chunk_elems = 4;
  job.alignment_elems = 4;
  job.num_servers = 2;
  const absl::StatusOr<depot::JobConfig> config = job;
  absl::StatusOr<depot::JobShape> shape = depot::JobShape::Create(*config, 1);
  DEPOT_FUZZ_CHECK(shape.ok(), "%s", shape.status().ToString().c_str());
  depot::ShardCheckpoint checkpoint;
  checkpoint.config = *config;
  checkpoint.fingerprint = shape->fingerprint();
  checkpoint.server_index = 1;
  checkpoint.step = 5;
  for (uint64_t c = shape->shard().first_chunk; c < shape->shard().end_chunk;
       ++c) {
    const depot::ChunkRange range = shape->plan().chunk(c);
    depot::ChunkSnapshot& chunk = checkpoint.chunks.emplace_back();
    chunk.index = c;
    chunk.applied_step = 5;
    for (size_t i = 0;
         i < shape->layout().SegmentsIn(range.begin, range.end).size(); ++i) {
      chunk.tensor_steps.push_back(5 - i);
    }
    chunk.optimizer_step = 5;
    chunk.master.assign(range.size() * 4, static_cast<char>(c));
    for (int k = 0; k < shape->slots(); ++k) {
      chunk.slots.emplace_back(
          range.size() * depot::DTypeSize(depot::OptimizerSlotDType(
                             shape->slot_config(), k)),
          static_cast<char>(k + 1));
    }
  }
  return checkpoint;
}

// A shard file (CRCs right) whose spec declares chunks of `chunk_elems`
// elements of a tensor of `numel`, with no chunk payload: what a file can
// declare beyond its own size (the reader once allocated it before reading).
std::string DeclaringFile(uint64_t numel, uint64_t chunk_elems) {
  depot::JobConfig config;
  config.name = "crafted";
  config.tensors = {{"t", numel, 0}};
  config.chunk_elems = chunk_elems;
  config.alignment_elems = 1;
  absl::StatusOr<depot::JobShape> shape = depot::JobShape::Create(config, 0);
  DEPOT_FUZZ_CHECK(shape.ok(), "%s", shape.status().ToString().c_str());
  depot::v1::JobSpec spec;
  depot::JobConfigToProto(config, &spec);
  const std::string spec_bytes = spec.SerializeAsString();
  std::string job(48, '\0');
  PutU64(job, 0, shape->fingerprint());
  PutU64(job, 8, 1);
  PutU32(job, 20, 1);
  PutU64(job, 24, shape->shard().first_chunk);
  PutU64(job, 32, shape->shard().end_chunk);
  PutU32(job, 40, static_cast<uint32_t>(shape->slots()));
  PutU32(job, 44, static_cast<uint32_t>(spec_bytes.size()));
  job += spec_bytes;
  auto section = [](uint32_t kind, uint64_t bytes, const std::string& payload) {
    std::string header(32, '\0');
    PutU32(header, 0, kind);
    PutU64(header, 16, bytes);
    return header + payload;
  };
  std::string file = std::string("DEPOTCKP", 8) + std::string(24, '\0');
  PutU32(file, 8, depot::kCheckpointFormatVersion);
  PutU32(file, 12, 1);
  PutU32(file, 24, static_cast<uint32_t>(2 + shape->shard().num_chunks()));
  file += section(1, job.size(), job);
  file += section(2, 8, std::string(8, '\0'));
  file += section(3, chunk_elems * 12, "");
  PutU64(file, 16, file.size());
  RepairCrcs(file);
  return file;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  depot::fuzz::InputReader in(data, size);
  const uint8_t flags = in.U8();
  std::string file = in.Rest();
  if ((flags & 4) != 0 && file.size() >= kFileHeaderBytes) {
    PutU64(file, 16, file.size());
  }
  if ((flags & 2) != 0) RepairCrcs(file);
  const std::string path = InMemoryFile(file);
  if ((flags & 1) != 0) {
    absl::StatusOr<depot::CheckpointManifest> manifest =
        depot::ReadManifest(path);
    if (!manifest.ok()) {
      CheckRefusal(manifest.status());
      return 0;
    }
    absl::StatusOr<depot::CheckpointManifest> again =
        depot::ReadManifest(InMemoryFile(Encode(*manifest)));
    DEPOT_FUZZ_CHECK(again.ok() && again->job_name == manifest->job_name &&
                         again->shard_file == manifest->shard_file &&
                         again->step == manifest->step &&
                         again->fingerprint == manifest->fingerprint &&
                         again->server_index == manifest->server_index &&
                         again->num_servers == manifest->num_servers &&
                         again->shard_file_bytes == manifest->shard_file_bytes,
                     "a manifest does not read back as itself");
    return 0;
  }
  absl::StatusOr<depot::ShardCheckpoint> checkpoint =
      depot::ReadShardCheckpoint(path);
  if (!checkpoint.ok()) {
    CheckRefusal(checkpoint.status());
    return 0;
  }
  absl::StatusOr<depot::ShardCheckpoint> again =
      depot::ReadShardCheckpoint(InMemoryFile(Encode(*checkpoint)));
  DEPOT_FUZZ_CHECK(again.ok(), "a re-encoded checkpoint is refused: %s",
                   again.status().ToString().c_str());
  DEPOT_FUZZ_CHECK(SameCheckpoint(*checkpoint, *again),
                   "a checkpoint does not read back as itself");
  return 0;
}

std::vector<std::string> DepotFuzzSeeds() {
  std::vector<std::string> seeds;
  for (depot::OptimizerKind kind :
       {depot::OptimizerKind::kAdamW, depot::OptimizerKind::kSgd,
        depot::OptimizerKind::kAdagrad}) {
    const std::string file = Encode(SmallCheckpoint(kind));
    seeds.push_back(std::string(1, '\x00') + file);
    seeds.push_back(std::string(1, '\x06') + file);
  }
  // Flags 0: the CRCs are already right, so mutations reach the checks.
  // The largest chunk a valid spec may declare (4 Mi elements, 48 MiB of
  // AdamW state: the chunk_elems bound) in a file of a few hundred bytes.
  seeds.push_back(std::string(1, '\x00') +
                  DeclaringFile(uint64_t{1} << 22, uint64_t{1} << 22));
  seeds.push_back(std::string(1, '\x00') + DeclaringFile(uint64_t{1} << 31, 4));
  depot::CheckpointManifest manifest;
  manifest.job_name = "fuzz-ckpt";
  manifest.fingerprint = 0x0123456789abcdefULL;
  manifest.server_index = 1;
  manifest.num_servers = 2;
  manifest.step = 5;
  manifest.shard_file = "shard-1-of-2.dckp";
  manifest.shard_file_bytes = 1234;
  const std::string file = Encode(manifest);
  seeds.push_back(std::string(1, '\x01') + file);
  seeds.push_back(std::string(1, '\x07') + file);
  return seeds;
}
