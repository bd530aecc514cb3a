// The checkpoint file format (server/checkpoint_format.h): what is written
// reads back bit for bit, and any truncation or flipped bit is DATA_LOSS
// naming the file and the section.
#include "server/checkpoint_format.h"

#include <string>

#include "depot/v1/depot.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/crc32c.h"
#include "server/durable_file.h"
#include "server/job_shape.h"
#include "server/tests/checkpoint_test_util.h"
#include "wire/wire.h"

namespace depot {
namespace {

using ::depot::testing::CheckpointTestConfig;
using ::depot::testing::ExpectSameCheckpoint;
using ::depot::testing::RandomCheckpoint;
using ::depot::testing::ReadFileBytes;
using ::depot::testing::TempDir;
using ::depot::testing::WriteFileBytes;
using ::testing::HasSubstr;

class CheckpointFormatTest : public ::testing::Test {
 protected:
  // Server 1's shard (chunks 1 and 2) at step 9; chunk 2 lacks the
  // workers' state.
  CheckpointFormatTest()
      : checkpoint_(RandomCheckpoint(CheckpointTestConfig(), 1, 9, 5)),
        path_(dir_.path() + "/shard.ckpt") {
    checkpoint_.chunks.back().lacks_worker_state = true;
    absl::Status written = WriteFileDurably(
        path_,
        [&](const ByteSink& sink) {
          return EncodeShardCheckpoint(checkpoint_, sink, &encoded_bytes_);
        },
        SystemFileSync());
    EXPECT_TRUE(written.ok()) << written;
    bytes_ = ReadFileBytes(path_);
  }

  // Reads `bytes` written as the shard file; expects DATA_LOSS naming the
  // file and returns the message.
  std::string ExpectDataLoss(const std::string& bytes,
                             const std::string& what) {
    WriteFileBytes(path_, bytes);
    absl::StatusOr<ShardCheckpoint> read = ReadShardCheckpoint(path_);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss)
        << what << ": " << read.status();
    EXPECT_THAT(read.status().message(), HasSubstr(path_)) << what;
    EXPECT_THAT(read.status().message(), HasSubstr("section '")) << what;
    return std::string(read.status().message());
  }

  TempDir dir_;
  ShardCheckpoint checkpoint_;
  std::string path_;
  uint64_t encoded_bytes_ = 0;
  std::string bytes_;
};

TEST_F(CheckpointFormatTest, RoundTripKeepsEveryField) {
  EXPECT_EQ(bytes_.size(), encoded_bytes_);
  EXPECT_EQ(ShardCheckpointBytes(checkpoint_), encoded_bytes_);
  absl::StatusOr<ShardCheckpoint> read = ReadShardCheckpoint(path_);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSameCheckpoint(*read, checkpoint_);
  EXPECT_EQ(read->config.name, "ckpt-job");
  EXPECT_EQ(read->config.optimizer.exp_avg_sq_dtype, DType::kBFloat16);
}

// Encodes `checkpoint` to a string.
std::string Encoded(const ShardCheckpoint& checkpoint) {
  std::string out;
  EXPECT_TRUE(EncodeShardCheckpoint(checkpoint, [&](std::string_view bytes) {
                out.append(bytes);
                return absl::OkStatus();
              }).ok());
  return out;
}

// A capture's checksum (ChunkSnapshot::payload_crc, taken while copying)
// stands in for the writer's: the same bytes either way.
TEST_F(CheckpointFormatTest, ChecksumTakenByTheCaptureWritesTheSameFile) {
  ShardCheckpoint summed = checkpoint_;
  for (ChunkSnapshot& chunk : summed.chunks) {
    uint32_t crc = Crc32c(chunk.master.data(), chunk.master.size());
    for (const std::string& slot : chunk.slots) {
      crc = Crc32cExtend(crc, slot.data(), slot.size());
    }
    chunk.payload_crc = crc;
  }
  EXPECT_EQ(Encoded(summed), bytes_);
}

// The reader checks the bytes, not the writer's word: a capture whose
// checksum does not match its bytes is refused on reading.
TEST_F(CheckpointFormatTest, WrongChecksumFromTheCaptureIsDataLoss) {
  ShardCheckpoint wrong = checkpoint_;
  wrong.chunks.back().payload_crc = 0x12345678u;
  EXPECT_THAT(ExpectDataLoss(Encoded(wrong), "a capture's wrong checksum"),
              HasSubstr("CRC-32C mismatch"));
}

// `bytes` with the file header's version set to 1 (its CRC made anew).
std::string AsVersion1(std::string bytes) {
  bytes[8] = 1;
  const uint32_t crc = Crc32c(bytes.data(), 28);
  for (int i = 0; i < 4; ++i) bytes[28 + i] = static_cast<char>(crc >> (8 * i));
  return bytes;
}

// Version 2 adds the chunks' flag; version 1 files, which have none, still
// read (every chunk holding the workers' state), and a flag in one is
// DATA_LOSS.
TEST_F(CheckpointFormatTest, VersionOneFilesReadWithoutFlags) {
  ShardCheckpoint unflagged = checkpoint_;
  unflagged.chunks.back().lacks_worker_state = false;
  WriteFileBytes(path_, AsVersion1(Encoded(unflagged)));
  absl::StatusOr<ShardCheckpoint> read = ReadShardCheckpoint(path_);
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSameCheckpoint(*read, unflagged);
  EXPECT_THAT(ExpectDataLoss(AsVersion1(bytes_), "a flag in version 1"),
              HasSubstr("unknown section flags 1 in format version 1"));
}

TEST_F(CheckpointFormatTest, FileStartsWithMagicAndVersion) {
  ASSERT_GE(bytes_.size(), 12u);
  EXPECT_EQ(bytes_.substr(0, 8), "DEPOTCKP");
  EXPECT_EQ(static_cast<unsigned char>(bytes_[8]), kCheckpointFormatVersion);
}

TEST_F(CheckpointFormatTest, EveryTruncationIsDataLoss) {
  for (size_t size = 0; size < bytes_.size(); ++size) {
    ExpectDataLoss(bytes_.substr(0, size),
                   "truncated to " + std::to_string(size));
  }
}

TEST_F(CheckpointFormatTest, TruncationNamesTheSectionItCuts) {
  const std::string message =
      ExpectDataLoss(bytes_.substr(0, bytes_.size() - 5), "last chunk cut");
  EXPECT_THAT(message, HasSubstr("section 'chunk 2'"));
  EXPECT_THAT(message, HasSubstr("truncated"));
}

TEST_F(CheckpointFormatTest, EveryBitFlipIsDataLoss) {
  for (size_t byte = 0; byte < bytes_.size(); ++byte) {
    for (int bit : {0, 5}) {
      std::string flipped = bytes_;
      flipped[byte] ^= static_cast<char>(1 << bit);
      ExpectDataLoss(flipped, "bit " + std::to_string(bit) + " of byte " +
                                  std::to_string(byte));
    }
  }
}

TEST_F(CheckpointFormatTest, BitFlipNamesTheSectionAndTheCrc) {
  std::string flipped = bytes_;
  flipped.back() ^= 0x01;  // the last byte of chunk 2's last slot
  const std::string message = ExpectDataLoss(flipped, "chunk 2 payload");
  EXPECT_THAT(message, HasSubstr("section 'chunk 2'"));
  EXPECT_THAT(message, HasSubstr("CRC-32C mismatch"));

  flipped = bytes_;
  flipped[40] ^= 0x01;  // inside the job section's header
  EXPECT_THAT(ExpectDataLoss(flipped, "job section header"),
              HasSubstr("section 'job'"));
}

TEST_F(CheckpointFormatTest, TrailingBytesAreDataLoss) {
  EXPECT_THAT(ExpectDataLoss(bytes_ + "x", "one byte appended"),
              HasSubstr("more bytes follow"));
}

// A well-formed shard file (every CRC right) of 100-odd bytes whose job spec
// is `config` (server 0) and whose first chunk section declares the spec's
// chunk size, followed by no payload: what a crafted or damaged file in a
// directory named to ImportCheckpoint can hold.
std::string CraftedShardFile(const JobConfig& config) {
  const JobShape shape = JobShape::Create(config, 0).value();
  auto u32 = [](std::string& out, uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
  };
  auto u64 = [](std::string& out, uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
  };
  auto section = [&](std::string& out, uint32_t kind, uint64_t index,
                     uint64_t bytes, const std::string& payload) {
    std::string header;
    u32(header, kind);
    u32(header, 0);
    u64(header, index);
    u64(header, bytes);
    u32(header, Crc32c(payload.data(), payload.size()));
    u32(header, Crc32c(header.data(), header.size()));
    out += header + payload;
  };
  v1::JobSpec spec;
  JobConfigToProto(config, &spec);
  const std::string spec_bytes = spec.SerializeAsString();
  std::string job;
  u64(job, shape.fingerprint());
  u64(job, 1);  // step
  u32(job, 0);  // server
  u32(job, config.num_servers);
  u64(job, shape.shard().first_chunk);
  u64(job, shape.shard().end_chunk);
  u32(job, static_cast<uint32_t>(shape.slots()));
  u32(job, static_cast<uint32_t>(spec_bytes.size()));
  job += spec_bytes;
  std::string body;
  section(body, 1, 0, job.size(), job);
  section(body, 2, 0, 8, std::string(8, '\0'));
  const uint64_t chunk_bytes =
      shape.plan().chunk(0).size() * OptimizerStateBytesPerParam(
                                         shape.slot_config());
  section(body, 3, 0, chunk_bytes, "");
  std::string file("DEPOTCKP", 8);
  u32(file, kCheckpointFormatVersion);
  u32(file, 1);  // a shard file
  u64(file, 32 + body.size());
  u32(file, static_cast<uint32_t>(2 + shape.shard().num_chunks()));
  u32(file, Crc32c(file.data(), file.size()));
  return file + body;
}

// Sizes a file declares are checked against its size before anything of
// those sizes is allocated or looped over (issue 13's fuzzing): a chunk of
// 2^40 elements made the reader allocate 4 TiB for its master weights, a
// shard of 2^31 chunks loop over them, from a file of a few hundred bytes.
TEST_F(CheckpointFormatTest, DeclaredSizesBeyondTheFileAreDataLoss) {
  // The largest chunk a valid spec may declare (chunk_elems is bounded so
  // that a chunk's state fits one message): 4 Mi elements, 48 MiB of AdamW
  // state, in a file of a few hundred bytes. (Before that bound a spec could
  // declare 2^40 elements, and the reader allocated 4 TiB.)
  JobConfig huge_chunk = CheckpointTestConfig();
  huge_chunk.tensors = {{"t", uint64_t{1} << 22, 0}};
  huge_chunk.chunk_elems = uint64_t{1} << 22;
  huge_chunk.num_servers = 1;
  EXPECT_THAT(ExpectDataLoss(CraftedShardFile(huge_chunk), "huge chunk"),
              HasSubstr("truncated"));
  JobConfig many_chunks = CheckpointTestConfig();
  many_chunks.tensors = {{"t", uint64_t{1} << 31, 0}};
  many_chunks.chunk_elems = 4;
  many_chunks.num_servers = 1;
  EXPECT_THAT(ExpectDataLoss(CraftedShardFile(many_chunks), "many chunks"),
              HasSubstr("truncated"));
}

TEST_F(CheckpointFormatTest, MissingFileIsNotFound) {
  EXPECT_EQ(ReadShardCheckpoint(dir_.path() + "/absent.ckpt").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CheckpointFormatTest, ManifestRoundTripsAndDetectsDamage) {
  CheckpointManifest manifest;
  manifest.job_name = "a job/with odd name";
  manifest.fingerprint = 0x0123456789ABCDEFull;
  manifest.server_index = 1;
  manifest.num_servers = 2;
  manifest.step = 9;
  manifest.shard_file = "shard-1-of-2.ckpt";
  manifest.shard_file_bytes = encoded_bytes_;
  manifest.lacks_worker_state = true;
  const std::string path = dir_.path() + "/manifest";
  ASSERT_TRUE(
      WriteFileDurably(
          path,
          [&](const ByteSink& sink) { return EncodeManifest(manifest, sink); },
          SystemFileSync())
          .ok());
  absl::StatusOr<CheckpointManifest> read = ReadManifest(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->job_name, manifest.job_name);
  EXPECT_EQ(read->fingerprint, manifest.fingerprint);
  EXPECT_EQ(read->server_index, 1u);
  EXPECT_EQ(read->num_servers, 2u);
  EXPECT_EQ(read->step, 9u);
  EXPECT_EQ(read->shard_file, manifest.shard_file);
  EXPECT_EQ(read->shard_file_bytes, encoded_bytes_);
  EXPECT_TRUE(read->lacks_worker_state);

  const std::string bytes = ReadFileBytes(path);
  for (size_t byte = 0; byte < bytes.size(); ++byte) {
    std::string flipped = bytes;
    flipped[byte] ^= 0x04;
    WriteFileBytes(path, flipped);
    EXPECT_EQ(ReadManifest(path).status().code(), absl::StatusCode::kDataLoss)
        << "byte " << byte;
  }
  // A shard file is not a manifest, nor the other way round.
  EXPECT_EQ(ReadManifest(path_).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace depot
