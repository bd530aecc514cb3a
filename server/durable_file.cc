#include "server/durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

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

// O_DIRECT wants the buffer, the file offset and the length aligned to the
// device's logical block (512 or 4096 bytes) and its DMA alignment; 4096
// serves both.
constexpr size_t kDirectAlignment = 4096;
// Written in one O_DIRECT write each: large enough that the syscalls cost
// nothing next to the copy, small enough to stay in the CPU's cache while
// the staging copy fills it.
constexpr size_t kStageBytes = size_t{1} << 20;

// Appends to a file opened for writing, bypassing the page cache where the
// filesystem allows: the bytes are staged in an aligned buffer written with
// O_DIRECT whenever it is full, and Finish writes the last partial buffer
// through the cache. Where O_DIRECT is refused (EINVAL at fcntl or at a
// write: tmpfs on old kernels, some network filesystems) the rest of the
// file goes through the cache, from where the refusal came.
class CacheBypassingWriter {
 public:
  CacheBypassingWriter(int fd, const std::string& path)
      : fd_(fd),
        path_(path),
        stage_(static_cast<char*>(
            std::aligned_alloc(kDirectAlignment, kStageBytes))) {
    direct_ = stage_ != nullptr && SetDirect(true);
  }

  absl::Status Append(std::string_view bytes) {
    if (!direct_) return WriteAll(fd_, bytes, path_);
    while (!bytes.empty()) {
      const size_t n = std::min(bytes.size(), kStageBytes - fill_);
      std::memcpy(stage_.get() + fill_, bytes.data(), n);
      fill_ += n;
      bytes.remove_prefix(n);
      if (fill_ == kStageBytes) {
        if (absl::Status s = WriteStage(); !s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }

  // Writes what is still staged. The file is complete once it returns OK.
  absl::Status Finish() {
    if (fill_ == 0) return absl::OkStatus();
    // Not a whole block: through the cache (fsync writes it with the rest).
    if (direct_ && !SetDirect(false)) {
      return Errno(errno, "cannot turn off O_DIRECT on", path_);
    }
    return WriteStage();
  }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };

  // Turns O_DIRECT on or off; false (errno set) when the file refuses.
  bool SetDirect(bool on) {
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags < 0) return false;
    const int wanted = on ? (flags | O_DIRECT) : (flags & ~O_DIRECT);
    if (::fcntl(fd_, F_SETFL, wanted) != 0) return false;
    direct_ = on;
    return true;
  }

  absl::Status WriteStage() {
    std::string_view rest(stage_.get(), fill_);
    while (!rest.empty()) {
      const ssize_t n = ::write(fd_, rest.data(), rest.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EINVAL && direct_) {
        // The filesystem took O_DIRECT at fcntl but refuses the write (or a
        // short write left the rest unaligned): the cache takes the rest.
        if (!SetDirect(false)) {
          return Errno(errno, "cannot turn off O_DIRECT on", path_);
        }
        continue;
      }
      if (n < 0) return Errno(errno, "cannot write", path_);
      rest.remove_prefix(static_cast<size_t>(n));
    }
    fill_ = 0;
    return absl::OkStatus();
  }

  const int fd_;
  const std::string& path_;
  std::unique_ptr<char, Free> stage_;
  size_t fill_ = 0;
  bool direct_ = false;
};

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
    const FileSyncFn& sync, FileCache cache) {
  // Unique per process and call; a leftover from a crashed process has
  // another pid and is removed by whoever cleans the directory.
  static std::atomic<uint64_t> counter{0};
  const std::string temp =
      absl::StrCat(path, ".tmp-", ::getpid(), "-", counter.fetch_add(1));
  const int fd =
      ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Errno(errno, "cannot create", temp);
  absl::Status status;
  if (cache == FileCache::kBypass) {
    CacheBypassingWriter writer(fd, temp);
    status =
        produce([&](std::string_view bytes) { return writer.Append(bytes); });
    if (status.ok()) status = writer.Finish();
  } else {
    status = produce(
        [&](std::string_view bytes) { return WriteAll(fd, bytes, temp); });
  }
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
