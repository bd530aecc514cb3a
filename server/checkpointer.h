// Checkpointer: takes and writes the server's checkpoints in the background
// (docs/checkpoints.md). As the JobStore's listener it arms each new job's
// captures (ShardState::EnableCaptures); each complete capture is queued to
// one writer thread, which writes it to the CheckpointDirectory, prunes the
// job's older checkpoints to the last `keep`, and gives the capture back.
// Training never waits for a write: a capture step that comes while the
// job's previous capture is still out is skipped (counted and logged), so a
// job has at most one capture in memory and one write in progress.
//
// The writer thread also removes the checkpoints of a job deleted or whose
// state was replaced by an import, and sets aside
// the leftovers of a job created afresh, in the order these happened, so
// that a job's files are only ever touched by one thread.
//
// Thread safety: all methods may be called concurrently.
#ifndef DEPOT_SERVER_CHECKPOINTER_H_
#define DEPOT_SERVER_CHECKPOINTER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/checkpoint_directory.h"
#include "server/job_store.h"
#include "server/metrics.h"
#include "server/shard_state.h"

namespace depot {

struct CheckpointPolicy {
  // Checkpoint at every step that is a multiple of this; 0: never (restores
  // and the removal of deleted jobs' checkpoints still happen).
  uint64_t every_steps = 0;
  // Complete checkpoints kept per job (older ones are removed). >= 1.
  int keep = 3;
  // The pace of a checkpoint file's write, so that it leaves the disk to
  // others (a trainer's data loader); 0: as fast as the disk goes.
  uint64_t write_bytes_per_second = 0;
  // --checkpoint_max_lag_steps: a job's Step streams of steps beyond a
  // periodic checkpoint's step + this do not finish before that checkpoint
  // is written (CaptureHooks::max_lag_steps); unset: never held.
  std::optional<uint64_t> max_lag_steps;
};

class Checkpointer : public JobListener {
 public:
  // `directory` and `metrics` must outlive the checkpointer; `log` receives
  // one line per event worth a person's attention (a write failed, a step
  // skipped, a job's files removed).
  Checkpointer(CheckpointDirectory* directory, CheckpointPolicy policy,
               ServerMetrics* metrics,
               std::function<void(const std::string&)> log);
  // Stop().
  ~Checkpointer() override;

  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  void JobAdded(const std::shared_ptr<ShardState>& shard,
                bool restored) override;
  void JobDeleted(const std::shared_ptr<ShardState>& shard) override;
  // Removes the job's checkpoints: they hold a history the job has left (a
  // crash must not bring it back). The next capture step writes a new one.
  void JobStateReplaced(const std::shared_ptr<ShardState>& shard) override;

  // The Checkpoint RPC: captures `shard` now (ShardState::CaptureNow) and
  // writes it with the periodic ones' rules (atomically, the manifest last,
  // the last `keep` kept), then returns the step written. Its errors, or
  // the write's (UNAVAILABLE for a failed fsync, as the periodic ones).
  // The capture is a copy of the shard's state for the length of the write.
  absl::StatusOr<uint64_t> CheckpointNow(
      const std::shared_ptr<ShardState>& shard);

  // Rolling back (the RollBack RPC), on the writer thread after everything
  // queued so far. The job's complete steps, newest first.
  absl::StatusOr<std::vector<uint64_t>> CompleteSteps(const JobKey& key);
  // The same, and of them those that lack the workers' state
  // (CheckpointDirectory::StepsLackingWorkerState).
  struct Steps {
    std::vector<uint64_t> complete;
    std::vector<uint64_t> lacking_worker_state;
  };
  absl::StatusOr<Steps> ListSteps(const JobKey& key);
  // Reads and verifies the job's checkpoint of `step` on this server
  // (CheckpointDirectory::Load: NOT_FOUND, DATA_LOSS naming the file).
  absl::StatusOr<ShardCheckpoint> Load(const JobKey& key, uint64_t step);
  // Queues the removal of the job's checkpoints after `step`: the job was
  // rolled back to `step`, and a restart must not bring back the steps it
  // left.
  void RemoveStepsAfter(const JobKey& key, uint64_t step);

  // Waits until everything queued so far has been done.
  void Flush();
  // Flush, but only until `deadline`. True if everything was done.
  bool FlushUntil(absl::Time deadline);
  // For a shutdown that cannot wait any longer: the write in progress stops
  // at its next piece (its temporary file removed, no manifest: its step is
  // not complete, and the job's other steps are left as they were), and
  // every write queued or captured later is given back unwritten; a
  // Checkpoint RPC whose write this is fails with UNAVAILABLE. Removals
  // still run. Idempotent.
  void Abandon();
  // Finishes what is queued, then ends the writer thread; later captures are
  // given back unwritten. Idempotent.
  void Stop();
  // Writes in progress or queued, and other queued tasks (removals).
  int Pending();

 private:
  using Task = std::function<void()>;

  void Enqueue(Task task);
  // Queues `task` and waits until the writer thread has run it; UNAVAILABLE
  // (without running it) once the checkpointer is stopping.
  absl::Status RunOnWriter(Task task);
  // Queues the removal of every checkpoint of job `key`; `why` says whose
  // they are in the log line.
  void RemoveCheckpoints(const JobKey& key, const std::string& why);
  void RunWriter();
  // Writes and gives the capture back; the write's status.
  absl::Status Write(const std::weak_ptr<ShardState>& job,
                     std::unique_ptr<ShardCheckpoint> capture);
  // The CheckpointDirectory::WriteGate of one write that started at `start`:
  // keeps it to policy_.write_bytes_per_second, and stops it with
  // UNAVAILABLE once Abandon has run (waking it from its pacing wait).
  CheckpointDirectory::WriteGate WriteGate(absl::Time start);
  bool Abandoned();

  CheckpointDirectory* const directory_;
  const CheckpointPolicy policy_;
  ServerMetrics* const metrics_;
  const std::function<void(const std::string&)> log_;

  absl::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  bool running_task_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Set by Abandon; the write in progress reads it at each piece.
  absl::Mutex abandon_mu_;
  bool abandoned_ ABSL_GUARDED_BY(abandon_mu_) = false;
  std::thread writer_;
};

// Restores every job of `directory` into `jobs` from its newest complete
// checkpoint that verifies (CheckpointDirectory::LoadNewest), logging each
// job restored, each checkpoint skipped (with the reason: DATA_LOSS naming
// the file and section) and each job that could not be restored. Returns the
// number of jobs restored.
int RestoreJobs(const CheckpointDirectory& directory, JobStore& jobs,
                ServerMetrics& metrics,
                const std::function<void(const std::string&)>& log);

}  // namespace depot

#endif  // DEPOT_SERVER_CHECKPOINTER_H_
