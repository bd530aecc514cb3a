#include "server/checkpointer.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace depot {

Checkpointer::Checkpointer(CheckpointDirectory* directory,
                           CheckpointPolicy policy, ServerMetrics* metrics,
                           std::function<void(const std::string&)> log)
    : directory_(directory),
      policy_(policy),
      metrics_(metrics),
      log_(std::move(log)),
      writer_([this] { RunWriter(); }) {}

Checkpointer::~Checkpointer() { Stop(); }

void Checkpointer::JobAdded(const std::shared_ptr<ShardState>& shard,
                            bool restored) {
  const JobKey key = shard->shape().key();
  if (!restored) {
    // Checkpoints of this name that were not restored belong to another
    // job (or failed to verify): keep them apart from this job's.
    Enqueue([this, key] {
      absl::StatusOr<std::string> aside = directory_->SetAside(key);
      if (!aside.ok()) {
        log_(absl::StrFormat("cannot set aside old checkpoints of %s: %s",
                             Describe(key), aside.status().ToString()));
      } else if (!aside->empty()) {
        log_(absl::StrFormat(
            "%s was created afresh; its earlier checkpoints, which "
            "were not restored, were moved to %s",
            Describe(key), *aside));
      }
    });
  }
  // The job's own interval, else the server's.
  const uint64_t every = shard->shape().config().checkpoint_every_steps > 0
                             ? shard->shape().config().checkpoint_every_steps
                             : policy_.every_steps;
  if (every == 0) return;
  CaptureHooks hooks;
  hooks.every_steps = every;
  hooks.max_lag_steps = policy_.max_lag_steps;
  std::weak_ptr<ShardState> job = shard;
  hooks.on_captured = [this, job](std::unique_ptr<ShardCheckpoint> capture) {
    // The task owns the capture until it runs; a shared_ptr makes the task
    // copyable.
    auto held =
        std::make_shared<std::unique_ptr<ShardCheckpoint>>(std::move(capture));
    Enqueue([this, job, held] { Write(job, std::move(*held)).IgnoreError(); });
  };
  hooks.on_skipped = [this, key](uint64_t step) {
    metrics_->checkpoints_skipped.Increment();
    log_(absl::StrFormat(
        "checkpoint of %s at step %d skipped: the previous one is "
        "still being written",
        Describe(key), step));
  };
  shard->EnableCaptures(std::move(hooks));
}

void Checkpointer::JobDeleted(const std::shared_ptr<ShardState>& shard) {
  RemoveCheckpoints(shard->shape().key(), "deleted job");
}

void Checkpointer::JobStateReplaced(const std::shared_ptr<ShardState>& shard) {
  RemoveCheckpoints(shard->shape().key(),
                    "job whose state was replaced by ImportState:");
}

void Checkpointer::RemoveCheckpoints(const JobKey& key,
                                     const std::string& why) {
  // Queued after any write of the job's last capture, so it removes that
  // one too.
  Enqueue([this, key, why] {
    if (absl::Status s = directory_->RemoveJob(key); !s.ok()) {
      log_(absl::StrFormat("cannot remove the checkpoints of %s %s: %s", why,
                           Describe(key), s.ToString()));
    } else {
      log_(absl::StrFormat("removed the checkpoints of %s %s", why,
                           Describe(key)));
    }
  });
}

absl::Status Checkpointer::RunOnWriter(Task task) {
  auto done = std::make_shared<absl::Notification>();
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      return absl::UnavailableError(
          "the server is shutting down: its checkpoints cannot be read");
    }
    queue_.push_back([task = std::move(task), done] {
      task();
      done->Notify();
    });
  }
  done->WaitForNotification();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> Checkpointer::CompleteSteps(
    const JobKey& key) {
  std::vector<uint64_t> steps;
  if (absl::Status s = RunOnWriter(
          [this, &key, &steps] { steps = directory_->CompleteSteps(key); });
      !s.ok()) {
    return s;
  }
  return steps;
}

absl::StatusOr<Checkpointer::Steps> Checkpointer::ListSteps(const JobKey& key) {
  Steps steps;
  if (absl::Status s = RunOnWriter([this, &key, &steps] {
        steps.complete = directory_->CompleteSteps(key);
        steps.lacking_worker_state =
            directory_->StepsLackingWorkerState(key, steps.complete);
      });
      !s.ok()) {
    return s;
  }
  return steps;
}

absl::StatusOr<ShardCheckpoint> Checkpointer::Load(const JobKey& key,
                                                   uint64_t step) {
  absl::StatusOr<ShardCheckpoint> loaded =
      absl::UnavailableError("not read");
  if (absl::Status s = RunOnWriter([this, &key, step, &loaded] {
        loaded = directory_->Load(key, step);
      });
      !s.ok()) {
    return s;
  }
  return loaded;
}

void Checkpointer::RemoveStepsAfter(const JobKey& key, uint64_t step) {
  Enqueue([this, key, step] {
    if (absl::Status s = directory_->RemoveStepsAfter(key, step); !s.ok()) {
      log_(absl::StrFormat(
          "cannot remove the checkpoints of %s after step %d, which it "
          "was rolled back to: %s",
          Describe(key), step, s.ToString()));
    }
  });
}

void Checkpointer::Enqueue(Task task) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
}

void Checkpointer::RunWriter() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || !queue_.empty();
    };
    mu_.Await(absl::Condition(&ready));
    if (queue_.empty()) return;  // stopping, nothing left
    Task task = std::move(queue_.front());
    queue_.pop_front();
    running_task_ = true;
    mu_.Unlock();
    task();
    mu_.Lock();
    running_task_ = false;
  }
}

void Checkpointer::Flush() { FlushUntil(absl::InfiniteFuture()); }

bool Checkpointer::FlushUntil(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.empty() && !running_task_;
  };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

int Checkpointer::Pending() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(queue_.size()) + (running_task_ ? 1 : 0);
}

void Checkpointer::Abandon() {
  absl::MutexLock lock(&abandon_mu_);
  abandoned_ = true;
}

bool Checkpointer::Abandoned() {
  absl::MutexLock lock(&abandon_mu_);
  return abandoned_;
}

CheckpointDirectory::WriteGate Checkpointer::WriteGate(absl::Time start) {
  return [this, start, written = uint64_t{0}](uint64_t bytes) mutable {
    absl::MutexLock lock(&abandon_mu_);
    if (policy_.write_bytes_per_second > 0 && bytes > 0) {
      // The piece may start once the bytes before it have had their time.
      const absl::Time due =
          start +
          absl::Seconds(static_cast<double>(written) /
                        static_cast<double>(policy_.write_bytes_per_second));
      abandon_mu_.AwaitWithDeadline(absl::Condition(&abandoned_), due);
      written += bytes;
    }
    if (!abandoned_) return absl::OkStatus();
    return absl::UnavailableError(
        "server is shutting down: the write was abandoned, its temporary "
        "file removed");
  };
}

void Checkpointer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  writer_.join();
}

absl::StatusOr<uint64_t> Checkpointer::CheckpointNow(
    const std::shared_ptr<ShardState>& shard) {
  absl::StatusOr<std::unique_ptr<ShardCheckpoint>> capture =
      shard->CaptureNow();
  if (!capture.ok()) return capture.status();
  const uint64_t step = (*capture)->step;
  auto held = std::make_shared<std::unique_ptr<ShardCheckpoint>>(
      *std::move(capture));
  auto done = std::make_shared<absl::Notification>();
  auto result = std::make_shared<absl::Status>();
  std::weak_ptr<ShardState> job = shard;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      // The writer may be gone: nothing queued now would run.
      shard->ReleaseCapture(std::move(*held));
      return absl::UnavailableError(
          "the server is shutting down: no checkpoint is taken");
    }
    queue_.push_back([this, job, held, done, result] {
      *result = Write(job, std::move(*held));
      done->Notify();
    });
  }
  done->WaitForNotification();
  if (!result->ok()) return *result;
  return step;
}

absl::Status Checkpointer::Write(const std::weak_ptr<ShardState>& job,
                                 std::unique_ptr<ShardCheckpoint> capture) {
  std::shared_ptr<ShardState> shard = job.lock();
  if (shard == nullptr || shard->deleted()) {
    return absl::AbortedError("the job was deleted before its checkpoint "
                              "was written");
  }
  const JobKey key = capture->key();
  const uint64_t step = capture->step;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<uint64_t> bytes =
      directory_->Write(*capture, WriteGate(absl::Now()));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (!bytes.ok() && Abandoned()) {
    // Not a failure of the disk: no alert, and the message says why.
    log_(absl::StrFormat(
        "checkpoint of %s at step %d not written: the server is "
        "shutting down and its grace period is over (%s)",
        Describe(key), step, bytes.status().message()));
    shard->ReleaseCapture(std::move(capture));
    return absl::UnavailableError(absl::StrFormat(
        "server is shutting down: the checkpoint of step %d was not written",
        step));
  }
  if (!bytes.ok()) {
    metrics_->checkpoint_failures.Increment();
    log_(absl::StrFormat(
        "CHECKPOINT FAILED: %s step %d was not checkpointed: %s (the "
        "next checkpoint step writes a new file)",
        Describe(key), step, bytes.status().ToString()));
    shard->ReleaseCapture(std::move(capture));
    return bytes.status();
  } else {
    metrics_->checkpoints_written.Increment();
    metrics_->checkpoint_bytes.Increment(static_cast<double>(*bytes));
    metrics_->checkpoint_write_seconds.Observe(seconds);
    metrics_->checkpoint_last_success.Set(absl::ToUnixSeconds(absl::Now()));
    uint64_t lacking = 0;
    for (const ChunkSnapshot& chunk : capture->chunks) {
      lacking += chunk.lacks_worker_state ? 1 : 0;
    }
    log_(absl::StrFormat(
        "checkpoint of %s at step %d written to %s (%d bytes, %.3f s)%s",
        Describe(key), step, directory_->StepDirectory(key, step), *bytes,
        seconds,
        lacking == 0
            ? ""
            : absl::StrFormat("; %d chunks lack the state of the tensors "
                              "the workers keep",
                              lacking)));
    if (absl::Status s = directory_->Prune(key, policy_.keep); !s.ok()) {
      log_(absl::StrFormat("cannot prune old checkpoints of %s: %s",
                           Describe(key), s.ToString()));
    }
  }
  shard->ReleaseCapture(std::move(capture));
  return absl::OkStatus();
}

int RestoreJobs(const CheckpointDirectory& directory, JobStore& jobs,
                ServerMetrics& metrics,
                const std::function<void(const std::string&)>& log) {
  int restored = 0;
  for (const JobKey& key : directory.Jobs()) {
    absl::StatusOr<ShardCheckpoint> checkpoint =
        directory.LoadNewest(key, [&](uint64_t step, const absl::Status& why) {
          log(absl::StrFormat(
              "checkpoint of %s at step %d cannot be used, trying "
              "an older one: %s",
              Describe(key), step, why.ToString()));
        });
    if (!checkpoint.ok()) {
      metrics.job_restore_failures.Increment();
      log(absl::StrFormat("%s NOT restored: %s", Describe(key),
                          checkpoint.status().ToString()));
      continue;
    }
    const uint64_t step = checkpoint->step;
    const uint32_t server = checkpoint->server_index;
    absl::StatusOr<std::shared_ptr<ShardState>> shard =
        jobs.Restore(*std::move(checkpoint));
    if (!shard.ok()) {
      metrics.job_restore_failures.Increment();
      log(absl::StrFormat("%s NOT restored from step %d: %s", Describe(key),
                          step, shard.status().ToString()));
      continue;
    }
    metrics.jobs_restored.Increment();
    ++restored;
    log(absl::StrFormat("restored %s (server %d of %d) at step %d from %s",
                        Describe(key, (*shard)->job_id()), server,
                        (*shard)->shape().config().num_servers, step,
                        directory.StepDirectory(key, step)));
  }
  return restored;
}

}  // namespace depot
