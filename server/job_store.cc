#include "server/job_store.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "depot/dtype.h"
#include "depot/job_config_diff.h"

namespace depot {

JobStore::JobStore(uint64_t memory_limit_bytes, ThreadPool* pool,
                   ServerMetrics* metrics, bool bench_noop_update,
                   std::shared_ptr<PayloadPool> payloads)
    : memory_limit_bytes_(memory_limit_bytes),
      budget_(std::make_shared<MemoryBudget>(memory_limit_bytes)),
      pool_(pool),
      payloads_(payloads != nullptr
                    ? std::move(payloads)
                    : PayloadPool::Create(kPayloadPoolFreeBytes)),
      metrics_(metrics),
      bench_noop_update_(bench_noop_update) {}

absl::StatusOr<OpenedJob> JobStore::CreateOrAttach(JobConfig config,
                                                   uint32_t server_index,
                                                   std::string tenant) {
  absl::StatusOr<JobShape> shape =
      JobShape::Create(std::move(config), server_index, std::move(tenant));
  if (!shape.ok()) return shape.status();
  const JobKey key = shape->key();
  const std::string& name = key.name;

  absl::MutexLock lock(&mu_);
  // The tenant's job of this name being created by another request: wait
  // for it, then attach to it (or, if that creation failed, create it here).
  auto not_creating = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return creating_.count(key) == 0;
  };
  mu_.Await(absl::Condition(&not_creating));
  if (auto it = ids_by_key_.find(key); it != ids_by_key_.end()) {
    std::shared_ptr<ShardState> existing = jobs_.at(it->second);
    const JobShape& have = existing->shape();
    if (have.fingerprint() != shape->fingerprint()) {
      std::string differences = DescribeJobConfigDifferences(
          have.config(), "existing job", shape->config(), "this request");
      if (differences.empty()) {
        // Only if the comparison missed a field the fingerprint covers.
        differences = absl::StrFormat(
            "fingerprint %016x (existing job) vs %016x (this request)",
            have.fingerprint(), shape->fingerprint());
      }
      return absl::FailedPreconditionError(absl::StrFormat(
          "job \"%s\" already exists (id %d) with a different config: %s. "
          "Every worker must open a job with the same config; to start a new "
          "one, delete this job or choose another name",
          name, existing->job_id(), differences));
    }
    // Not in the fingerprint (a state moves between server counts), but a
    // job's servers must agree on how many they are.
    if (have.config().num_servers != shape->config().num_servers) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "job \"%s\" already exists (id %d) sharded over %d servers, the "
          "request says %d: every worker must open a job with the same "
          "config; to start a new one, delete this job or choose another name",
          name, existing->job_id(), have.config().num_servers,
          shape->config().num_servers));
    }
    if (have.server_index() != shape->server_index()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "job \"%s\" already exists (id %d) as server index %d, the request "
          "asks for server index %d",
          name, existing->job_id(), have.server_index(),
          shape->server_index()));
    }
    return OpenedJob{std::move(existing), false};
  }

  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      CreateLocked(*std::move(shape), /*restored=*/false, nullptr);
  if (!shard.ok()) return shard.status();
  return OpenedJob{*std::move(shard), true};
}

void JobStore::SetListener(JobListener* listener,
                           uint64_t default_every_steps) {
  absl::MutexLock lock(&mu_);
  listener_ = listener;
  default_every_steps_ = default_every_steps;
}

bool JobStore::Checkpointed(const JobShape& shape) const {
  return listener_ != nullptr &&
         (shape.config().checkpoint_every_steps > 0 ||
          default_every_steps_ > 0);
}

uint64_t JobStore::ChargedBytes(const JobShape& shape) const {
  // Saturated: each part may be near 2^64 for a job far too large, which
  // must fail the budget check, not wrap around into it.
  const uint64_t kMax = std::numeric_limits<uint64_t>::max();
  uint64_t bytes = shape.state_bytes();
  if (Checkpointed(shape)) bytes = bytes > kMax / 2 ? kMax : 2 * bytes;
  for (const uint64_t part :
       {shape.kept_weights_bytes(), ShardState::BookkeepingBytes(shape)}) {
    bytes = part > kMax - bytes ? kMax : bytes + part;
  }
  return bytes;
}

absl::StatusOr<std::shared_ptr<ShardState>> JobStore::Restore(
    ShardCheckpoint checkpoint) {
  absl::StatusOr<JobShape> shape = JobShape::Create(
      checkpoint.config, checkpoint.server_index, checkpoint.tenant);
  if (!shape.ok()) return shape.status();
  const JobKey key = shape->key();
  absl::MutexLock lock(&mu_);
  if (ids_by_key_.count(key) != 0 || creating_.count(key) != 0) {
    return absl::AlreadyExistsError(
        absl::StrCat(Describe(key), " already exists on this server"));
  }
  return CreateLocked(*std::move(shape), /*restored=*/true,
                      [&](ShardState& shard) {
                        return shard.ImportChunks(std::move(checkpoint.chunks));
                      });
}

absl::StatusOr<std::shared_ptr<ShardState>> JobStore::CreateLocked(
    JobShape shape, bool restored,
    const std::function<absl::Status(ShardState&)>& prepare) {
  const JobKey key = shape.key();
  const std::string& name = key.name;
  if (listener_ == nullptr && shape.config().checkpoint_every_steps > 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "job \"%s\" asks for a checkpoint every %d steps, but this server "
        "has no --checkpoint_dir: start it with one, or open the job with "
        "checkpoint_every_steps 0",
        name, shape.config().checkpoint_every_steps));
  }
  const uint64_t needed = ChargedBytes(shape);
  if (!budget_->TryReserve(needed)) {
    const uint64_t committed = std::min(budget_->used(), memory_limit_bytes_);
    const uint64_t bookkeeping = ShardState::BookkeepingBytes(shape);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "job \"%s\" needs %d bytes: %d of state%s, %d of weights kept for "
        "pulls at a step (2 x %d elements x %d bytes of %s) and %d of "
        "bookkeeping (for its %d servers, %d workers, %d tensors and %d "
        "chunks here), but %d of this server's %d byte budget are in use "
        "(jobs, payloads of steps in flight, open Step streams) or being "
        "allocated (%d "
        "free)",
        name, needed, shape.state_bytes() * (Checkpointed(shape) ? 2 : 1),
        Checkpointed(shape) ? " (twice its state: checkpoints are on)" : "",
        shape.kept_weights_bytes(), shape.shard().size(),
        DTypeSize(shape.config().weight_dtype),
        std::string(DTypeName(shape.config().weight_dtype)), bookkeeping,
        shape.config().num_servers, shape.config().num_workers,
        shape.config().tensors.size(), shape.shard().num_chunks(), committed,
        memory_limit_bytes_, memory_limit_bytes_ - committed));
  }
  // Allocating and first-touching the state takes a while (about 0.1 s per
  // GB): other jobs' RPCs, which look their jobs up here, must not wait for
  // it, so it runs unlocked with the name and the budget reserved.
  const uint64_t id = next_id_++;
  creating_.insert(key);
  mu_.Unlock();
  // Nothing may throw past here with mu_ released or the name reserved: the
  // caller's lock would be released twice, and the name would stay
  // "being created" for ever (every later request for it waiting).
  absl::StatusOr<std::shared_ptr<ShardState>> shard =
      absl::InternalError("job not created");
  try {
    shard = ShardState::Create(id, std::move(shape), pool_, payloads_,
                               metrics_, bench_noop_update_, budget_);
    if (shard.ok() && prepare) {
      if (absl::Status s = prepare(**shard); !s.ok()) shard = s;
    }
    if (shard.ok() && listener_ != nullptr) {
      listener_->JobAdded(*shard, restored);
    }
  } catch (const std::exception& e) {
    shard = CreationFailed(name, e);
  }
  mu_.Lock();
  creating_.erase(key);
  if (shard.ok()) {
    try {
      jobs_.emplace(id, *shard);
      ids_by_key_.emplace(key, id);
    } catch (const std::exception& e) {
      jobs_.erase(id);
      shard = CreationFailed(name, e);
    }
  }
  // (If the insertion threw after the listener was told, the listener keeps
  // only a weak reference and hooks of a job that is gone: nothing runs, and
  // its checkpoints on disk, if it was being restored, stay.)
  if (!shard.ok()) {
    budget_->Release(needed);
    return shard.status();
  }
  state_bytes_ += needed;
  UpdateGaugesLocked();
  return shard;
}

absl::Status JobStore::CreationFailed(const std::string& name,
                                      const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "job \"%s\": the server could not allocate its state", name));
  }
  return absl::InternalError(
      absl::StrFormat("job \"%s\" could not be created: %s", name, e.what()));
}

absl::StatusOr<std::shared_ptr<ShardState>> JobStore::Find(
    uint64_t job_id) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  }
  return it->second;
}

absl::StatusOr<std::shared_ptr<ShardState>> JobStore::Find(
    uint64_t job_id, uint64_t fingerprint) const {
  absl::ReaderMutexLock lock(&mu_);
  return FindLocked(job_id, fingerprint);
}

absl::StatusOr<std::shared_ptr<ShardState>> JobStore::FindLocked(
    uint64_t job_id, uint64_t fingerprint) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  }
  const uint64_t have = it->second->shape().fingerprint();
  if (fingerprint != have) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "fingerprint mismatch for job %d: the request has %016x, the job has "
        "%016x",
        job_id, fingerprint, have));
  }
  return it->second;
}

absl::StatusOr<std::shared_ptr<ShardState>> JobStore::Delete(
    uint64_t job_id, uint64_t fingerprint) {
  absl::StatusOr<std::shared_ptr<ShardState>> shard;
  {
    absl::MutexLock lock(&mu_);
    shard = FindLocked(job_id, fingerprint);
    if (!shard.ok()) return shard.status();
    (*shard)->MarkDeleted();
    jobs_.erase(job_id);
    ids_by_key_.erase((*shard)->shape().key());
    state_bytes_ -= ChargedBytes((*shard)->shape());
    budget_->Release(ChargedBytes((*shard)->shape()));
    UpdateGaugesLocked();
  }
  if (listener_ != nullptr) listener_->JobDeleted(*shard);
  return shard;
}

void JobStore::NoteStateReplaced(const std::shared_ptr<ShardState>& shard) {
  if (listener_ != nullptr) listener_->JobStateReplaced(shard);
}

std::vector<std::shared_ptr<ShardState>> JobStore::Jobs() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<std::shared_ptr<ShardState>> jobs;
  jobs.reserve(jobs_.size());
  for (const auto& [id, shard] : jobs_) jobs.push_back(shard);
  return jobs;
}

uint64_t JobStore::state_bytes() const {
  absl::ReaderMutexLock lock(&mu_);
  return state_bytes_;
}

void JobStore::UpdateGaugesLocked() {
  metrics_->state_bytes.Set(static_cast<double>(state_bytes_));
  metrics_->jobs.Set(static_cast<double>(jobs_.size()));
}

}  // namespace depot
