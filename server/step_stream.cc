#include "server/step_stream.h"

#include <memory>
#include <string>
#include <utility>

#include "depot/v1/depot.pb.h"
#include "wire/byte_buffers.h"

namespace depot {
namespace {

using SharedPayload = std::shared_ptr<const std::string>;

// gRPC's release of a weights slice: drops the slice's reference.
void ReleasePayload(void* owner) { delete static_cast<SharedPayload*>(owner); }

// A StepResponse holding `weights`, its payload referenced in place.
grpc::ByteBuffer WeightsMessage(const ChunkWeights& weights) {
  const SharedPayload& payload = weights.payload;
  return wire::ChunkMessageBuffer(
      wire::StepMessage::kResponse, weights.chunk_index, payload->data(),
      payload->size(), &ReleasePayload, new SharedPayload(payload));
}

}  // namespace

StepStream::StepStream(StepTransport* transport, ServerMetrics* metrics)
    : metrics_(metrics), transport_(transport) {}

void StepStream::set_step(uint64_t step) {
  absl::MutexLock lock(&mu_);
  step_ = step;
}

void StepStream::set_finish_gate(FinishGate gate) {
  absl::MutexLock lock(&mu_);
  finish_gate_ = std::move(gate);
}

void StepStream::FinishGateOpened() {
  Action action;
  {
    absl::MutexLock lock(&mu_);
    gate_waiting_ = false;
    gate_passed_ = true;
    action = NextActionLocked();
  }
  Perform(action);
}

void StepStream::ExpectChunk() {
  absl::MutexLock lock(&mu_);
  ++expected_;
}

bool StepStream::MayRead() {
  absl::MutexLock lock(&mu_);
  if (UnansweredLocked() < kCredits) return true;
  read_paused_ = true;
  return false;
}

uint64_t StepStream::UnansweredLocked() const {
  // An answer may come before its contribution is counted (ExpectChunk
  // follows an accepted Contribute, and the update may be quicker).
  return expected_ > answered_.size() ? expected_ - answered_.size() : 0;
}

bool StepStream::AnsweredLocked(uint64_t index) {
  answered_.insert(index);
  if (!read_paused_ || UnansweredLocked() >= kCredits) return false;
  if (transport_ == nullptr || finishing_ || !failure_.ok()) return false;
  read_paused_ = false;
  ++resuming_;
  return true;
}

void StepStream::ReadsDone() {
  Action action;
  {
    absl::MutexLock lock(&mu_);
    reads_done_ = true;
    action = NextActionLocked();
  }
  Perform(action);
}

void StepStream::Deliver(ChunkWeights weights) {
  // A GradSum goes just before its chunk's weights, queued with them.
  Outgoing messages[2];
  size_t count = 0;
  if (weights.grad_sum != nullptr) {
    messages[count].kind = Outgoing::kGradSum;
    messages[count].weights.chunk_index = weights.chunk_index;
    messages[count].weights.capture_wanted = weights.capture_wanted;
    messages[count++].weights.grad_sum = weights.grad_sum;
  }
  messages[count].kind = Outgoing::kWeights;
  messages[count++].weights = std::move(weights);
  Enqueue(messages, count);
}

void StepStream::DeliverAck(uint64_t chunk_index) {
  Outgoing message;
  message.kind = Outgoing::kAck;
  message.ack_index = chunk_index;
  Enqueue(std::move(message));
}

void StepStream::DeliverGradStats(const GradStats& stats) {
  Outgoing message;
  message.kind = Outgoing::kGradStats;
  message.stats = stats;
  Enqueue(std::move(message));
}

void StepStream::Enqueue(Outgoing message) { Enqueue(&message, 1); }

void StepStream::Enqueue(Outgoing* messages, size_t count) {
  Action action;
  {
    absl::MutexLock lock(&mu_);
    if (finishing_ || !failure_.ok()) return;
    for (size_t i = 0; i < count; ++i) {
      outbox_.push_back(std::move(messages[i]));
    }
    action = NextActionLocked();
  }
  Perform(action);
}

void StepStream::Resume(StepTransport* transport) {
  if (transport == nullptr) return;
  // No finish is decided while resuming_ is set, so the transport is alive.
  transport->ResumeReading();
  Action action;
  {
    absl::MutexLock lock(&mu_);
    --resuming_;
    action = NextActionLocked();
  }
  Perform(action);
}

bool StepStream::IsOpen() const {
  absl::MutexLock lock(&mu_);
  return transport_ != nullptr && !finishing_ && failure_.ok();
}

bool StepStream::ended() const {
  absl::MutexLock lock(&mu_);
  return finishing_ || !failure_.ok();
}

void StepStream::OnWriteDone(bool ok) {
  Action action;
  StepTransport* resume = nullptr;
  {
    absl::MutexLock lock(&mu_);
    write_in_flight_ = false;
    // A chunk is answered once its ack or weights are written: what waits in
    // the send queue still holds a credit, so a client that does not read
    // stops being read too, and the queue stays short.
    if (ok &&
        (in_flight_.kind == Outgoing::kAck ||
         in_flight_.kind == Outgoing::kWeights) &&
        AnsweredLocked(in_flight_.kind == Outgoing::kAck
                           ? in_flight_.ack_index
                           : in_flight_.weights.chunk_index)) {
      resume = transport_;
    }
    if (ok && in_flight_.kind == Outgoing::kWeights) {
      const ChunkWeights& weights = in_flight_.weights;
      ++sent_;
      if (weights.replayed) ++replayed_;
      update_seconds_ += weights.update_seconds;
      metrics_->sent_step_bytes.Increment(
          static_cast<double>(weights.payload->size()));
    } else if (ok && in_flight_.kind == Outgoing::kGradSum) {
      metrics_->sent_step_bytes.Increment(
          static_cast<double>(in_flight_.weights.grad_sum->sums.size()));
    } else if (!ok && failure_.ok()) {
      failure_ = absl::CancelledError(
          "the client went away before the step's weights were sent");
    }
    in_flight_ = Outgoing();
    response_.Clear();  // gRPC holds its own references while it needs them
    action = NextActionLocked();
  }
  Perform(action);
  Resume(resume);
}

void StepStream::Fail(absl::Status status) {
  Action action;
  {
    absl::MutexLock lock(&mu_);
    if (finishing_ || !failure_.ok()) return;
    failure_ = std::move(status);
    outbox_.clear();
    action = NextActionLocked();
  }
  Perform(action);
}

void StepStream::Detach() {
  absl::MutexLock lock(&mu_);
  transport_ = nullptr;
  outbox_.clear();
}

StepStream::Action StepStream::NextActionLocked() {
  Action action;
  if (transport_ == nullptr || finishing_ || write_in_flight_) return action;
  action.transport = transport_;
  if (!failure_.ok()) {
    // Not while the reader is being resumed (ResumeReading runs).
    if (resuming_ > 0) return Action();
    finishing_ = true;
    action.kind = Action::kFinishWithError;
    action.status = failure_;
    return action;
  }
  if (!outbox_.empty()) {
    in_flight_ = std::move(outbox_.front());
    outbox_.pop_front();
    write_in_flight_ = true;
    v1::StepResponse response;
    switch (in_flight_.kind) {
      case Outgoing::kWeights:
        response_ = WeightsMessage(in_flight_.weights);
        break;
      case Outgoing::kAck:
        response.mutable_ack()->set_index(in_flight_.ack_index);
        wire::SerializeToBuffer(response, &response_);
        break;
      case Outgoing::kGradSum: {
        v1::GradSum* sum = response.mutable_grad_sum();
        sum->set_index(in_flight_.weights.chunk_index);
        sum->set_sums(in_flight_.weights.grad_sum->sums);
        for (uint32_t t : in_flight_.weights.grad_sum->skipped_tensors) {
          sum->add_skipped_tensors(t);
        }
        sum->mutable_commit()->set_clip_coef(
            in_flight_.weights.grad_sum->commit.clip_coef);
        sum->mutable_commit()->set_skip(
            in_flight_.weights.grad_sum->commit.skip);
        sum->set_capture_wanted(in_flight_.weights.capture_wanted);
        wire::SerializeToBuffer(response, &response_);
        break;
      }
      case Outgoing::kGradStats: {
        v1::GradStats* stats = response.mutable_grad_stats();
        stats->set_sum_squares(in_flight_.stats.sum_squares);
        stats->set_max_abs(in_flight_.stats.max_abs);
        stats->set_non_finite(in_flight_.stats.non_finite);
        stats->set_zero_count(in_flight_.stats.zero_count);
        wire::SerializeToBuffer(response, &response_);
        break;
      }
    }
    action.kind = Action::kWrite;
    action.response = &response_;
    return action;
  }
  if (reads_done_ && sent_ == expected_ && resuming_ == 0) {
    if (finish_gate_ && !gate_passed_) {
      // Held until a checkpoint is durable (--checkpoint_max_lag_steps).
      if (gate_waiting_) return Action();
      if (!finish_gate_(step_)) {
        gate_waiting_ = true;
        return Action();
      }
      gate_passed_ = true;
    }
    finishing_ = true;
    v1::StepResponse response;
    v1::StepStats* stats = response.mutable_stats();
    stats->set_step(step_);
    stats->set_chunks(sent_);
    stats->set_chunks_replayed(replayed_);
    stats->set_update_seconds(update_seconds_);
    wire::SerializeToBuffer(response, &response_);
    action.kind = Action::kWriteLastAndFinish;
    action.response = &response_;
  }
  return action;
}

void StepStream::Perform(const Action& action) {
  // The transport is alive here although mu_ is released: it is detached only
  // once the RPC is over, which cannot happen before the call below (a finish
  // is decided only while no write is in flight, and only once).
  switch (action.kind) {
    case Action::kNone:
      return;
    case Action::kWrite:
      action.transport->StartWriting(action.response);
      return;
    case Action::kWriteLastAndFinish:
      action.transport->WriteLastAndFinish(action.response);
      return;
    case Action::kFinishWithError:
      action.transport->FinishWithError(action.status);
      return;
  }
}

}  // namespace depot
