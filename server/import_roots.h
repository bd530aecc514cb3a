// ImportRoots: the directories ImportCheckpoint may read (--import_roots).
//
// ImportCheckpoint names the directories of a checkpoint that other servers
// wrote. Without a bound, any caller could make the server open whatever path
// its user can read. Each named directory is canonicalised (realpath: `..`
// and symbolic links resolved) and must then be one of the roots or lie under
// one; the roots are canonicalised once, at start-up. The files are then read
// through the canonical path, so a link inside a root that leads out of it is
// refused as the path it leads to.
#ifndef DEPOT_SERVER_IMPORT_ROOTS_H_
#define DEPOT_SERVER_IMPORT_ROOTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace depot {

class ImportRoots {
 public:
  // No roots: every directory is refused.
  ImportRoots() = default;

  // The roots `roots` (each an existing directory). INVALID_ARGUMENT naming
  // one that is empty, missing or not a directory (a relative one is
  // taken from the working directory).
  static absl::StatusOr<ImportRoots> Create(
      const std::vector<std::string>& roots);

  // The canonical form of each of `dirs`, in order. PERMISSION_DENIED naming
  // the first directory that does not exist or lies outside every root (the
  // two are not told apart: a caller learns nothing of paths outside the
  // roots); FAILED_PRECONDITION when there are no roots.
  absl::StatusOr<std::vector<std::string>> Resolve(
      const std::vector<std::string>& dirs) const;

  const std::vector<std::string>& roots() const { return roots_; }

 private:
  std::vector<std::string> roots_;  // canonical
};

}  // namespace depot

#endif  // DEPOT_SERVER_IMPORT_ROOTS_H_
