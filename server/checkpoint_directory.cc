#include "server/checkpoint_directory.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace depot {
namespace {

// The implicit tenant (tenant_auth.h's kImplicitTenant, without its gRPC
// headers).
constexpr char kImplicitTenantName[] = "";
// Where servers before per-tenant job names kept the tenant of each job.
constexpr char kLegacyTenantsFile[] = "tenants";

constexpr absl::string_view kJobPrefix = "job-";
constexpr absl::string_view kTenantPrefix = "tenant-";
constexpr absl::string_view kUnrestoredPrefix = "unrestored-";
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

// Where tenant `tenant`'s job directories lie: the root itself for the
// implicit tenant (as before tenants), else a directory of the tenant's.
std::string TenantRoot(const std::string& root, const std::string& tenant) {
  if (tenant == kImplicitTenantName) return root;
  return absl::StrCat(root, "/", kTenantPrefix, EscapeName(tenant));
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

std::string CheckpointDirectory::JobDirectory(const JobKey& job) const {
  return CheckpointJobDirectory(root_, job);
}

std::string CheckpointDirectory::StepDirectory(const JobKey& job,
                                               uint64_t step) const {
  return CheckpointStepDirectory(root_, job, step);
}

absl::StatusOr<uint64_t> CheckpointDirectory::Write(
    const ShardCheckpoint& checkpoint, const WriteGate& gate) {
  const auto pass = [&](uint64_t bytes) {
    return gate == nullptr ? absl::OkStatus() : gate(bytes);
  };
  if (absl::Status s = pass(0); !s.ok()) return s;
  const std::string& name = checkpoint.config.name;
  const JobKey job = checkpoint.key();
  const std::string step_dir = StepDirectory(job, checkpoint.step);
  for (const std::string& dir :
       {TenantRoot(root_, job.tenant), JobDirectory(job), step_dir}) {
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
  manifest.lacks_worker_state = checkpoint.LacksWorkerState();
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

std::vector<uint64_t> CheckpointDirectory::AllSteps(const JobKey& job) const {
  std::vector<uint64_t> steps;
  for (const std::string& entry : ListDirectory(JobDirectory(job))) {
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
    const JobKey& job) const {
  std::vector<uint64_t> complete;
  for (const uint64_t step : AllSteps(job)) {
    absl::StatusOr<std::string> manifest = ManifestIn(StepDirectory(job, step));
    if (!manifest.ok() || !manifest->empty()) complete.push_back(step);
  }
  return complete;
}

std::vector<uint64_t> CheckpointDirectory::StepsLackingWorkerState(
    const JobKey& job, const std::vector<uint64_t>& steps) const {
  std::vector<uint64_t> lacking;
  for (const uint64_t step : steps) {
    const std::string step_dir = StepDirectory(job, step);
    absl::StatusOr<std::string> name = ManifestIn(step_dir);
    if (!name.ok() || name->empty()) continue;
    absl::StatusOr<CheckpointManifest> manifest =
        LoadManifest(step_dir, *name, job.name, step);
    if (manifest.ok() && manifest->lacks_worker_state) lacking.push_back(step);
  }
  return lacking;
}

absl::StatusOr<ShardCheckpoint> CheckpointDirectory::Load(const JobKey& job,
                                                          uint64_t step) const {
  const std::string step_dir = StepDirectory(job, step);
  absl::StatusOr<std::string> manifest_name = ManifestIn(step_dir);
  if (!manifest_name.ok()) return manifest_name.status();
  if (manifest_name->empty()) {
    return absl::NotFoundError(
        absl::StrCat(step_dir, " has no manifest: the step is not complete"));
  }
  absl::StatusOr<CheckpointManifest> manifest =
      LoadManifest(step_dir, *manifest_name, job.name, step);
  if (!manifest.ok()) return manifest.status();
  absl::StatusOr<ShardCheckpoint> checkpoint =
      LoadShardFile(step_dir, *manifest);
  if (checkpoint.ok()) checkpoint->tenant = job.tenant;
  return checkpoint;
}

std::string CheckpointJobDirectory(const std::string& root, const JobKey& job) {
  return absl::StrCat(TenantRoot(root, job.tenant), "/", kJobPrefix,
                      EscapeName(job.name));
}

std::string CheckpointStepDirectory(const std::string& root, const JobKey& job,
                                    uint64_t step) {
  return absl::StrCat(CheckpointJobDirectory(root, job), "/", StepName(step));
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
    const JobKey& job,
    const std::function<void(uint64_t, const absl::Status&)>& on_skipped)
    const {
  for (const uint64_t step : CompleteSteps(job)) {
    absl::StatusOr<ShardCheckpoint> checkpoint = Load(job, step);
    if (checkpoint.ok()) return checkpoint;
    on_skipped(step, checkpoint.status());
  }
  return absl::NotFoundError(absl::StrCat("no complete checkpoint of ",
                                          Describe(job), " loads from ",
                                          JobDirectory(job)));
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

absl::Status CheckpointDirectory::Prune(const JobKey& job, int keep) {
  int kept = 0;
  for (const uint64_t step : AllSteps(job)) {
    const std::string step_dir = StepDirectory(job, step);
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

absl::Status CheckpointDirectory::RemoveStepsAfter(const JobKey& job,
                                                   uint64_t step) {
  for (const uint64_t later : AllSteps(job)) {
    if (later <= step) break;  // newest first
    if (absl::Status s = RemoveStep(StepDirectory(job, later)); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointDirectory::RemoveJob(const JobKey& job) {
  for (const uint64_t step : AllSteps(job)) {
    if (absl::Status s = RemoveStep(StepDirectory(job, step)); !s.ok()) {
      return s;
    }
  }
  const std::string dir = JobDirectory(job);
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

absl::StatusOr<std::string> CheckpointDirectory::SetAside(const JobKey& job) {
  const std::string dir = JobDirectory(job);
  if (::access(dir.c_str(), F_OK) != 0) return std::string();
  const std::string parent = TenantRoot(root_, job.tenant);
  const std::string aside =
      absl::StrCat(parent, "/", kUnrestoredPrefix, EscapeName(job.name), "-",
                   static_cast<int64_t>(std::time(nullptr)));
  if (::rename(dir.c_str(), aside.c_str()) != 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("cannot rename ", dir, " to ", aside));
  }
  if (absl::Status s = SyncDirectory(parent, sync_); !s.ok()) return s;
  return aside;
}

std::vector<JobKey> CheckpointDirectory::Jobs() const {
  std::vector<JobKey> jobs;
  // The job directories of the tenant whose directory is `dir`.
  const auto add_jobs = [&jobs](const std::string& dir,
                                const std::string& tenant) {
    for (const std::string& entry : ListDirectory(dir)) {
      absl::string_view rest = entry;
      std::string name;
      if (absl::ConsumePrefix(&rest, kJobPrefix) && UnescapeName(rest, &name) &&
          !name.empty()) {
        jobs.push_back(JobKey{tenant, std::move(name)});
      }
    }
  };
  add_jobs(root_, kImplicitTenantName);
  for (const std::string& entry : ListDirectory(root_)) {
    absl::string_view rest = entry;
    std::string tenant;
    if (absl::ConsumePrefix(&rest, kTenantPrefix) &&
        UnescapeName(rest, &tenant) && !tenant.empty()) {
      add_jobs(absl::StrCat(root_, "/", entry), tenant);
    }
  }
  std::sort(jobs.begin(), jobs.end());
  return jobs;
}

absl::StatusOr<int> CheckpointDirectory::AdoptTenantsFile() {
  const std::string path = absl::StrCat(root_, "/", kLegacyTenantsFile);
  std::ifstream in(path);
  if (!in) return 0;
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("cannot read ", path));
  }
  std::map<std::string, std::string> tenants;  // job name -> tenant
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text.str(), '\n')) {
    ++line_number;
    if (line.empty() || line.front() == '#') continue;
    const std::vector<absl::string_view> fields = absl::StrSplit(line, ' ');
    const bool hex = fields.size() == 2 && !fields[1].empty() &&
                     fields[1].size() % 2 == 0 &&
                     fields[1].find_first_not_of("0123456789abcdef") ==
                         absl::string_view::npos;
    if (!hex || fields[0].empty()) {
      return absl::DataLossError(
          absl::StrCat(path, ": line ", line_number,
                       " is not \"TENANT HEX(JOB NAME)\"; the jobs it names "
                       "stay the implicit tenant's until it is fixed"));
    }
    tenants[absl::HexStringToBytes(fields[1])] = std::string(fields[0]);
  }
  int moved = 0;
  for (const auto& [name, tenant] : tenants) {
    const std::string from =
        CheckpointJobDirectory(root_, JobKey{kImplicitTenantName, name});
    // Gone: moved by an earlier start that stopped before the file was
    // removed (or the job was deleted).
    if (::access(from.c_str(), F_OK) != 0) continue;
    const JobKey job{tenant, name};
    const std::string to = JobDirectory(job);
    if (::access(to.c_str(), F_OK) == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot move ", from, " to ", to,
                       ", which exists: move or remove one of them by hand"));
    }
    if (absl::Status s = MakeDirectoryDurably(TenantRoot(root_, tenant), sync_);
        !s.ok()) {
      return s;
    }
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return absl::ErrnoToStatus(
          errno, absl::StrCat("cannot rename ", from, " to ", to));
    }
    for (const std::string& dir : {TenantRoot(root_, tenant), root_}) {
      if (absl::Status s = SyncDirectory(dir, sync_); !s.ok()) return s;
    }
    ++moved;
  }
  if (absl::Status s = RemoveFile(path); !s.ok()) return s;
  if (absl::Status s = SyncDirectory(root_, sync_); !s.ok()) return s;
  return moved;
}

}  // namespace depot
