#include "server/import_roots.h"

#include <sys/stat.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace depot {
namespace {

// realpath(3) of `path` if it names an existing directory.
absl::StatusOr<std::string> CanonicalDirectory(const std::string& path) {
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) {
    return absl::NotFoundError(std::strerror(errno));
  }
  struct stat st;
  if (::stat(resolved, &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::NotFoundError("not a directory");
  }
  return std::string(resolved);
}

// True when canonical `dir` is `root` or lies under it.
bool IsUnder(const std::string& dir, const std::string& root) {
  if (dir == root) return true;
  if (root == "/") return true;
  return absl::StartsWith(dir, root) && dir.size() > root.size() &&
         dir[root.size()] == '/';
}

}  // namespace

absl::StatusOr<ImportRoots> ImportRoots::Create(
    const std::vector<std::string>& roots) {
  ImportRoots out;
  for (const std::string& root : roots) {
    if (root.empty()) {
      return absl::InvalidArgumentError("--import_roots: an empty path");
    }
    absl::StatusOr<std::string> canonical = CanonicalDirectory(root);
    if (!canonical.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--import_roots: ", root, ": ", canonical.status().message()));
    }
    out.roots_.push_back(*std::move(canonical));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ImportRoots::Resolve(
    const std::vector<std::string>& dirs) const {
  std::vector<std::string> out;
  for (const std::string& dir : dirs) {
    if (roots_.empty()) {
      return absl::FailedPreconditionError(
          "ImportCheckpoint: this server reads no checkpoint directories "
          "(start it with --import_roots, or a --checkpoint_dir)");
    }
    absl::StatusOr<std::string> canonical = CanonicalDirectory(dir);
    bool allowed = false;
    if (canonical.ok()) {
      for (const std::string& root : roots_) {
        allowed = allowed || IsUnder(*canonical, root);
      }
    }
    if (!allowed) {
      return absl::PermissionDeniedError(
          absl::StrCat("ImportCheckpoint: the checkpoint directory \"", dir,
                       "\" is not an existing directory under this server's "
                       "--import_roots"));
    }
    out.push_back(*std::move(canonical));
  }
  return out;
}

}  // namespace depot
