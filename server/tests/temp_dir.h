// TempDir: a fresh directory for a test, removed with what it holds. Used by
// the server's checkpoint tests and the integration tests that give servers a
// checkpoint directory.
#ifndef DEPOT_SERVER_TESTS_TEMP_DIR_H_
#define DEPOT_SERVER_TESTS_TEMP_DIR_H_

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace depot::testing {

// A fresh directory under $TMPDIR (or /tmp), named <prefix>-XXXXXX.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "depot-ckpt-test") {
    const char* base = std::getenv("TMPDIR");
    std::string pattern =
        std::string(base != nullptr ? base : "/tmp") + "/" + prefix + "-XXXXXX";
    EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
    path_ = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace depot::testing

#endif  // DEPOT_SERVER_TESTS_TEMP_DIR_H_
