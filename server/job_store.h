// JobStore: the jobs this server holds, by id and by key (tenant and name,
// JobKey), within a memory budget. CreateOrAttach is idempotent for a job
// with the same tenant, name, config and server index, so every worker may
// call it; two tenants' jobs of one name are two jobs. Ids are assigned 1, 2,
// 3, ... across tenants and never reused.
//
// Thread safety: all methods may be called concurrently.
#ifndef DEPOT_SERVER_JOB_STORE_H_
#define DEPOT_SERVER_JOB_STORE_H_

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "depot/job_config.h"
#include "server/job_key.h"
#include "server/memory_budget.h"
#include "server/metrics.h"
#include "server/payload_pool.h"
#include "server/shard_state.h"
#include "server/thread_pool.h"

namespace depot {

// Told of every job a JobStore adds or deletes (the checkpointer listens).
// Calls come from RPC threads, without the store's lock held.
class JobListener {
 public:
  virtual ~JobListener() = default;
  // A new job, created afresh or restored from a checkpoint; called before
  // any RPC can find it.
  virtual void JobAdded(const std::shared_ptr<ShardState>& shard,
                        bool restored) = 0;
  // The job was deleted (it is already gone from the store).
  virtual void JobDeleted(const std::shared_ptr<ShardState>& shard) = 0;
  // The job's whole state was replaced (ImportState): what was saved of its
  // earlier state no longer describes it.
  virtual void JobStateReplaced(const std::shared_ptr<ShardState>& shard) = 0;
};

struct OpenedJob {
  std::shared_ptr<ShardState> shard;
  bool created = false;  // false: an identical job existed and was attached to
};

class JobStore {
 public:
  // The free list of the server's PayloadPool: 16 MiB. A steady stream of
  // steps recycles buffers as fast as it uses them, so the free list only has
  // to absorb the difference between what the streams hold at the peak and in
  // the trough of the pipeline: with the default chunk (1 Mi elements, 2 MiB
  // as bf16), 8 buffers, a full client window (max_inflight_chunks = 4) of
  // gradient and weight payloads. What it keeps stays resident between
  // steps, and depot-bench memory allows 64 MiB beyond the state for
  // everything (gRPC, payloads in flight, this), so it must stay well below
  // that (docs/performance.md, "memory").
  static constexpr size_t kPayloadPoolFreeBytes = size_t{16} << 20;

  // `pool` and `metrics` must outlive the store and every job it hands out.
  // `bench_noop_update` makes every job's steps change nothing (ShardState).
  // Every job recycles its payloads through `payloads` (null: a pool of the
  // store's own, of kPayloadPoolFreeBytes).
  JobStore(uint64_t memory_limit_bytes, ThreadPool* pool,
           ServerMetrics* metrics, bool bench_noop_update = false,
           std::shared_ptr<PayloadPool> payloads = nullptr);

  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Tells `listener` (the checkpointer, which must outlive the store) of
  // every job added or deleted from now on; the server takes checkpoints
  // every `default_every_steps` steps (--checkpoint_every_steps). A job that
  // is checkpointed (its JobConfig::checkpoint_every_steps, else the
  // default, > 0) counts twice its state against the budget: its state and
  // one checkpoint capture of it (ShardState::EnableCaptures). Without a
  // listener (no --checkpoint_dir) a job that asks for checkpoints is
  // refused. REQUIRES: called before any job exists.
  void SetListener(JobListener* listener, uint64_t default_every_steps);

  // Creates `tenant`'s job, or attaches to the tenant's job of the same name
  // when its fingerprint and server index match; another tenant's jobs play
  // no part. INVALID_ARGUMENT: invalid config or server index.
  // FAILED_PRECONDITION: the tenant's job of that name exists with another
  // fingerprint or server index. RESOURCE_EXHAUSTED: the budget (or the system)
  // cannot hold the new job's state; nothing is allocated then. The state is
  // allocated without holding the store's lock, so other jobs' RPCs go on
  // meanwhile; a concurrent request for the same job waits for that
  // creation and attaches to its job.
  absl::StatusOr<OpenedJob> CreateOrAttach(JobConfig config,
                                           uint32_t server_index,
                                           std::string tenant = "");

  // Adds the job of `checkpoint` (its tenant's) with its state
  // (ShardState::ImportChunks), as a restart restores it; later
  // CreateOrAttach calls of that tenant with the same config and server
  // index attach to it. ALREADY_EXISTS: the tenant's job of that name exists.
  // RESOURCE_EXHAUSTED as CreateOrAttach. INVALID_ARGUMENT (config, or state
  // that does not fit it): nothing is added.
  absl::StatusOr<std::shared_ptr<ShardState>> Restore(
      ShardCheckpoint checkpoint);

  // NOT_FOUND for an unknown (or deleted) id.
  absl::StatusOr<std::shared_ptr<ShardState>> Find(uint64_t job_id) const;
  // Find, then FAILED_PRECONDITION unless `fingerprint` is the job's.
  absl::StatusOr<std::shared_ptr<ShardState>> Find(uint64_t job_id,
                                                   uint64_t fingerprint) const;

  // Removes the job (errors as Find with a fingerprint), marks it deleted and
  // returns its budget. Returns the removed job; its memory is freed once the
  // last holder (a running update or RPC) lets go of it.
  absl::StatusOr<std::shared_ptr<ShardState>> Delete(uint64_t job_id,
                                                     uint64_t fingerprint);

  // Tells the listener that `shard`'s state was replaced by an import.
  void NoteStateReplaced(const std::shared_ptr<ShardState>& shard);

  // Every job the store holds now, by id.
  std::vector<std::shared_ptr<ShardState>> Jobs() const;

  // Bytes counted against the budget, all jobs: each job's state (twice when
  // it is checkpointed), the weights it keeps for pulls at a step, and its
  // bookkeeping (ShardState::BookkeepingBytes).
  uint64_t state_bytes() const;
  uint64_t memory_limit_bytes() const { return memory_limit_bytes_; }
  // The budget, shared with every job's ShardState (payloads in flight).
  const std::shared_ptr<MemoryBudget>& budget() const { return budget_; }

 private:
  absl::StatusOr<std::shared_ptr<ShardState>> FindLocked(
      uint64_t job_id, uint64_t fingerprint) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void UpdateGaugesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a job of `shape` is checkpointed here (SetListener).
  bool Checkpointed(const JobShape& shape) const;
  // What a job of `shape` counts against the budget.
  uint64_t ChargedBytes(const JobShape& shape) const;
  // Checks the budget, allocates the job's state with the name and budget
  // reserved (mu_ released meanwhile), runs `prepare` on it, tells the
  // listener and adds the job. REQUIRES: no job of that key exists or is
  // being created.
  absl::StatusOr<std::shared_ptr<ShardState>> CreateLocked(
      JobShape shape, bool restored,
      const std::function<absl::Status(ShardState&)>& prepare)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The status of a creation that threw `e`: RESOURCE_EXHAUSTED for a failed
  // allocation, INTERNAL otherwise.
  static absl::Status CreationFailed(const std::string& name,
                                     const std::exception& e);

  const uint64_t memory_limit_bytes_;
  const std::shared_ptr<MemoryBudget> budget_;
  ThreadPool* const pool_;
  const std::shared_ptr<PayloadPool> payloads_;
  ServerMetrics* const metrics_;
  const bool bench_noop_update_;
  JobListener* listener_ = nullptr;
  uint64_t default_every_steps_ = 0;

  mutable absl::Mutex mu_;
  std::map<uint64_t, std::shared_ptr<ShardState>> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<JobKey, uint64_t> ids_by_key_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t state_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Jobs being created (their state allocated outside mu_; their bytes
  // reserved in budget_ until they are in jobs_ or have failed).
  std::set<JobKey> creating_ ABSL_GUARDED_BY(mu_);
};

}  // namespace depot

#endif  // DEPOT_SERVER_JOB_STORE_H_
