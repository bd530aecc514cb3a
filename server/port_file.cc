#include "server/port_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace depot {
namespace {

absl::Status OsError(const std::string& what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(errno)));
}

}  // namespace

absl::Status WritePortFile(const std::string& path,
                           const std::string& grpc_address,
                           const std::string& metrics_address) {
  std::string contents = absl::StrCat(grpc_address, "\n");
  if (!metrics_address.empty())
    absl::StrAppend(&contents, metrics_address, "\n");
  // The temporary file sits beside the target so that rename stays within one
  // file system, which is what makes it atomic.
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  std::FILE* file = std::fopen(tmp.c_str(), "w");
  if (file == nullptr) return OsError("create", tmp);
  const bool written =
      std::fwrite(contents.data(), 1, contents.size(), file) == contents.size();
  if (std::fclose(file) != 0 || !written) {
    absl::Status error = OsError("write", tmp);
    std::remove(tmp.c_str());
    return error;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status error = OsError("rename into place", path);
    std::remove(tmp.c_str());
    return error;
  }
  return absl::OkStatus();
}

}  // namespace depot
