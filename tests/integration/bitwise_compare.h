// Bit-for-bit comparison of two buffers of fixed-size elements, with a failure
// message that says how many elements differ and where the first one is
// (printing a million floats would help nobody).
#ifndef DEPOT_TESTS_INTEGRATION_BITWISE_COMPARE_H_
#define DEPOT_TESTS_INTEGRATION_BITWISE_COMPARE_H_

#include <cstddef>
#include <cstring>
#include <string_view>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"

namespace depot::testing {

inline ::testing::AssertionResult BitwiseEqual(std::string_view expected,
                                               std::string_view actual,
                                               size_t element_size) {
  if (expected.size() != actual.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: expected " << expected.size() << " bytes, got "
           << actual.size();
  }
  size_t differing = 0;
  size_t first = 0;
  for (size_t i = 0; i < expected.size() / element_size; ++i) {
    if (std::memcmp(expected.data() + i * element_size,
                    actual.data() + i * element_size, element_size) != 0) {
      if (differing++ == 0) first = i;
    }
  }
  if (differing == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << differing << " of " << expected.size() / element_size
         << " elements differ; the first is element " << first;
}

inline ::testing::AssertionResult BitwiseEqual(
    const std::vector<float>& expected, const std::vector<float>& actual) {
  ::testing::AssertionResult result = BitwiseEqual(
      std::string_view(reinterpret_cast<const char*>(expected.data()),
                       expected.size() * sizeof(float)),
      std::string_view(reinterpret_cast<const char*>(actual.data()),
                       actual.size() * sizeof(float)),
      sizeof(float));
  if (result || expected.size() != actual.size()) return result;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (std::memcmp(&expected[i], &actual[i], sizeof(float)) != 0) {
      result << absl::StrFormat(" (expected %.9g, got %.9g)", expected[i],
                                actual[i]);
      break;
    }
  }
  return result;
}

}  // namespace depot::testing

#endif  // DEPOT_TESTS_INTEGRATION_BITWISE_COMPARE_H_
