#include "server/checksum.h"

#include <string>

#include "gtest/gtest.h"

namespace depot {
namespace {

uint64_t HashOf(const std::string& bytes) {
  Checksum64 hash;
  hash.Update(bytes.data(), bytes.size());
  return hash.Digest();
}

TEST(Checksum64Test, MatchesXxh64ReferenceValues) {
  EXPECT_EQ(HashOf(""), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(HashOf("a"), 0xD24EC4F1A98C6E5BULL);
  EXPECT_EQ(HashOf("abc"), 0x44BC2CF5AD770999ULL);
}

TEST(Checksum64Test, DigestDoesNotDependOnHowBytesAreSplit) {
  std::string bytes;
  for (int i = 0; i < 1000; ++i) bytes.push_back(static_cast<char>(i * 7));
  const uint64_t whole = HashOf(bytes);
  for (size_t split : {1, 7, 31, 32, 33, 64, 999}) {
    Checksum64 hash;
    hash.Update(bytes.data(), split);
    hash.Update(bytes.data() + split, bytes.size() - split);
    EXPECT_EQ(hash.Digest(), whole) << "split at " << split;
  }
}

TEST(Checksum64Test, OneFlippedBitChangesTheDigest) {
  std::string bytes(4096, '\x5a');
  const uint64_t before = HashOf(bytes);
  bytes[2049] ^= 0x10;
  EXPECT_NE(HashOf(bytes), before);
}

}  // namespace
}  // namespace depot
