// Shared pieces of Depot's fuzz targets (docs/fuzzing.md).
//
// Every target defines LLVMFuzzerTestOneInput, as libFuzzer expects, and
// DepotFuzzSeeds(): a few valid inputs built by code from the project's own
// encoders (no binary corpus is checked in). The same target source builds
// two ways:
//   - with clang and -DDEPOT_FUZZ=ON, linked with libFuzzer
//     (-fsanitize=fuzzer,address,undefined): depot_fuzz_<name>;
//   - with any compiler, linked with replay_main.cc: depot_fuzz_<name>_replay,
//     which runs the seeds, files given on its command line and a fixed
//     number of deterministic mutations of the seeds (what CI runs under g++).
// A target reports a broken invariant with DEPOT_FUZZ_CHECK, which prints
// what failed and aborts, so both drivers see a crash.
#ifndef DEPOT_TESTS_FUZZ_FUZZ_SUPPORT_H_
#define DEPOT_TESTS_FUZZ_FUZZ_SUPPORT_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "google/protobuf/stubs/logging.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

// The target's seed inputs.
std::vector<std::string> DepotFuzzSeeds();

#define DEPOT_FUZZ_CHECK(cond, ...)                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "%s:%d: DEPOT_FUZZ_CHECK(%s) failed: ", __FILE__, \
                   __LINE__, #cond);                                         \
      std::fprintf(stderr, __VA_ARGS__);                                     \
      std::fprintf(stderr, "\n");                                            \
      std::abort();                                                          \
    }                                                                        \
  } while (0)

namespace depot::fuzz {

// Protobuf logs every invalid UTF-8 string it parses; inputs are full of them.
inline const bool kQuietProtobuf = [] {
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return true;
}();

// Reads typed values off the front of a fuzz input; past its end, zeros.
class InputReader {
 public:
  InputReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint32_t U32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{U8()} << (8 * i);
    return v;
  }
  // The rest of the input.
  std::string Rest() {
    std::string out(reinterpret_cast<const char*>(data_) + pos_, size_ - pos_);
    pos_ = size_;
    return out;
  }
  size_t left() const { return size_ - pos_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace depot::fuzz

#endif  // DEPOT_TESTS_FUZZ_FUZZ_SUPPORT_H_
