#include "server/checkpoint_directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace depot {
namespace {

constexpr absl::string_view kJobPrefix = "job-";
constexpr absl::string_view kStepPrefix = "step-";
constexpr absl::string_view kManifestPrefix = "manifest-";

// Job names may hold any byte; directory names keep [A-Za-z0-9_-] and '.'
// (not first, so never "." or "..") and spell every other byte %XX.
std::string EscapeName(const std::string& name) {
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                       (c >= '0' && c <= '9') || c == '_' || c == '-' ||
                       (c == '.' && i > 0);
    if (plain) {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppendFormat(&out, "%%%02X", c);
    }
  }
  return out;
}

bool UnescapeName(absl::string_view escaped, std::string* name) {
  name->clear();
  for (size_t i = 0; i < escaped.size(); ++i) {
    if (escaped[i] != '%') {
      name->push_back(escaped[i]);
      continue;
    }
    int value = 0;
    if (i + 2 >= escaped.size()) return false;
    if (!absl::SimpleHexAtoi(escaped.substr(i + 1, 2), &value)) return false;
    name->push_back(static_cast<char>(value));
    i += 2;
  }
  return true;
}

std::string StepName(uint64_t step) {
  return absl::StrFormat("%s%020d", kStepPrefix, step);
}

std::string ShardFileName(uint32_t server, uint32_t servers) {
  return absl::StrFormat("shard-%d-of-%d.ckpt", server, servers);
}

std::string ManifestName(uint32_t server, uint32_t servers) {
  return absl::StrFormat("%s%d-of-%d", kManifestPrefix, server, servers);
}

// The entries of a directory (without "." and ".."); empty when it does not
// exist.
std::vector<std::string> ListDirectory(const std::string& path) {
  std::vector<std::string> names;
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return names;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  return names;
}

absl::Status RemoveFile(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot remove ", path));
  }
  return absl::OkStatus();
}

}  // namespace

CheckpointDirectory::CheckpointDirectory(std::string root, int lock_fd,
                                         FileSyncFn sync)
    : root_(std::move(root)), lock_fd_(lock_fd), sync_(std::move(sync)) {}

CheckpointDirectory::~CheckpointDirectory() { ::close(lock_fd_); }

absl::StatusOr<std::unique_ptr<CheckpointDirectory>> CheckpointDirectory::Open(
    const std::string& root, FileSyncFn sync) {
  if (absl::Status s = MakeDirectoryDurably(root, sync); !s.ok()) return s;
  const std::string lock_path = root + "/LOCK";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", lock_path));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    ::close(fd);
    if (error == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint directory ", root,
                       " is in use by another process (it holds ", lock_path,
                       "); give every server its own --checkpoint_dir"));
    }
    return absl::ErrnoToStatus(error, absl::StrCat("cannot lock ", lock_path));
  }
  return std::unique_ptr<CheckpointDirectory>(
      new CheckpointDirectory(root, fd, std::move(sync)));
}

std::string CheckpointDirectory::JobDirectory(
    const std::string& job_name) const {
  return absl::StrCat(root_, "/", kJobPrefix, EscapeName(job_name));
}

std::string CheckpointDirectory::StepDirectory(const std::string& job_name,
                                               uint64_t step) const {
  return CheckpointStepDirectory(root_, job_name, step);
}

absl::StatusOr<uint64_t> CheckpointDirectory::Write(
    const ShardCheckpoint& checkpoint, const WriteGate& gate) {
  const auto pass = [&](uint64_t bytes) {
    return gate == nullptr ? absl::OkStatus() : gate(bytes);
  };
  if (absl::Status s = pass(0); !s.ok()) return s;
  const std::string& name = checkpoint.config.name;
  const std::string step_dir = StepDirectory(name, checkpoint.step);
  for (const std::string& dir : {JobDirectory(name), step_dir}) {
    if (absl::Status s = MakeDirectoryDurably(dir, sync_); !s.ok()) return s;
  }
  const uint32_t servers = checkpoint.config.num_servers;
  CheckpointManifest manifest;
  manifest.job_name = name;
  manifest.fingerprint = checkpoint.fingerprint;
  manifest.server_index = checkpoint.server_index;
  manifest.num_servers = servers;
  manifest.step = checkpoint.step;
  manifest.shard_file = ShardFileName(checkpoint.server_index, servers);
  const std::string shard_path =
      absl::StrCat(step_dir, "/", manifest.shard_file);
  const std::string manifest_path = absl::StrCat(
      step_dir, "/", ManifestName(checkpoint.server_index, servers));
  // A checkpoint of this step may exist already (Checkpoint called again at
  // the same step): its manifest stays until the new one replaces it. The
  // new shard file replaces the old by an atomic rename of a complete,
  // durable file, so the manifest always vouches for a whole shard of this
  // step (the same bytes, the state at a step being one); a write abandoned
  // half way (a shutdown, an error, a kill) leaves the old checkpoint
  // complete instead of taking it away.
  absl::Status written = WriteFileDurably(
      shard_path,
      [&](const ByteSink& sink) {
        return EncodeShardCheckpoint(
            checkpoint,
            [&](std::string_view bytes) {
              absl::Status s = pass(bytes.size());
              return s.ok() ? sink(bytes) : s;
            },
            &manifest.shard_file_bytes);
      },
      sync_, FileCache::kBypass);
  if (!written.ok()) return written;
  // Stopped here, the shard file is whole, but without its manifest the step
  // is not complete: Prune removes it.
  if (absl::Status s = pass(0); !s.ok()) return s;
  written = WriteFileDurably(
      manifest_path,
      [&](const ByteSink& sink) { return EncodeManifest(manifest, sink); },
      sync_);
  if (!written.ok()) {
    // Renamed into place but not known to be durable (the directory's fsync
    // failed): it must not mark the step complete.
    RemoveFile(manifest_path).IgnoreError();
    return written;
  }
  return manifest.shard_file_bytes;
}

std::vector<uint64_t> CheckpointDirectory::AllSteps(
    const std::string& job_name) const {
  std::vector<uint64_t> steps;
  for (const std::string& entry : ListDirectory(JobDirectory(job_name))) {
    absl::string_view rest = entry;
    uint64_t step = 0;
    if (absl::ConsumePrefix(&rest, kStepPrefix) && rest.size() == 20 &&
        absl::SimpleAtoi(rest, &step)) {
      steps.push_back(step);
    }
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

absl::StatusOr<std::string> CheckpointDirectory::ManifestIn(
    const std::string& step_dir) const {
  const std::vector<std::string> manifests = ManifestsIn(step_dir);
  if (manifests.size() > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        step_dir, " holds the manifests of several servers (", manifests[0],
        ", ", manifests[1], "); give every server its own --checkpoint_dir"));
  }
  return manifests.empty() ? std::string() : manifests.front();
}

std::vector<uint64_t> CheckpointDirectory::CompleteSteps(
    const std::string& job_name) const {
  std::vector<uint64_t> complete;
  for (const uint64_t step : AllSteps(job_name)) {
    absl::StatusOr<std::string> manifest =
        ManifestIn(StepDirectory(job_name, step));
    if (!manifest.ok() || !manifest->empty()) complete.push_back(step);
  }
  return complete;
}

absl::StatusOr<ShardCheckpoint> CheckpointDirectory::Load(
    const std::string& job_name, uint64_t step) const {
  const std::string step_dir = StepDirectory(job_name, step);
  absl::StatusOr<std::string> manifest_name = ManifestIn(step_dir);
  if (!manifest_name.ok()) return manifest_name.status();
  if (manifest_name->empty()) {
    return absl::NotFoundError(
        absl::StrCat(step_dir, " has no manifest: the step is not complete"));
  }
  absl::StatusOr<CheckpointManifest> manifest =
      LoadManifest(step_dir, *manifest_name, job_name, step);
  if (!manifest.ok()) return manifest.status();
  return LoadShardFile(step_dir, *manifest);
}

std::string CheckpointStepDirectory(const std::string& root,
                                    const std::string& job_name,
                                    uint64_t step) {
  return absl::StrCat(root, "/", kJobPrefix, EscapeName(job_name), "/",
                      StepName(step));
}

std::vector<std::string> ManifestsIn(const std::string& step_dir) {
  std::vector<std::string> manifests;
  for (const std::string& entry : ListDirectory(step_dir)) {
    if (absl::StartsWith(entry, kManifestPrefix) &&
        !absl::StrContains(entry, ".tmp-")) {
      manifests.push_back(entry);
    }
  }
  std::sort(manifests.begin(), manifests.end());
  return manifests;
}

absl::StatusOr<CheckpointManifest> LoadManifest(const std::string& step_dir,
                                                const std::string& file_name,
                                                const std::string& job_name,
                                                uint64_t step) {
  const std::string manifest_path = absl::StrCat(step_dir, "/", file_name);
  absl::StatusOr<CheckpointManifest> manifest = ReadManifest(manifest_path);
  if (!manifest.ok()) return manifest.status();
  if (manifest->job_name != job_name || manifest->step != step ||
      manifest->shard_file.find('/') != std::string::npos ||
      file_name !=
          ManifestName(manifest->server_index, manifest->num_servers)) {
    return absl::DataLossError(
        absl::StrCat("checkpoint manifest ", manifest_path, " describes job \"",
                     manifest->job_name, "\" step ", manifest->step, " server ",
                     manifest->server_index, ", not what its path says"));
  }
  return manifest;
}

absl::StatusOr<ShardCheckpoint> LoadShardFile(
    const std::string& step_dir, const CheckpointManifest& manifest) {
  const std::string manifest_path = absl::StrCat(
      step_dir, "/", ManifestName(manifest.server_index, manifest.num_servers));
  const std::string shard_path =
      absl::StrCat(step_dir, "/", manifest.shard_file);
  absl::StatusOr<ShardCheckpoint> checkpoint = ReadShardCheckpoint(shard_path);
  if (absl::IsNotFound(checkpoint.status())) {
    return absl::DataLossError(
        absl::StrCat("checkpoint manifest ", manifest_path, " names ",
                     shard_path, ", which does not exist"));
  }
  if (!checkpoint.ok()) return checkpoint.status();
  if (checkpoint->config.name != manifest.job_name ||
      checkpoint->step != manifest.step ||
      checkpoint->fingerprint != manifest.fingerprint ||
      checkpoint->server_index != manifest.server_index ||
      checkpoint->config.num_servers != manifest.num_servers ||
      ShardCheckpointBytes(*checkpoint) != manifest.shard_file_bytes) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint file ", shard_path, " does not match its manifest ",
        manifest_path, " (job, step, fingerprint, server or size differ)"));
  }
  return checkpoint;
}

absl::StatusOr<ShardCheckpoint> CheckpointDirectory::LoadNewest(
    const std::string& job_name,
    const std::function<void(uint64_t, const absl::Status&)>& on_skipped)
    const {
  for (const uint64_t step : CompleteSteps(job_name)) {
    absl::StatusOr<ShardCheckpoint> checkpoint = Load(job_name, step);
    if (checkpoint.ok()) return checkpoint;
    on_skipped(step, checkpoint.status());
  }
  return absl::NotFoundError(absl::StrCat("no complete checkpoint of job \"",
                                          job_name, "\" loads from ",
                                          JobDirectory(job_name)));
}

absl::Status CheckpointDirectory::RemoveStep(const std::string& step_dir) {
  // The manifest first: a crash halfway leaves an incomplete step, never a
  // manifest that names a removed file.
  std::vector<std::string> entries = ListDirectory(step_dir);
  std::stable_partition(entries.begin(), entries.end(),
                        [](const std::string& entry) {
                          return absl::StartsWith(entry, kManifestPrefix);
                        });
  for (const std::string& entry : entries) {
    if (absl::Status s = RemoveFile(absl::StrCat(step_dir, "/", entry));
        !s.ok()) {
      return s;
    }
  }
  if (::rmdir(step_dir.c_str()) != 0 && errno != ENOENT) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot remove ", step_dir));
  }
  return absl::OkStatus();
}

absl::Status CheckpointDirectory::Prune(const std::string& job_name, int keep) {
  int kept = 0;
  for (const uint64_t step : AllSteps(job_name)) {
    const std::string step_dir = StepDirectory(job_name, step);
    absl::StatusOr<std::string> manifest = ManifestIn(step_dir);
    const bool complete = !manifest.ok() || !manifest->empty();
    if (complete && kept < keep) {
      ++kept;
      continue;
    }
    if (absl::Status s = RemoveStep(step_dir); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckpointDirectory::RemoveStepsAfter(const std::string& job_name,
                                                   uint64_t step) {
  for (const uint64_t later : AllSteps(job_name)) {
    if (later <= step) break;  // newest first
    if (absl::Status s = RemoveStep(StepDirectory(job_name, later)); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointDirectory::RemoveJob(const std::string& job_name) {
  for (const uint64_t step : AllSteps(job_name)) {
    if (absl::Status s = RemoveStep(StepDirectory(job_name, step)); !s.ok()) {
      return s;
    }
  }
  const std::string dir = JobDirectory(job_name);
  for (const std::string& entry : ListDirectory(dir)) {
    if (absl::Status s = RemoveFile(absl::StrCat(dir, "/", entry)); !s.ok()) {
      return s;
    }
  }
  if (::rmdir(dir.c_str()) != 0 && errno != ENOENT) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot remove ", dir));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> CheckpointDirectory::SetAside(
    const std::string& job_name) {
  const std::string dir = JobDirectory(job_name);
  if (::access(dir.c_str(), F_OK) != 0) return std::string();
  const std::string aside =
      absl::StrCat(root_, "/unrestored-", EscapeName(job_name), "-",
                   static_cast<int64_t>(std::time(nullptr)));
  if (::rename(dir.c_str(), aside.c_str()) != 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("cannot rename ", dir, " to ", aside));
  }
  if (absl::Status s = SyncDirectory(root_, sync_); !s.ok()) return s;
  return aside;
}

std::vector<std::string> CheckpointDirectory::JobNames() const {
  std::vector<std::string> names;
  for (const std::string& entry : ListDirectory(root_)) {
    absl::string_view rest = entry;
    std::string name;
    if (absl::ConsumePrefix(&rest, kJobPrefix) && UnescapeName(rest, &name) &&
        !name.empty()) {
      names.push_back(std::move(name));
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace depot
