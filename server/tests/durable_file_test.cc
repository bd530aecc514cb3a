// WriteFileDurably (server/durable_file.h) bypassing the page cache: every
// byte arrives whatever the sizes of the file and of the pieces (whole
// O_DIRECT buffers, the partial block at the end), and a failed fsync gives
// the file up as with writes through the cache.
#include "server/durable_file.h"

#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/tests/checkpoint_test_util.h"

namespace depot {
namespace {

using ::depot::testing::ReadFileBytes;
using ::depot::testing::TempDir;

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 random(seed);
  std::string bytes(n, '\0');
  for (char& c : bytes) c = static_cast<char>(random());
  return bytes;
}

// Writes `bytes` to `path` in pieces of `piece` bytes.
absl::Status WriteInPieces(const std::string& path, const std::string& bytes,
                           size_t piece, FileCache cache,
                           const FileSyncFn& sync = SystemFileSync()) {
  return WriteFileDurably(
      path,
      [&](const std::function<absl::Status(std::string_view)>& sink) {
        for (size_t at = 0; at < bytes.size(); at += piece) {
          const std::string_view view(bytes);
          if (absl::Status s = sink(view.substr(at, piece)); !s.ok()) return s;
        }
        return absl::OkStatus();
      },
      sync, cache);
}

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  return names;
}

TEST(DurableFileTest, BypassingTheCacheWritesEveryByteAtAnySize) {
  TempDir dir;
  const size_t mib = size_t{1} << 20;
  for (const size_t size :
       {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{4097}, mib - 1,
        mib, mib + 1, 3 * mib + 12345}) {
    for (const size_t piece : {size_t{7}, size_t{4096}, size_t{100003}, mib}) {
      const std::string path = dir.path() + "/file";
      const std::string bytes = RandomBytes(size, static_cast<uint32_t>(size));
      ASSERT_TRUE(WriteInPieces(path, bytes, piece, FileCache::kBypass).ok())
          << size << " bytes in pieces of " << piece;
      ASSERT_EQ(ReadFileBytes(path), bytes)
          << size << " bytes in pieces of " << piece;
      EXPECT_EQ(Entries(dir.path()), std::vector<std::string>{"file"});
    }
  }
}

// tmpfs takes O_DIRECT on recent kernels and refuses it on older ones:
// either way the file is whole.
TEST(DurableFileTest, BypassingTheCacheOnTmpfsWritesEveryByte) {
  if (!std::filesystem::is_directory("/dev/shm")) {
    GTEST_SKIP() << "no /dev/shm";
  }
  const std::string path =
      "/dev/shm/depot-durable-file-test-" + std::to_string(::getpid());
  const std::string bytes = RandomBytes((size_t{3} << 20) + 5, 3);
  ASSERT_TRUE(WriteInPieces(path, bytes, 65536, FileCache::kBypass).ok());
  EXPECT_EQ(ReadFileBytes(path), bytes);
  std::filesystem::remove(path);
}

TEST(DurableFileTest, FailedFsyncWhileBypassingGivesTheFileUp) {
  TempDir dir;
  const std::string path = dir.path() + "/file";
  const FileSyncFn failing = [](int) {
    errno = EIO;
    return -1;
  };
  const absl::Status status =
      WriteInPieces(path, RandomBytes((size_t{2} << 20) + 1, 4), 4096,
                    FileCache::kBypass, failing);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_TRUE(Entries(dir.path()).empty());
}

TEST(DurableFileTest, ErrorFromTheProducerLeavesNothing) {
  TempDir dir;
  const std::string path = dir.path() + "/file";
  const absl::Status status = WriteFileDurably(
      path,
      [&](const std::function<absl::Status(std::string_view)>& sink) {
        const std::string bytes = RandomBytes((size_t{1} << 20) + 9, 5);
        if (absl::Status s = sink(bytes); !s.ok()) return s;
        return absl::CancelledError("stopped");
      },
      SystemFileSync(), FileCache::kBypass);
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(Entries(dir.path()).empty());
}

}  // namespace
}  // namespace depot
