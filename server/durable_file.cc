#include "server/durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace depot {
namespace {

std::string ParentOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status Errno(int error, absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(error, absl::StrCat(what, " ", path));
}

// A failed fsync is UNAVAILABLE whatever the errno: the data is lost, but a
// later write to a new file may succeed.
absl::Status SyncFailed(int error, const std::string& what) {
  return absl::UnavailableError(
      absl::StrCat("fsync failed for ", what, ": ", std::strerror(error),
                   " (the data may not be on disk; this file is given up)"));
}

absl::Status WriteAll(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno(errno, "cannot write", path);
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

FileSyncFn SystemFileSync() {
  return [](int fd) { return ::fsync(fd); };
}

absl::Status SyncDirectory(const std::string& path, const FileSyncFn& sync) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno(errno, "cannot open directory", path);
  const int result = sync(fd);
  const int error = errno;
  ::close(fd);
  if (result != 0) return SyncFailed(error, "directory " + path);
  return absl::OkStatus();
}

absl::Status MakeDirectoryDurably(const std::string& path,
                                  const FileSyncFn& sync) {
  if (::mkdir(path.c_str(), 0755) != 0) {
    if (errno == EEXIST) return absl::OkStatus();
    return Errno(errno, "cannot create directory", path);
  }
  return SyncDirectory(ParentOf(path), sync);
}

absl::Status WriteFileDurably(
    const std::string& path,
    const std::function<absl::Status(
        const std::function<absl::Status(std::string_view)>& sink)>& produce,
    const FileSyncFn& sync) {
  // Unique per process and call; a leftover from a crashed process has
  // another pid and is removed by whoever cleans the directory.
  static std::atomic<uint64_t> counter{0};
  const std::string temp =
      absl::StrCat(path, ".tmp-", ::getpid(), "-", counter.fetch_add(1));
  const int fd =
      ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Errno(errno, "cannot create", temp);
  absl::Status status = produce(
      [&](std::string_view bytes) { return WriteAll(fd, bytes, temp); });
  if (status.ok() && sync(fd) != 0) status = SyncFailed(errno, temp);
  if (::close(fd) != 0 && status.ok()) {
    status = Errno(errno, "cannot close", temp);
  }
  if (status.ok() && ::rename(temp.c_str(), path.c_str()) != 0) {
    status = Errno(errno, absl::StrCat("cannot rename ", temp, " to"), path);
  }
  if (!status.ok()) {
    ::unlink(temp.c_str());
    return status;
  }
  return SyncDirectory(ParentOf(path), sync);
}

}  // namespace depot
