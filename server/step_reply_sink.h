// StepReplySink: where a step's replies to a worker go: each chunk's updated
// weights once its update is done, and, in a two-phase step, the chunk's
// acknowledgement once summed and the shard's gradient statistics. A Step
// stream is one; ShardState knows it only through this interface, so the
// shard's logic is tested without gRPC.
#ifndef DEPOT_SERVER_STEP_REPLY_SINK_H_
#define DEPOT_SERVER_STEP_REPLY_SINK_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/grad_stats.h"
#include "server/step_numerics.h"

namespace depot {

// The updated weights of one chunk, in the job's weight dtype. One payload is
// shared by every stream that receives the chunk.
// A chunk's GradSum (depot.proto), for a step with sum-only tensors.
struct GradSumReply {
  std::string sums;  // GradSum.sums
  // GradSum.skipped_tensors: the chunk's sum-only tensors no worker has a
  // gradient for, ascending.
  std::vector<uint32_t> skipped_tensors;
  // GradSum.commit: the decision the chunk's update applied.
  CommitDecision commit;
};

struct ChunkWeights {
  uint64_t chunk_index = 0;
  std::shared_ptr<const std::string> payload;
  // CPU time of the update that produced them; 0 for a replay.
  double update_seconds = 0.0;
  // True when the chunk had already applied the step (a resent contribution).
  bool replayed = false;
  // A step with sum-only tensors: the chunk's GradSum.sums (depot.proto),
  // sent before the weights; null when the chunk holds none of them.
  std::shared_ptr<const GradSumReply> grad_sum;
  // With grad_sum, to worker 0 only: the chunk's copy in a checkpoint
  // capture waits for the workers' state of its sum-only tensors
  // (GradSum.capture_wanted).
  bool capture_wanted = false;
};

class StepReplySink {
 public:
  virtual ~StepReplySink() = default;

  // Takes one chunk's weights. Called from an update thread, or from the caller
  // of ShardState::Contribute for a replay, with no ShardState lock held. Must
  // not block.
  virtual void Deliver(ChunkWeights weights) = 0;

  // Two-phase steps. Chunk `chunk_index` has every worker's contribution and
  // is summed; called from an update thread (or from the caller of
  // ShardState::Contribute for a retry) with no ShardState lock held. Must not
  // block.
  virtual void DeliverAck(uint64_t chunk_index) = 0;
  // The statistics of the shard's whole summed gradient, once per step; same
  // calling rules.
  virtual void DeliverGradStats(const GradStats& stats) = 0;

  // False once the stream has ended (finished, failed, or cancelled by its
  // client). A contribution whose sink is no longer open may be replaced by a
  // retry of the same worker. May be called with a ShardState lock held.
  virtual bool IsOpen() const = 0;
};

}  // namespace depot

#endif  // DEPOT_SERVER_STEP_REPLY_SINK_H_
