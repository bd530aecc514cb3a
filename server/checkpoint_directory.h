// CheckpointDirectory: one server's --checkpoint_dir (docs/checkpoints.md):
//
//   <root>/LOCK                                    flock: one server per root
//   <root>/job-<escaped name>/step-<20 digits>/shard-<s>-of-<n>.ckpt
//   <root>/job-<escaped name>/step-<20 digits>/manifest-<s>-of-<n>
//   <root>/tenant-<escaped tenant>/job-<escaped name>/step-.../...
//
// A job of the implicit tenant (a server without authentication) lies at the
// root, as before tenants; another tenant's jobs lie in a directory of the
// tenant's, so that job names are per tenant (JobKey) and a checkpoint says
// whose it is by where it lies (the files themselves do not record it).
//
// A step is complete on this server once its manifest exists: the manifest
// is written (atomically and durably) only after the shard file is. Readers
// verify both before they trust them.
//
// Not thread-safe: the checkpointer's one writer thread and the daemon's
// start-up (before that thread runs) use it.
#ifndef DEPOT_SERVER_CHECKPOINT_DIRECTORY_H_
#define DEPOT_SERVER_CHECKPOINT_DIRECTORY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/checkpoint_format.h"
#include "server/durable_file.h"
#include "server/job_key.h"

namespace depot {

class CheckpointDirectory {
 public:
  // Opens `root`, creating it (not its parents) if needed, and locks it for
  // this process. FAILED_PRECONDITION when another process holds the lock
  // (two servers must not share a directory); other codes for I/O errors.
  static absl::StatusOr<std::unique_ptr<CheckpointDirectory>> Open(
      const std::string& root, FileSyncFn sync = SystemFileSync());

  ~CheckpointDirectory();
  CheckpointDirectory(const CheckpointDirectory&) = delete;
  CheckpointDirectory& operator=(const CheckpointDirectory&) = delete;

  const std::string& root() const { return root_; }

  // Writes the shard file of `checkpoint` and then its manifest, each
  // through WriteFileDurably, in the directory of its job (its tenant's and
  // its name). Returns the bytes written. On failure nothing
  // of the step is left that looks complete (the manifest is removed if its
  // directory's fsync failed), and the error names the file and what failed.
  // `gate`, when set, is called before each piece of the shard file with
  // its size, and with 0 before the manifest; it may wait (to pace the
  // write), and an error from it stops the write there and is returned: the
  // temporary file is removed and no manifest written.
  using WriteGate = std::function<absl::Status(uint64_t bytes)>;
  absl::StatusOr<uint64_t> Write(const ShardCheckpoint& checkpoint,
                                 const WriteGate& gate = nullptr);

  // The job's steps that have a manifest, newest first.
  std::vector<uint64_t> CompleteSteps(const JobKey& job) const;
  // Of `steps`, those whose manifest says that some chunk lacks the
  // workers' state (CheckpointManifest::lacks_worker_state), in the same
  // order. A manifest that does not read is left out: verifying is Load's.
  std::vector<uint64_t> StepsLackingWorkerState(
      const JobKey& job, const std::vector<uint64_t>& steps) const;

  // Reads and verifies step `step` of the job: its manifest, then the shard
  // file it names, which must agree with it (job, step, fingerprint, server,
  // size). DATA_LOSS naming the file and section when either is damaged;
  // NOT_FOUND when the step has no manifest. The checkpoint's tenant is
  // `job`'s.
  absl::StatusOr<ShardCheckpoint> Load(const JobKey& job, uint64_t step) const;

  // The newest complete step that loads. Each newer one that fails is passed
  // to `on_skipped` with its error. NOT_FOUND when none loads.
  absl::StatusOr<ShardCheckpoint> LoadNewest(
      const JobKey& job,
      const std::function<void(uint64_t step, const absl::Status&)>& on_skipped)
      const;

  // Keeps the newest `keep` complete steps of the job and removes every
  // other step directory (older ones, and incomplete ones: leftovers of
  // crashed or failed writes). REQUIRES: keep >= 1 and no write of the job
  // in progress.
  absl::Status Prune(const JobKey& job, int keep);

  // Removes every step directory of the job after `step` (complete or not):
  // the checkpoints of a history the job was rolled back from.
  absl::Status RemoveStepsAfter(const JobKey& job, uint64_t step);
  // Removes every checkpoint of the job.
  absl::Status RemoveJob(const JobKey& job);

  // Renames the job's directory, if it has one, to
  // "unrestored-<escaped name>-<unix seconds>" beside it (at the root, or in
  // its tenant's directory), which restores ignore: for a
  // job created afresh while checkpoints of its name exist (they did not
  // restore), so they are kept for a person to look at but never mixed with
  // the new job's. Returns the new path, or "" when there was none.
  absl::StatusOr<std::string> SetAside(const JobKey& job);

  // The jobs that have a directory here, sorted.
  std::vector<JobKey> Jobs() const;

  // Servers before per-tenant job names kept every job's directory at the
  // root and the tenant of each in <root>/tenants, lines "TENANT HEX(JOB
  // NAME)". Moves each job that file names into its tenant's directory
  // (durably, one rename each), then removes the file; to run before the
  // jobs are restored. Returns the number of jobs moved (0 without the
  // file). DATA_LOSS for a file that does not parse, FAILED_PRECONDITION
  // when a job's new place is taken: the file is kept then, and the jobs
  // not moved stay the implicit tenant's.
  absl::StatusOr<int> AdoptTenantsFile();

  // Where the job's checkpoints live.
  std::string JobDirectory(const JobKey& job) const;
  std::string StepDirectory(const JobKey& job, uint64_t step) const;

 private:
  CheckpointDirectory(std::string root, int lock_fd, FileSyncFn sync);

  // Every step directory of the job, newest first.
  std::vector<uint64_t> AllSteps(const JobKey& job) const;
  // The manifest file in a step directory; "" when there is none.
  absl::StatusOr<std::string> ManifestIn(const std::string& step_dir) const;
  absl::Status RemoveStep(const std::string& step_dir);

  const std::string root_;
  const int lock_fd_;
  const FileSyncFn sync_;
};

// Reading another server's checkpoints (ImportCheckpoint: a job restored onto
// another server count). These take no lock and write nothing, so they may
// read a directory that its server holds.

// Where the job's checkpoints lie under the checkpoint directory `root`, and
// step `step` of them (the layout above).
std::string CheckpointJobDirectory(const std::string& root, const JobKey& job);
std::string CheckpointStepDirectory(const std::string& root, const JobKey& job,
                                    uint64_t step);

// The names of the manifests in `step_dir`, sorted (temporary files left
// out); empty when there are none or the directory does not exist.
std::vector<std::string> ManifestsIn(const std::string& step_dir);

// Reads and verifies the manifest `file_name` in `step_dir`, which must
// describe step `step` of the job named `job_name` and the server its name
// says. DATA_LOSS naming the file otherwise (ReadManifest's errors too).
absl::StatusOr<CheckpointManifest> LoadManifest(const std::string& step_dir,
                                                const std::string& file_name,
                                                const std::string& job_name,
                                                uint64_t step);

// Reads and verifies the shard file that `manifest` (of `step_dir`) names;
// it must agree with the manifest (job, step, fingerprint, server, server
// count, size). DATA_LOSS naming the file and section otherwise, also when
// it does not exist.
absl::StatusOr<ShardCheckpoint> LoadShardFile(
    const std::string& step_dir, const CheckpointManifest& manifest);

}  // namespace depot

#endif  // DEPOT_SERVER_CHECKPOINT_DIRECTORY_H_
