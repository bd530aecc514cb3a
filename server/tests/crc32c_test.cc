// CRC-32C against published check values, for the portable and the SSE4.2
// implementation alike, at every alignment and length.
#include "server/crc32c.h"

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace depot {
namespace {

using ExtendFn = uint32_t (*)(uint32_t, const void*, size_t);

struct Implementation {
  const char* name;
  ExtendFn extend;
};

std::vector<Implementation> Implementations() {
  std::vector<Implementation> all = {{"portable", &Crc32cPortableExtend},
                                     {"dispatched", &Crc32cExtend}};
  if (Crc32cHardwareAvailable()) {
    all.push_back({"sse4.2", &Crc32cHardwareExtend});
  }
  return all;
}

uint32_t Crc(const Implementation& impl, const std::string& bytes) {
  return impl.extend(0, bytes.data(), bytes.size());
}

TEST(Crc32cTest, HardwarePathIsTestedOnThisMachine) {
  // Every x86-64 CPU the project targets since 2008 has SSE4.2; if this
  // fails the SSE4.2 path below went untested.
  EXPECT_TRUE(Crc32cHardwareAvailable());
}

TEST(Crc32cTest, MatchesTheCheckValue) {
  for (const Implementation& impl : Implementations()) {
    EXPECT_EQ(Crc(impl, "123456789"), 0xE3069283u) << impl.name;
  }
}

TEST(Crc32cTest, MatchesRfc3720Vectors) {
  std::string ascending(32, '\0');
  std::string descending(32, '\0');
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<char>(i);
    descending[i] = static_cast<char>(31 - i);
  }
  for (const Implementation& impl : Implementations()) {
    EXPECT_EQ(Crc(impl, std::string(32, '\0')), 0x8A9136AAu) << impl.name;
    EXPECT_EQ(Crc(impl, std::string(32, '\xFF')), 0x62A8AB43u) << impl.name;
    EXPECT_EQ(Crc(impl, ascending), 0x46DD794Eu) << impl.name;
    EXPECT_EQ(Crc(impl, descending), 0x113FDB5Cu) << impl.name;
  }
}

TEST(Crc32cTest, EmptyInputIsZeroAndExtendsNothing) {
  for (const Implementation& impl : Implementations()) {
    EXPECT_EQ(impl.extend(0, nullptr, 0), 0u) << impl.name;
    EXPECT_EQ(impl.extend(0xE3069283u, nullptr, 0), 0xE3069283u) << impl.name;
  }
}

// Every start offset 0..15 and length 0..300 of a random buffer: the
// implementations agree with a bitwise reference, whole and split in two.
TEST(Crc32cTest, AgreesWithBitwiseReferenceAtEveryAlignmentAndLength) {
  std::mt19937 random(7);
  std::string buffer(320, '\0');
  for (char& c : buffer) c = static_cast<char>(random());
  auto reference = [](const char* p, size_t n) {
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; ++i) {
      crc ^= static_cast<unsigned char>(p[i]);
      for (int bit = 0; bit < 8; ++bit) {
        crc = (crc >> 1) ^ ((crc & 1u) != 0 ? 0x82F63B78u : 0u);
      }
    }
    return ~crc;
  };
  for (const Implementation& impl : Implementations()) {
    for (size_t start = 0; start < 16; ++start) {
      for (size_t n = 0; start + n <= 300; ++n) {
        const char* p = buffer.data() + start;
        const uint32_t expected = reference(p, n);
        ASSERT_EQ(impl.extend(0, p, n), expected)
            << impl.name << " start " << start << " length " << n;
        const size_t cut = n / 3;
        ASSERT_EQ(impl.extend(impl.extend(0, p, cut), p + cut, n - cut),
                  expected)
            << impl.name << " split at " << cut;
      }
    }
  }
}

// The fused copy: every start offset 0..15 of source and destination and
// every length 0..300 copies the bytes and checksums them as Crc32cExtend,
// continued from a checksum of earlier bytes too.
TEST(Crc32cTest, CopyExtendCopiesAndAgreesWithExtend) {
  std::mt19937 random(11);
  std::string source(320, '\0');
  for (char& c : source) c = static_cast<char>(random());
  using CopyExtend = uint32_t (*)(uint32_t, void*, const void*, size_t);
  std::vector<std::pair<std::string, CopyExtend>> all = {
      {"portable", &Crc32cPortableCopyExtend},
      {"dispatched", &Crc32cCopyExtend}};
  if (Crc32cHardwareAvailable()) {
    all.push_back({"sse4.2", &Crc32cHardwareCopyExtend});
  }
  for (const auto& [name, copy_extend] : all) {
    for (size_t from = 0; from < 16; ++from) {
      for (size_t to = 0; to < 16; ++to) {
        for (size_t n = 0; from + n <= 300; ++n) {
          std::string target(320, '\x77');
          const uint32_t seed = Crc32c("prefix", 6);
          ASSERT_EQ(
              copy_extend(seed, target.data() + to, source.data() + from, n),
              Crc32cExtend(seed, source.data() + from, n))
              << name << " from " << from << " to " << to << " length " << n;
          ASSERT_EQ(target.substr(to, n), source.substr(from, n))
              << name << " from " << from << " to " << to << " length " << n;
          ASSERT_EQ(target.substr(0, to), std::string(to, '\x77'))
              << name << ": wrote before the start";
          ASSERT_EQ(target.find_first_not_of('\x77', to + n), std::string::npos)
              << name << ": wrote past the end";
        }
      }
    }
  }
}

// Long inputs run three chains at once in the SSE4.2 version (rounds of 3 x
// 4096 bytes, joined by a shift table): lengths around whole rounds, at odd
// offsets, agree with the portable version, and the fused copy copies them.
TEST(Crc32cTest, LongInputsAgreeAcrossRoundsAndCopies) {
  std::mt19937 random(13);
  std::string source(5 * 12288 + 64, '\0');
  for (char& c : source) c = static_cast<char>(random());
  std::vector<size_t> lengths = {12287, 12288, 12289, 2 * 12288 + 7,
                                 5 * 12288 + 1};
  for (size_t from : {0, 3, 8}) {
    for (size_t n : lengths) {
      const char* p = source.data() + from;
      const uint32_t expected = Crc32cPortableExtend(0x1234u, p, n);
      EXPECT_EQ(Crc32cExtend(0x1234u, p, n), expected)
          << "from " << from << " length " << n;
      std::string target(n + 16, '\0');
      EXPECT_EQ(Crc32cCopyExtend(0x1234u, target.data() + 5, p, n), expected)
          << "from " << from << " length " << n;
      EXPECT_EQ(target.substr(5, n), std::string(p, n))
          << "from " << from << " length " << n;
    }
  }
}

TEST(Crc32cTest, DetectsEverySingleBitFlip) {
  std::string bytes(64, '\x5A');
  const uint32_t clean = Crc32c(bytes.data(), bytes.size());
  for (size_t bit = 0; bit < bytes.size() * 8; ++bit) {
    bytes[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    EXPECT_NE(Crc32c(bytes.data(), bytes.size()), clean) << "bit " << bit;
    bytes[bit / 8] ^= static_cast<char>(1 << (bit % 8));
  }
}

}  // namespace
}  // namespace depot
