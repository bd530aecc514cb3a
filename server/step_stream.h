// StepStream: the sending half of one Step RPC, as a state machine over a
// non-blocking transport (the gRPC callback reactor; a fake in tests).
//
// Chunk weights delivered by update threads (or by a replay), and in a
// two-phase step the chunk acks and the shard's GradStats, are queued and
// written one at a time, in delivery order, so neither the reader of the
// stream nor the update pool ever waits on the network. Once the worker has
// half-closed and every chunk it contributed has been written, the stream
// writes its StepStats and finishes OK. A failure (bad message, job deleted,
// shutdown, client gone) finishes it at once with that status, after the write
// in flight if any: the transport is never asked to finish twice, nor to write
// after finishing.
//
// A chunk's weights go out as a message whose payload slice references the
// chunk's shared weights buffer (wire/byte_buffers.h): no copy, and the buffer
// lives until gRPC has sent it.
//
// Thread safety: all methods may be called from any thread. The transport is
// called with no lock held.
#ifndef DEPOT_SERVER_STEP_STREAM_H_
#define DEPOT_SERVER_STEP_STREAM_H_

#include <cstdint>
#include <deque>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/byte_buffer.h"
#include "server/metrics.h"
#include "server/step_reply_sink.h"

namespace depot {

// What a StepStream needs from its RPC. None of these may block, nor call back
// into the StepStream before returning.
class StepTransport {
 public:
  virtual ~StepTransport() = default;
  // Starts writing `response`, a serialized StepResponse; the transport then
  // calls StepStream::OnWriteDone. `response` stays valid and unchanged until
  // then.
  virtual void StartWriting(const grpc::ByteBuffer* response) = 0;
  // Writes `response` as the last message and ends the RPC OK.
  virtual void WriteLastAndFinish(const grpc::ByteBuffer* response) = 0;
  // Ends the RPC with `status` (not OK).
  virtual void FinishWithError(const absl::Status& status) = 0;
  // Starts the next read, after StepStream::MayRead said to stop (server-side
  // credits). Never called once the RPC is finishing.
  virtual void ResumeReading() {}
};

class StepStream final : public StepReplySink {
 public:
  // `transport` must stay valid until Detach; `metrics` must outlive the
  // stream.
  StepStream(StepTransport* transport, ServerMetrics* metrics);

  StepStream(const StepStream&) = delete;
  StepStream& operator=(const StepStream&) = delete;

  // The step the stream's header named, reported in its StepStats.
  void set_step(uint64_t step);

  // What may hold the stream's end (ShardState::MayFinishStep): called with
  // the step once everything else is done; true, finish now; false, the gate
  // calls FinishGateOpened once the stream may finish. Failures are never
  // held. Set before the stream can finish (with set_step).
  using FinishGate = std::function<bool(uint64_t step)>;
  void set_finish_gate(FinishGate gate);
  void FinishGateOpened();

  // Records that one more chunk's weights are owed to this stream (the reader
  // had a contribution accepted).
  void ExpectChunk();

  // Server-side credits: a stream has at most kCredits of its contributions
  // unanswered (no ack nor weights for them written yet). The reader
  // asks after each message: true, read the next; false, stop reading until
  // the stream calls StepTransport::ResumeReading, once an answer has made
  // room. So a client that ignores its window is slowed by HTTP/2 flow
  // control instead of growing the server's memory (its payloads are charged
  // to the budget too: ShardState::Contribute).
  static constexpr uint64_t kCredits = 16;
  bool MayRead();
  // The worker has half-closed: finish once every expected chunk is written.
  void ReadsDone();

  // StepReplySink: each queues its message to be written; dropped once the
  // stream ends.
  void Deliver(ChunkWeights weights) override;
  void DeliverAck(uint64_t chunk_index) override;
  void DeliverGradStats(const GradStats& stats) override;
  // False once the stream has failed, finished or been detached.
  bool IsOpen() const override;

  // The transport finished the write started last; `ok` false means the client
  // is gone, which fails the stream with CANCELLED.
  void OnWriteDone(bool ok);

  // Ends the stream with `status` (not OK): queued weights are dropped, and the
  // RPC finishes once no write is in flight. The first failure wins; ignored
  // once the stream has decided to finish.
  void Fail(absl::Status status);

  // True once the stream has failed or decided to finish: the reader stops.
  bool ended() const;

  // The RPC is over (the transport is gone): later calls touch no transport.
  void Detach();

 private:
  // The transport call decided under the lock, made after releasing it.
  struct Action {
    enum Kind { kNone, kWrite, kWriteLastAndFinish, kFinishWithError };
    Kind kind = kNone;
    StepTransport* transport = nullptr;
    const grpc::ByteBuffer* response = nullptr;
    absl::Status status;
  };
  // One message waiting to be written.
  struct Outgoing {
    // kGradSum: weights.grad_sum, written just before the chunk's weights.
    enum Kind { kWeights, kAck, kGradStats, kGradSum };
    Kind kind = kWeights;
    ChunkWeights weights;    // kWeights, kGradSum
    uint64_t ack_index = 0;  // kAck
    GradStats stats;         // kGradStats
  };
  // Queues `message` (or `count` messages, in order, none between them) and
  // starts writing if the stream is idle.
  void Enqueue(Outgoing message);
  void Enqueue(Outgoing* messages, size_t count);
  // Counts chunk `index` as answered (the first ack or weights for it
  // written), and says whether the reader is to be resumed (then resuming_
  // is raised: call Resume).
  bool AnsweredLocked(uint64_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t UnansweredLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Resumes the reader through `transport` (none: nothing to do).
  void Resume(StepTransport* transport);
  Action NextActionLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Perform(const Action& action);

  ServerMetrics* const metrics_;

  mutable absl::Mutex mu_;
  StepTransport* transport_ ABSL_GUARDED_BY(mu_);
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Outgoing> outbox_ ABSL_GUARDED_BY(mu_);
  uint64_t expected_ ABSL_GUARDED_BY(mu_) = 0;
  // The chunks answered so far (each counted once: a two-phase chunk is
  // acknowledged, then answered with weights).
  absl::flat_hash_set<uint64_t> answered_ ABSL_GUARDED_BY(mu_);
  // The reader stopped for want of credits (MayRead), and is being resumed
  // (the transport call in progress: the stream does not finish meanwhile).
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  int resuming_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t replayed_ ABSL_GUARDED_BY(mu_) = 0;
  double update_seconds_ ABSL_GUARDED_BY(mu_) = 0.0;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  FinishGate finish_gate_ ABSL_GUARDED_BY(mu_);
  // The gate said to wait, and has not opened yet; it opened.
  bool gate_waiting_ ABSL_GUARDED_BY(mu_) = false;
  bool gate_passed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  // The message being written and its wire form; valid while
  // write_in_flight_.
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  Outgoing in_flight_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer response_ ABSL_GUARDED_BY(mu_);
  // Set once the transport has been (or is about to be) told to finish.
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace depot

#endif  // DEPOT_SERVER_STEP_STREAM_H_
