// Writing a file so that after a crash it is either absent or whole: the
// content goes to a temporary file in the same directory, which is fsynced,
// renamed over the final name, and then the directory is fsynced so that the
// rename itself survives.
//
// An fsync that fails is never retried on the same file: after a failed
// fsync Linux may have dropped the dirty pages and cleared the error, so a
// second fsync can succeed without the data being on disk. The temporary file
// is removed and the error returned; a later write starts a new file.
#ifndef DEPOT_SERVER_DURABLE_FILE_H_
#define DEPOT_SERVER_DURABLE_FILE_H_

#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace depot {

// fsync(2) or a stand-in with its contract (0, or -1 with errno set); tests
// pass one that fails to check the failure path.
using FileSyncFn = std::function<int(int fd)>;

// ::fsync.
FileSyncFn SystemFileSync();

// How WriteFileDurably writes the content.
enum class FileCache {
  // write(2) through the page cache: right for small files.
  kUse,
  // O_DIRECT from an aligned staging buffer, so that a large file (a
  // checkpoint) costs no copy into the page cache nor the memory the cache
  // would take; the last partial block is written through the cache. Where
  // the filesystem refuses O_DIRECT (at open or at the first write) the
  // file is written through the cache instead. fsync, rename and the
  // directory's fsync are the same either way.
  kBypass,
};

// Writes `path` atomically and durably: `produce` is called with a sink that
// appends to the temporary file (its first error stops produce and is
// returned). On any failure the temporary file is removed and `path` is left
// as it was; the status names the path and the step that failed (open,
// write, fsync, rename, directory fsync): UNAVAILABLE for a failed fsync,
// else the errno's code (absl::ErrnoToStatus: RESOURCE_EXHAUSTED for
// ENOSPC, PERMISSION_DENIED for EACCES, ...).
absl::Status WriteFileDurably(
    const std::string& path,
    const std::function<absl::Status(
        const std::function<absl::Status(std::string_view)>& sink)>& produce,
    const FileSyncFn& sync, FileCache cache = FileCache::kUse);

// Creates directory `path` if it does not exist and fsyncs its parent when it
// created it, so the new entry survives a crash. Its parent must exist.
absl::Status MakeDirectoryDurably(const std::string& path,
                                  const FileSyncFn& sync);

// fsyncs the directory `path` (after a rename, unlink or mkdir in it).
absl::Status SyncDirectory(const std::string& path, const FileSyncFn& sync);

}  // namespace depot

#endif  // DEPOT_SERVER_DURABLE_FILE_H_
