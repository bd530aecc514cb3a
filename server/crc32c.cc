#include "server/crc32c.h"

#include <nmmintrin.h>

#include <array>
#include <cstring>

namespace depot {
namespace {

// The reflected Castagnoli polynomial.
constexpr uint32_t kPolynomial = 0x82F63B78u;

// Slicing-by-8 tables: kTables[0] is the classic byte table; kTables[k][b] is
// the CRC of byte b followed by k zero bytes, so eight bytes fold in one round.
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t;
};

constexpr Tables MakeTables() {
  Tables tables{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc >> 1) ^ ((crc & 1u) != 0 ? kPolynomial : 0u);
    }
    tables.t[0][b] = crc;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    for (int k = 1; k < 8; ++k) {
      const uint32_t prev = tables.t[k - 1][b];
      tables.t[k][b] = (prev >> 8) ^ tables.t[0][prev & 0xFFu];
    }
  }
  return tables;
}

constexpr Tables kTables = MakeTables();

uint64_t LoadU64(const unsigned char* p) {
  uint64_t value;
  std::memcpy(&value, p, sizeof(value));  // little-endian host (x86-64)
  return value;
}

using ExtendFn = uint32_t (*)(uint32_t, const void*, size_t);
using CopyExtendFn = uint32_t (*)(uint32_t, void*, const void*, size_t);

ExtendFn ChooseExtend() {
  return Crc32cHardwareAvailable() ? &Crc32cHardwareExtend
                                   : &Crc32cPortableExtend;
}

CopyExtendFn ChooseCopyExtend() {
  return Crc32cHardwareAvailable() ? &Crc32cHardwareCopyExtend
                                   : &Crc32cPortableCopyExtend;
}

}  // namespace

bool Crc32cHardwareAvailable() {
  // Every x86-64 CPU this project runs on is checked at run time: the build
  // machine's flags say nothing about the server's CPU.
  return __builtin_cpu_supports("sse4.2");
}

uint32_t Crc32cPortableExtend(uint32_t crc, const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    const uint64_t word = LoadU64(p) ^ c;
    c = kTables.t[7][word & 0xFF] ^ kTables.t[6][(word >> 8) & 0xFF] ^
        kTables.t[5][(word >> 16) & 0xFF] ^ kTables.t[4][(word >> 24) & 0xFF] ^
        kTables.t[3][(word >> 32) & 0xFF] ^ kTables.t[2][(word >> 40) & 0xFF] ^
        kTables.t[1][(word >> 48) & 0xFF] ^ kTables.t[0][word >> 56];
  }
  for (; n > 0; --n, ++p) c = (c >> 8) ^ kTables.t[0][(c ^ *p) & 0xFFu];
  return ~c;
}

__attribute__((target("sse4.2"))) uint32_t Crc32cHardwareExtend(
    uint32_t crc, const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  // Single bytes up to an 8-byte boundary, then words: unaligned loads are
  // legal on x86 but may straddle cache lines.
  for (; n > 0 && (reinterpret_cast<uintptr_t>(p) & 7u) != 0; --n, ++p) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p);
  }
  for (; n >= 8; n -= 8, p += 8) c = _mm_crc32_u64(c, LoadU64(p));
  for (; n > 0; --n, ++p) c = _mm_crc32_u8(static_cast<uint32_t>(c), *p);
  return ~static_cast<uint32_t>(c);
}

uint32_t Crc32cPortableCopyExtend(uint32_t crc, void* dst, const void* src,
                                  size_t n) {
  if (n == 0) return crc;
  std::memcpy(dst, src, n);
  return Crc32cPortableExtend(crc, dst, n);
}

__attribute__((target("sse4.2"))) uint32_t Crc32cHardwareCopyExtend(
    uint32_t crc, void* dst, const void* src, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(src);
  unsigned char* d = static_cast<unsigned char*>(dst);
  uint64_t c = ~crc;
  // The checksum is taken of the words loaded, and those words are what is
  // stored: the copy and its checksum agree even if the source changed.
  for (; n >= 32; n -= 32, p += 32, d += 32) {
    uint64_t words[4];
    std::memcpy(words, p, sizeof(words));
    c = _mm_crc32_u64(c, words[0]);
    c = _mm_crc32_u64(c, words[1]);
    c = _mm_crc32_u64(c, words[2]);
    c = _mm_crc32_u64(c, words[3]);
    std::memcpy(d, words, sizeof(words));
  }
  for (; n >= 8; n -= 8, p += 8, d += 8) {
    const uint64_t word = LoadU64(p);
    c = _mm_crc32_u64(c, word);
    std::memcpy(d, &word, sizeof(word));
  }
  for (; n > 0; --n, ++p, ++d) {
    *d = *p;
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *d);
  }
  return ~static_cast<uint32_t>(c);
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  static const ExtendFn extend = ChooseExtend();
  return extend(crc, data, n);
}

uint32_t Crc32cCopyExtend(uint32_t crc, void* dst, const void* src, size_t n) {
  static const CopyExtendFn copy_extend = ChooseCopyExtend();
  return copy_extend(crc, dst, src, n);
}

}  // namespace depot
