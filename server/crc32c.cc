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

ExtendFn ChooseExtend() {
  return Crc32cHardwareAvailable() ? &Crc32cHardwareExtend
                                   : &Crc32cPortableExtend;
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

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  static const ExtendFn extend = ChooseExtend();
  return extend(crc, data, n);
}

}  // namespace depot
