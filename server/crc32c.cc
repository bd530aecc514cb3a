#include "server/crc32c.h"

#include <nmmintrin.h>

#include <array>
#include <cstdint>
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

// The SSE4.2 `crc32` instruction has a latency of 3 cycles and a throughput
// of 1: one chain of it runs at a third of its speed. Long inputs are
// therefore cut into rounds of three blocks of kStreamBytes, each summed by
// its own chain, and the three sums are joined with kShift: the raw CRC
// register after kStreamBytes zero bytes is a linear function of the
// register before, tabulated byte by byte.
constexpr size_t kStreamBytes = 4096;

struct ShiftTable {
  std::array<std::array<uint32_t, 256>, 4> t;
};

__attribute__((target("sse4.2"))) uint32_t AfterZeroBlock(uint32_t raw) {
  uint64_t c = raw;
  for (size_t i = 0; i < kStreamBytes; i += 8) c = _mm_crc32_u64(c, 0);
  return static_cast<uint32_t>(c);
}

const ShiftTable& BlockShift() {
  static const ShiftTable* const table = [] {
    auto* shift = new ShiftTable;
    for (int byte = 0; byte < 4; ++byte) {
      for (uint32_t b = 0; b < 256; ++b) {
        shift->t[byte][b] = AfterZeroBlock(b << (8 * byte));
      }
    }
    return shift;
  }();
  return *table;
}

// The raw register `raw` followed by kStreamBytes zero bytes.
uint32_t ShiftOverBlock(const ShiftTable& shift, uint32_t raw) {
  return shift.t[0][raw & 0xFF] ^ shift.t[1][(raw >> 8) & 0xFF] ^
         shift.t[2][(raw >> 16) & 0xFF] ^ shift.t[3][raw >> 24];
}

// The CRC-32C of the n bytes at `src` continued from `crc`; with kCopy, also
// copies them to `dst`, storing the words it summed (so the copy and its sum
// agree even if the source changed meanwhile). Plain stores: with
// non-temporal ones (movnti, three streams at once) capture steps measured
// slower in depot-bench checkpoint on the loaded 2-core machine, though a
// copy alone was not (docs/performance.md, "Tried and not kept").
template <bool kCopy>
__attribute__((target("sse4.2"))) uint32_t HardwareCrc(uint32_t crc,
                                                       unsigned char* dst,
                                                       const unsigned char* src,
                                                       size_t n) {
  uint64_t c = ~crc;
  // Single bytes up to an 8-byte boundary of the source, then words:
  // unaligned loads are legal on x86 but may straddle cache lines.
  for (; n > 0 && (reinterpret_cast<uintptr_t>(src) & 7u) != 0; --n) {
    if constexpr (kCopy) *dst++ = *src;
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *src++);
  }
  if (n >= 3 * kStreamBytes) {
    const ShiftTable& shift = BlockShift();
    for (; n >= 3 * kStreamBytes; n -= 3 * kStreamBytes) {
      uint64_t c1 = 0;
      uint64_t c2 = 0;
      for (size_t i = 0; i < kStreamBytes; i += 8) {
        const uint64_t w0 = LoadU64(src + i);
        const uint64_t w1 = LoadU64(src + kStreamBytes + i);
        const uint64_t w2 = LoadU64(src + 2 * kStreamBytes + i);
        c = _mm_crc32_u64(c, w0);
        c1 = _mm_crc32_u64(c1, w1);
        c2 = _mm_crc32_u64(c2, w2);
        if constexpr (kCopy) {
          std::memcpy(dst + i, &w0, sizeof(w0));
          std::memcpy(dst + kStreamBytes + i, &w1, sizeof(w1));
          std::memcpy(dst + 2 * kStreamBytes + i, &w2, sizeof(w2));
        }
      }
      c = ShiftOverBlock(shift, static_cast<uint32_t>(c)) ^
          static_cast<uint32_t>(c1);
      c = ShiftOverBlock(shift, static_cast<uint32_t>(c)) ^
          static_cast<uint32_t>(c2);
      src += 3 * kStreamBytes;
      if constexpr (kCopy) dst += 3 * kStreamBytes;
    }
  }
  for (; n >= 8; n -= 8, src += 8) {
    const uint64_t word = LoadU64(src);
    c = _mm_crc32_u64(c, word);
    if constexpr (kCopy) {
      std::memcpy(dst, &word, sizeof(word));
      dst += 8;
    }
  }
  for (; n > 0; --n) {
    if constexpr (kCopy) *dst++ = *src;
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *src++);
  }
  return ~static_cast<uint32_t>(c);
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

uint32_t Crc32cPortableCopyExtend(uint32_t crc, void* dst, const void* src,
                                  size_t n) {
  if (n == 0) return crc;
  std::memcpy(dst, src, n);
  return Crc32cPortableExtend(crc, dst, n);
}

uint32_t Crc32cHardwareExtend(uint32_t crc, const void* data, size_t n) {
  return HardwareCrc</*kCopy=*/false>(
      crc, nullptr, static_cast<const unsigned char*>(data), n);
}

uint32_t Crc32cHardwareCopyExtend(uint32_t crc, void* dst, const void* src,
                                  size_t n) {
  return HardwareCrc</*kCopy=*/true>(crc, static_cast<unsigned char*>(dst),
                                     static_cast<const unsigned char*>(src), n);
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
