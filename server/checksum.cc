#include "server/checksum.h"

#include <cstring>

namespace depot {
namespace {

constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kPrime3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kPrime4 = 0x85EBCA77C2B2CA63ULL;
constexpr uint64_t kPrime5 = 0x27D4EB2F165667C5ULL;

uint64_t RotateLeft(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

uint64_t Read64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

uint32_t Read32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

uint64_t Round(uint64_t acc, uint64_t input) {
  acc += input * kPrime2;
  acc = RotateLeft(acc, 31);
  return acc * kPrime1;
}

uint64_t MergeRound(uint64_t acc, uint64_t value) {
  acc ^= Round(0, value);
  return acc * kPrime1 + kPrime4;
}

}  // namespace

Checksum64::Checksum64() : acc_{kPrime1 + kPrime2, kPrime2, 0, 0 - kPrime1} {}

void Checksum64::Update(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_len_ += n;
  if (buffered_ > 0) {
    const size_t take = n < 32 - buffered_ ? n : 32 - buffered_;
    std::memcpy(buffer_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    n -= take;
    if (buffered_ < 32) return;
    for (int lane = 0; lane < 4; ++lane) {
      acc_[lane] = Round(acc_[lane], Read64(buffer_ + 8 * lane));
    }
    buffered_ = 0;
  }
  for (; n >= 32; p += 32, n -= 32) {
    for (int lane = 0; lane < 4; ++lane) {
      acc_[lane] = Round(acc_[lane], Read64(p + 8 * lane));
    }
  }
  std::memcpy(buffer_, p, n);
  buffered_ = n;
}

void Checksum64::UpdateU64(uint64_t value) { Update(&value, sizeof(value)); }

uint64_t Checksum64::Digest() const {
  uint64_t h;
  if (total_len_ >= 32) {
    h = RotateLeft(acc_[0], 1) + RotateLeft(acc_[1], 7) +
        RotateLeft(acc_[2], 12) + RotateLeft(acc_[3], 18);
    for (uint64_t acc : acc_) h = MergeRound(h, acc);
  } else {
    h = kPrime5;  // seed 0
  }
  h += total_len_;
  const unsigned char* p = buffer_;
  size_t n = buffered_;
  for (; n >= 8; p += 8, n -= 8) {
    h ^= Round(0, Read64(p));
    h = RotateLeft(h, 27) * kPrime1 + kPrime4;
  }
  if (n >= 4) {
    h ^= static_cast<uint64_t>(Read32(p)) * kPrime1;
    h = RotateLeft(h, 23) * kPrime2 + kPrime3;
    p += 4;
    n -= 4;
  }
  for (; n > 0; ++p, --n) {
    h ^= (*p) * kPrime5;
    h = RotateLeft(h, 11) * kPrime1;
  }
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime3;
  h ^= h >> 32;
  return h;
}

}  // namespace depot
