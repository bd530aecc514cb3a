// CRC-32C (Castagnoli, polynomial 0x1EDC6F41, reflected; the checksum of
// iSCSI, ext4 and LevelDB) for the sections of checkpoint files. Abseil
// 20220623 has none. Crc32c picks, once per process, the SSE4.2 `crc32`
// instruction when the CPU has it and a table-driven portable version
// otherwise; both give the same values (tests check both against the
// published vectors of RFC 3720 B.4).
#ifndef DEPOT_SERVER_CRC32C_H_
#define DEPOT_SERVER_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace depot {

// The CRC-32C of the n bytes at `data` continued from `crc`, the CRC-32C of
// the bytes before them (0 for none): Crc32cExtend(Crc32c(a), b) ==
// Crc32c(a followed by b). `data` may be null when n is 0.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

// The CRC-32C of the n bytes at `data`.
inline uint32_t Crc32c(const void* data, size_t n) {
  return Crc32cExtend(0, data, n);
}

// Copies the n bytes at `src` to `dst` (they must not overlap) and returns
// the CRC-32C of those bytes continued from `crc`, in one pass over the data
// instead of a copy and then a checksum: a checkpoint capture checksums what
// it copies, so that the writer need not read the copy again.
uint32_t Crc32cCopyExtend(uint32_t crc, void* dst, const void* src, size_t n);

// The two implementations, for tests and benchmarks. Crc32cHardwareExtend
// REQUIRES: Crc32cHardwareAvailable().
bool Crc32cHardwareAvailable();
uint32_t Crc32cPortableExtend(uint32_t crc, const void* data, size_t n);
uint32_t Crc32cHardwareExtend(uint32_t crc, const void* data, size_t n);
uint32_t Crc32cPortableCopyExtend(uint32_t crc, void* dst, const void* src,
                                  size_t n);
uint32_t Crc32cHardwareCopyExtend(uint32_t crc, void* dst, const void* src,
                                  size_t n);

}  // namespace depot

#endif  // DEPOT_SERVER_CRC32C_H_
