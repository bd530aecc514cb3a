// ShardState's intake of a step (docs/protocol.md): each Step stream's header
// (BeginStep), the weights overrides a worker sends before its gradient
// (OverrideWeights), and the gradient contributions themselves (Contribute),
// which move a chunk from idle through collecting to its sum or update
// (server/chunk_phase.h). Every request is checked in full before it changes
// anything.
#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/chunk_state.h"
#include "server/shard_state.h"
#include "server/step_hparams.h"

namespace depot {

absl::Status ShardState::BeginStep(
    uint64_t step, uint32_t worker_rank,
    std::vector<GroupHyperParams> group_hparams, const StepNumerics& numerics,
    const std::shared_ptr<StepReplySink>& stats_sink,
    std::string no_grad_tensors, NodeShape node_shape,
    SumOnlyTensors sum_only) {
  const std::string& sum_only_tensors = sum_only.bitmap;
  if (absl::Status s = CheckNotDeleted(); !s.ok()) return s;
  const Accepting accepting(*this);
  if (absl::Status s = accepting.status(); !s.ok()) return s;
  const uint32_t workers = shape_.config().num_workers;
  if (worker_rank >= workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker_rank ", worker_rank,
                     " is out of range: the job has ", workers, " workers"));
  }
  if (step == 0 || step > kMaxStep) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", step, " is out of range: steps run from 1 to ", kMaxStep));
  }
  if (absl::Status s = ValidateGroupHyperParams(shape_.layout(), group_hparams);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidateStepNumerics(numerics); !s.ok()) return s;
  if (absl::Status s = ValidateTensorBitmap(no_grad_tensors, "no_grad_tensors");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          ValidateTensorBitmap(sum_only_tensors, "sum_only_tensors");
      !s.ok()) {
    return s;
  }
  if (sum_only.omit_sums && (sum_only_tensors.empty() || workers != 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "omit_sums needs sum_only_tensors and a job of one worker (whose "
        "worker holds the whole gradient); this job has ",
        workers,
        sum_only_tensors.empty() ? " and the header no sum_only_tensors" : ""));
  }
  if (sum_only.fills_captures && sum_only_tensors.empty()) {
    return absl::InvalidArgumentError(
        "fills_captures needs sum_only_tensors: only the state of tensors "
        "the workers keep can fill a capture");
  }
  if (numerics.two_phase && stats_sink == nullptr) {
    return absl::InvalidArgumentError(
        "a two-phase step needs a stream to send its GradStats to");
  }
  std::sort(group_hparams.begin(), group_hparams.end(),
            [](const GroupHyperParams& a, const GroupHyperParams& b) {
              return a.param_group < b.param_group;
            });
  std::shared_ptr<TwoPhaseStep> two_phase;
  {
    absl::MutexLock lock(&steps_mu_);
    // Every chunk's applied step is completed_step_ or one more, so only these
    // steps can be replayed or applied; the chunks of an earlier step are
    // ABORTED one by one, and remembering it would only grow the map.
    if (step < completed_step_) return absl::OkStatus();
    // A later one is refused now: its chunks could become applicable while
    // the stream is open, and would then be updated with the settings of a
    // header that was never recorded (the defaults, not its lr or phases).
    if (step > completed_step_ + 2) {
      return absl::AbortedError(
          absl::StrCat("step ", step,
                       " is out of order for this server: it has completed "
                       "step ",
                       completed_step_,
                       ", and a step starts only once the step "
                       "two before it is complete"));
    }
    auto it = steps_.find(step);
    const bool inserted = it == steps_.end();
    if (inserted) {
      // Made whole before it enters the map: if an allocation throws (the
      // per-worker vectors of a job with billions of workers), no half-made
      // step is left for the next header to index into.
      StepProgress fresh;
      fresh.group_hparams = std::move(group_hparams);
      fresh.numerics = numerics;
      fresh.sum_only = sum_only_tensors;
      fresh.omit_sums = sum_only.omit_sums;
      fresh.fills_captures = sum_only.fills_captures;
      fresh.no_grad.resize(workers);
      fresh.node_shapes.resize(workers);
      fresh.header_seen.resize(workers, false);
      if (numerics.two_phase) {
        fresh.two_phase =
            std::make_shared<TwoPhaseStep>(step, shape_.shard().num_chunks());
      }
      it = steps_.emplace(step, std::move(fresh)).first;
    }
    StepProgress& progress = it->second;
    if (!inserted &&
        !SameGroupHyperParams(progress.group_hparams, group_hparams)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "group_hparams of step ", step,
          " differ from those of the step's first header on this server"));
    }
    if (!inserted && !SameStepNumerics(progress.numerics, numerics)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "loss_scale, two_phase or commit of step ", step,
          " differ from those of the step's first header on this server: "
          "every worker must send the same"));
    }
    if (!inserted && (progress.sum_only != sum_only_tensors ||
                      progress.omit_sums != sum_only.omit_sums ||
                      progress.fills_captures != sum_only.fills_captures)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sum_only_tensors, omit_sums or fills_captures of step ", step,
          " differ from those of the step's first header on this server: "
          "every stream of every worker must send the same"));
    }
    if (!progress.header_seen[worker_rank]) {
      progress.header_seen[worker_rank] = true;
      progress.no_grad[worker_rank] = std::move(no_grad_tensors);
      progress.node_shapes[worker_rank] = node_shape;
    } else if (progress.node_shapes[worker_rank] != node_shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", worker_rank, " in step ", step, " declares itself ",
          DescribeNodeShape(node_shape),
          " but its earlier Step stream of the "
          "step declared ",
          DescribeNodeShape(progress.node_shapes[worker_rank]),
          ": every stream of a worker's step must send the same local_ranks "
          "and bucket_chunks"));
    } else if (progress.no_grad[worker_rank] != no_grad_tensors) {
      return absl::FailedPreconditionError(absl::StrCat(
          "no_grad_tensors of worker ", worker_rank, " in step ", step,
          " differ from those of its earlier Step stream: every stream of a "
          "worker's step must send the same"));
    }
    two_phase = progress.two_phase;
  }
  // Outside steps_mu_: the stats may be delivered at once.
  if (two_phase != nullptr) two_phase->Subscribe(stats_sink);
  return absl::OkStatus();
}

absl::Status ShardState::ValidateTensorBitmap(const std::string& bitmap,
                                              absl::string_view field) const {
  if (bitmap.empty()) return absl::OkStatus();
  const uint64_t tensors = shape_.layout().tensors().size();
  const uint64_t bytes = (tensors + 7) / 8;
  if (bitmap.size() != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": has ", bitmap.size(), " bytes, the job's ",
                     tensors, " tensors need ", bytes, " (or none)"));
  }
  const unsigned last = static_cast<unsigned char>(bitmap.back());
  const unsigned used_bits = tensors % 8 == 0 ? 8 : tensors % 8;
  if (used_bits < 8 && (last >> used_bits) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": bits past tensor ", tensors - 1,
                     " are set; the job has ", tensors, " tensors"));
  }
  return absl::OkStatus();
}

absl::Status ShardState::OverrideWeights(uint64_t step, uint32_t worker_rank,
                                         uint64_t chunk_index,
                                         WeightsPiece piece,
                                         const NodeSender& sender) {
  if (absl::Status s = CheckNotDeleted(); !s.ok()) return s;
  const Accepting accepting(*this);
  if (absl::Status s = accepting.status(); !s.ok()) return s;
  const ShardRange& shard = shape_.shard();
  if (chunk_index < shard.first_chunk || chunk_index >= shard.end_chunk) {
    return absl::OutOfRangeError(
        absl::StrCat("weights override: chunk ", chunk_index,
                     " is not in this server's shard: chunks [",
                     shard.first_chunk, ", ", shard.end_chunk, ")"));
  }
  const uint32_t workers = shape_.config().num_workers;
  if (worker_rank >= workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker_rank ", worker_rank,
                     " is out of range: the job has ", workers, " workers"));
  }
  if (absl::Status s = sender.CheckOwns("weights override: chunk", chunk_index,
                                        step, worker_rank);
      !s.ok()) {
    return s;
  }
  if (piece.payload.empty() || piece.payload.size() % sizeof(float) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights override of chunk ", chunk_index, ": payload of ",
                     piece.payload.size(),
                     " bytes is not a positive number of fp32 values"));
  }
  const uint64_t chunk_elems = shape_.plan().chunk(chunk_index).size();
  const uint64_t values = piece.payload.size() / sizeof(float);
  if (piece.offset > chunk_elems || values > chunk_elems - piece.offset) {
    return absl::OutOfRangeError(
        absl::StrCat("weights override of chunk ", chunk_index, ": elements [",
                     piece.offset, ", ", piece.offset + values,
                     ") are past its ", chunk_elems, " elements"));
  }
  ChunkState& chunk = chunk_state(chunk_index);
  absl::MutexLock lock(&chunk.mu);
  const uint64_t applied = chunk.applied_step;
  if (step == applied && applied > 0) return absl::OkStatus();
  if (step != applied + 1) {
    return absl::AbortedError(absl::StrCat(
        "weights override of step ", step, " is out of order for chunk ",
        chunk_index, ": its last applied step is ", applied));
  }
  bool created = false;
  PendingStep& pending = chunk.Collect(workers, &created);
  if (pending.present[worker_rank]) {
    return absl::FailedPreconditionError(
        absl::StrCat("weights override of chunk ", chunk_index, " in step ",
                     step, " after worker ", worker_rank,
                     "'s gradient for it: send overrides before the chunk"));
  }
  // At most a chunk's worth of values per worker: a client that sends
  // overrides over and over must not grow the server's memory.
  std::vector<WeightsPiece>& pieces = pending.overrides[worker_rank];
  uint64_t held = 0;
  for (const WeightsPiece& earlier : pieces) held += earlier.payload.size();
  if (held + piece.payload.size() > chunk_elems * sizeof(float)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "weights overrides of chunk ", chunk_index, " in step ", step,
        " from worker ", worker_rank, ": ", held + piece.payload.size(),
        " bytes in all, more than the chunk's ", chunk_elems * sizeof(float),
        " (send each element once)"));
  }
  if (!TryHold(piece.payload.size())) {
    if (created) chunk.ForgetNew();  // no trace of the refused piece
    return absl::ResourceExhaustedError(absl::StrCat(
        "weights override of chunk ", chunk_index, " in step ", step,
        ": the server's memory budget (", budget_->limit(), " bytes, ",
        budget_->used(), " in use) has no room for its ", piece.payload.size(),
        " bytes"));
  }
  pieces.push_back(std::move(piece));
  return absl::OkStatus();
}

absl::Status ShardState::Contribute(Contribution contribution) {
  if (absl::Status s = CheckNotDeleted(); !s.ok()) return s;
  const Accepting accepting(*this);
  if (absl::Status s = accepting.status(); !s.ok()) return s;
  const uint64_t index = contribution.chunk_index;
  const uint64_t step = contribution.step;
  const uint32_t worker = contribution.worker_rank;
  const JobConfig& config = shape_.config();
  if (absl::Status s = CheckChunkPayload(index, contribution.payload.size(),
                                         DTypeSize(config.grad_dtype));
      !s.ok()) {
    return s;
  }
  if (worker >= config.num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker_rank ", worker, " is out of range: the job has ",
                     config.num_workers, " workers"));
  }
  if (absl::Status s =
          contribution.sender.CheckOwns("chunk", index, step, worker);
      !s.ok()) {
    return s;
  }
  // Looked up before the chunk's lock, which is never held while taking
  // steps_mu_.
  const bool two_phase = TwoPhaseOf(step) != nullptr;
  ChunkState& chunk = chunk_state(index);
  std::optional<ChunkWeights> replay;
  bool first_of_chunk = false;
  bool ack_retry = false;
  {
    absl::MutexLock lock(&chunk.mu);
    const uint64_t applied = chunk.applied_step;
    if (step == applied + 1) {
      bool created = false;
      PendingStep& pending = chunk.Collect(config.num_workers, &created);
      if (pending.present[worker]) {
        std::shared_ptr<StepReplySink> previous = pending.sinks[worker].lock();
        if (previous != nullptr && previous->IsOpen()) {
          return absl::AlreadyExistsError(
              absl::StrCat("duplicate contribution: worker ", worker,
                           " already sent chunk ", index, " of step ", step));
        }
        // The worker's earlier stream has ended and it is retrying: the retry
        // takes that stream's place. Once the sum or the update has started
        // it owns the earlier payload, which a correct retry repeats anyway.
        pending.sinks[worker] = contribution.sink;
        if (chunk.phase() == ChunkPhase::kCollecting) {
          pending.payloads[worker] = std::move(contribution.payload);
        }
        // A summed chunk was acknowledged to the earlier stream only (in a
        // two-phase step an updating chunk was summed first).
        ack_retry = two_phase && (chunk.phase() == ChunkPhase::kSummed ||
                                  chunk.phase() == ChunkPhase::kUpdating);
      } else {
        // Charged to the server's budget while it waits for the other
        // workers (a retry above takes its earlier payload's place and
        // charge): a client that sends more than the budget holds is
        // refused, never allowed to grow the server's memory.
        if (!WithinHeldLimit(contribution.payload.size())) {
          if (created) chunk.ForgetNew();
          return HeldLimitError(contribution.payload.size(),
                                absl::StrCat("chunk ", index, " of step ", step,
                                             " from worker ", worker));
        }
        if (!TryHold(contribution.payload.size())) {
          // Refused, it leaves no trace (an empty PendingStep would make the
          // chunk look busy to InitChunk).
          if (created) chunk.ForgetNew();
          return absl::ResourceExhaustedError(absl::StrCat(
              "chunk ", index, " of step ", step, " from worker ", worker,
              ": the server's memory budget (", budget_->limit(), " bytes, ",
              budget_->used(),
              " in use by jobs, the payloads of steps in flight and the open "
              "Step streams) has no "
              "room for its ",
              contribution.payload.size(),
              " bytes; send it again once the step's other chunks are "
              "answered (keep fewer chunks in flight)"));
        }
        payload_bytes_.fetch_add(contribution.payload.size(),
                                 std::memory_order_relaxed);
        // The chunk's first gradient (a weights override may have made its
        // PendingStep already).
        first_of_chunk = pending.count == 0;
        pending.present[worker] = true;
        pending.payloads[worker] = std::move(contribution.payload);
        pending.sinks[worker] = contribution.sink;
        if (++pending.count == config.num_workers) {
          chunk.Complete(two_phase);
          if (two_phase) {
            ScheduleTask([self = shared_from_this(), index, step] {
              self->RunSum(index, step);
            });
          } else {
            ScheduleTask([self = shared_from_this(), index, step] {
              self->RunUpdate(index, step);
            });
          }
        }
      }
    } else if (step == applied && applied > 0) {
      if (!chunk.ArraysFree()) {
        return absl::AbortedError(
            absl::StrCat("step ", step, " can no longer be replayed for chunk ",
                         index, ": step ", step + 1, " is being applied"));
      }
      const ChunkRange range = shape_.plan().chunk(index);
      replay = ChunkWeights{index,
                            std::make_shared<const std::string>(EncodeMaster(
                                range.begin, range.end, config.weight_dtype)),
                            0.0, true, nullptr};
    } else {
      return absl::AbortedError(
          absl::StrCat("step ", step, " is out of order for chunk ", index,
                       ": its last applied step is ", applied));
    }
  }
  if (first_of_chunk) NoteContributionStart(step);
  if (replay.has_value()) contribution.sink->Deliver(*std::move(replay));
  if (ack_retry) contribution.sink->DeliverAck(index);
  return absl::OkStatus();
}

void ShardState::NoteContributionStart(uint64_t step) {
  absl::MutexLock lock(&steps_mu_);
  auto it = steps_.find(step);
  if (it == steps_.end() || it->second.started) return;
  it->second.started = true;
  it->second.first_contribution = std::chrono::steady_clock::now();
}

}  // namespace depot
