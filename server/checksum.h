// Checksum64: a streaming 64-bit hash (the XXH64 algorithm, seed 0) used for
// the state checksum that GetJob reports. The digest depends only on the bytes
// fed, not on how they are split across Update calls, so two servers holding
// the same state report the same value. Not cryptographic: it detects
// divergence, not tampering.
#ifndef DEPOT_SERVER_CHECKSUM_H_
#define DEPOT_SERVER_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

namespace depot {

class Checksum64 {
 public:
  Checksum64();

  // Feeds n bytes at `data`. REQUIRES: a little-endian host (the values hashed
  // are the in-memory bytes, which must match the wire's little-endian order).
  void Update(const void* data, size_t n);
  // Feeds `value` as 8 little-endian bytes.
  void UpdateU64(uint64_t value);

  // The hash of everything fed so far. Does not change the state.
  uint64_t Digest() const;

 private:
  uint64_t acc_[4];
  uint64_t total_len_ = 0;
  unsigned char buffer_[32];
  size_t buffered_ = 0;
};

}  // namespace depot

#endif  // DEPOT_SERVER_CHECKSUM_H_
