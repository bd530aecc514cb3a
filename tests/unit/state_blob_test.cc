// The SaveState blob format (client/src/state_blob.h): version 3's
// fingerprint leaves the server count out; version 2 carries the job spec it
// was saved from; version 1 and 2 blobs, saved before, still decode.
#include "state_blob.h"

#include <string>

#include "gtest/gtest.h"

namespace depot::client_internal {
namespace {

StateBlob TwoServerBlob() {
  StateBlob blob;
  blob.fingerprint = 0x1234;
  blob.servers.resize(2);
  blob.version = 2;
  v1::StateChunk& chunk = blob.servers[1].emplace_back();
  chunk.set_index(3);
  chunk.set_applied_step(7);
  chunk.add_tensor_steps(7);
  chunk.add_tensor_steps(2);
  chunk.set_master(std::string(16, '\1'));
  return blob;
}

// Little-endian u32 at `offset` of `bytes`.
void PutU32At(std::string& bytes, size_t offset, uint32_t value) {
  for (int i = 0; i < 4; ++i) bytes[offset + i] = char(value >> (8 * i));
}

TEST(StateBlobTest, CarriesTheJobSpecItWasSavedFrom) {
  StateBlob blob = TwoServerBlob();
  blob.spec.emplace().set_name("run7");
  blob.spec->set_num_servers(2);
  absl::StatusOr<StateBlob> decoded = DecodeStateBlob(EncodeStateBlob(blob));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_TRUE(decoded->spec.has_value());
  EXPECT_EQ(decoded->spec->name(), "run7");
  EXPECT_EQ(decoded->version, 2u);
  EXPECT_EQ(decoded->fingerprint, 0x1234u);
  ASSERT_EQ(decoded->servers[1].size(), 1u);
  EXPECT_EQ(decoded->servers[1][0].tensor_steps_size(), 2);
  EXPECT_EQ(decoded->servers[1][0].tensor_steps(1), 2u);
}

TEST(StateBlobTest, VersionOneBlobsWithoutASpecStillDecode) {
  // A version 1 blob is a version 2 blob without the spec field: build one
  // by hand from the version 2 bytes of a spec-less blob.
  std::string v2 = EncodeStateBlob(TwoServerBlob());
  const size_t header = 8 + 4 + 4 + 8 + 8;
  std::string body = v2.substr(header + 8);  // drops the empty spec's length
  std::string v1 = v2.substr(0, header) + body;
  PutU32At(v1, 8, 1);
  // The hash covers the body.
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char c : body) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  for (int i = 0; i < 8; ++i) v1[8 + 4 + 4 + 8 + i] = char(hash >> (8 * i));
  absl::StatusOr<StateBlob> decoded = DecodeStateBlob(v1);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_FALSE(decoded->spec.has_value());
  ASSERT_EQ(decoded->servers.size(), 2u);
  EXPECT_EQ(decoded->servers[1][0].applied_step(), 7u);
}

TEST(StateBlobTest, VersionThreeIsWrittenByDefaultAndDecodes) {
  StateBlob blob = TwoServerBlob();
  blob.version = StateBlob().version;
  EXPECT_EQ(blob.version, 3u);
  absl::StatusOr<StateBlob> decoded = DecodeStateBlob(EncodeStateBlob(blob));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->version, 3u);
}

TEST(StateBlobTest, OnlyVersionsBeforeThreeFingerprintTheServerCount) {
  JobConfig config;
  config.name = "a";
  config.tensors = {{"w", 1000, 0}};
  config.num_servers = 3;
  JobConfig other = config;
  other.num_servers = 4;
  other.name = std::string(1, 'b');  // never part of a state's fingerprint
  EXPECT_EQ(StateFingerprint(config), StateFingerprint(other));
  EXPECT_EQ(StateFingerprint(config, 3), StateFingerprint(other, 3));
  EXPECT_NE(StateFingerprint(config, 2), StateFingerprint(other, 2));
  other.num_servers = 3;
  EXPECT_EQ(StateFingerprint(config, 2), StateFingerprint(other, 2));
  EXPECT_NE(StateFingerprint(config, 2), StateFingerprint(config, 3));
  other.chunk_elems *= 2;  // everything else still counts
  EXPECT_NE(StateFingerprint(config), StateFingerprint(other));
}

TEST(StateBlobTest, UnknownVersionIsDataLoss) {
  std::string bytes = EncodeStateBlob(TwoServerBlob());
  PutU32At(bytes, 8, 4);
  EXPECT_EQ(DecodeStateBlob(bytes).status().code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace depot::client_internal
