// One worker's Step stream to one server for one step, over one of its
// connections, pipelined: the stream's gradient chunks (the whole shard, or a
// contiguous part of it when a one-phase step uses several connections) go
// out in ascending index order while at most `max_inflight_chunks` of them
// are unanswered, and a reader thread copies each answered chunk's weights
// into place as it arrives.
//
// No payload goes through a protobuf `bytes` (wire/step_codec.h): a gradient
// chunk is sent as a slice that references the caller's gradient buffer, and
// the stream returns only once gRPC has released every such slice; weights
// are copied once, from the received slices into weights_out. A chunk is
// answered by its weights, or in a two-phase step first by its ack (summed on
// the server): the window then bounds the server's unsummed payloads, and
// cannot deadlock although no weights come before the commit. In two phases the
// writer, after the chunks, waits for the server's GradStats, hands them to the
// step's CommitBarrier and sends the commit it returns.
#ifndef DEPOT_CLIENT_SRC_STEP_STREAM_H_
#define DEPOT_CLIENT_SRC_STEP_STREAM_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "call_group.h"
#include "channel.h"
#include "depot/client.h"
#include "depot/dtype.h"
#include "depot/job_config.h"
#include "depot/shard_plan.h"
#include "step_commit.h"

namespace depot::client_internal {

// New master weights for elements [offset, offset + count) of a chunk
// (offset from the chunk's start), sent before the chunk's gradient.
struct ChunkOverride {
  uint64_t chunk_index = 0;
  uint64_t offset = 0;
  const float* values = nullptr;
  uint64_t count = 0;
};

// Where a streamed step's gradient chunks come from (the GPU transfer
// engine's pinned slots, client/src/gpu/transfer_engine.h) instead of one
// flat host buffer: chunks in the order they become ready, not index order.
class ChunkFeed {
 public:
  struct Ready {
    uint64_t index = 0;
    const char* data = nullptr;  // the chunk's gradient, grad dtype
  };
  virtual ~ChunkFeed() = default;
  // Blocks until the stream's next chunk is ready; nullopt once the feed has
  // given all its chunks or was aborted.
  virtual std::optional<Ready> Next() = 0;
  // gRPC has let go of chunk `index`'s bytes (they were written, or the
  // stream was dropped): its memory may be reused. Any thread.
  virtual void Released(uint64_t index) = 0;
};

// Where a streamed step's weights go instead of one flat host buffer.
class WeightSink {
 public:
  virtual ~WeightSink() = default;
  // Chunk `index`'s weights, `bytes` bytes (already checked against the
  // chunk); copy(dst, offset, n) writes bytes [offset, offset + n) of them
  // to dst, so that the sink may take them in parts (and start moving the
  // first before the last is written). Called on a stream's reader thread,
  // concurrently for different chunks; may block (backpressure). An error
  // ends the stream with it.
  using CopyWeights =
      std::function<void(char* dst, uint64_t offset, uint64_t n)>;
  virtual absl::Status Accept(uint64_t index, uint64_t bytes,
                              const CopyWeights& copy) = 0;
  // A chunk's GradSum (depot.proto).
  struct GradSum {
    const std::string& sums;
    StepCommit commit;  // the decision the chunk's update applied
    // The chunk's sum-only tensors no worker has a gradient for.
    std::vector<uint32_t> skipped_tensors;
    // The server's checkpoint capture of this step waits for the chunk's
    // sum-only tensors' state (GradSum.capture_wanted).
    bool capture_wanted = false;
  };
  // A step with sum-only tensors (StreamedStep::sum_only_tensors): chunk
  // `index`'s GradSum, which the server sends just before that chunk's
  // weights, on the same stream. Same calling rules as Accept. The default
  // refuses them (INTERNAL).
  virtual absl::Status AcceptGradSum(uint64_t index, const GradSum& sum);
};

struct StepStreamParams {
  uint64_t job_id = 0;
  uint64_t fingerprint = 0;
  uint64_t step = 0;
  uint32_t worker_rank = 0;
  const std::vector<GroupHyperParams>* group_hparams = nullptr;
  double loss_scale = 1.0;
  // One phase with a known decision (sent in the header); else the default.
  std::optional<StepCommit> known_commit;
  // The header's no_grad_tensors bitmap (empty: none); null: none.
  const std::string* no_grad_tensors = nullptr;
  // The header's sum_only_tensors bitmap (a streamed step's, for its sink's
  // AcceptGradSum); null: none. omit_sums: the header's.
  const std::string* sum_only_tensors = nullptr;
  bool omit_sums = false;
  bool fills_captures = false;  // StepHeader.fills_captures
  // Weights overrides of the whole job, sorted by chunk index; each stream
  // sends those of its chunks. Null: none.
  const std::vector<ChunkOverride>* overrides = nullptr;
  // Two phases: the step's barrier, shared by its streams; null in one phase.
  CommitBarrier* barrier = nullptr;
  const ShardPlan* plan = nullptr;
  uint32_t server = 0;  // the shard this stream's chunks are in
  // The chunks this stream carries: REQUIRES a non-empty range inside the
  // server's shard, the whole shard in a two-phase step (a fed stream:
  // the range its feed's chunks lie in, which the feed may leave empty in
  // a two-phase step).
  uint64_t first_chunk = 0;
  uint64_t end_chunk = 0;
  DType grad_dtype = DType::kFloat32;
  DType weight_dtype = DType::kFloat32;
  const void* grads = nullptr;  // the whole flat gradient buffer
  void* weights_out = nullptr;  // the whole flat weight buffer
  // Or, a streamed step: the gradient chunks come from `feed` (exactly
  // `feed_chunks` of them, each inside [first_chunk, end_chunk), in any
  // order) and the weights go to `sink`; grads, weights_out and overrides
  // are then unused.
  ChunkFeed* feed = nullptr;
  WeightSink* sink = nullptr;
  uint64_t feed_chunks = 0;
  // A node worker's local rank (StepHeader.local_ranks; 0: not a node).
  uint32_t local_ranks = 0;
  uint32_t local_rank = 0;
  uint64_t bucket_chunks = 0;
  int max_inflight_chunks = 1;  // >= 1
  absl::Time deadline;
  // ClientOptions::unavailable_retry (job_impl.cc's retries).
  absl::Duration unavailable_retry = absl::ZeroDuration();
};

// A streamed step: this process sends the chunks its routes list, each route
// one Step stream, and the weights go to `sink` (the GPU transfer engine;
// RunStreamedStep in job_impl.h).
struct StreamedStep {
  uint64_t step = 0;
  // group_hparams, loss_scale, known_commit and no_grad_tensors as in
  // Job::Step; weight_overrides must be empty.
  const StepOptions* options = nullptr;
  // A node worker's shape (StepHeader.local_ranks; 0: the worker is this one
  // process).
  uint32_t local_ranks = 0;
  uint32_t local_rank = 0;
  uint64_t bucket_chunks = 0;
  struct Route {
    uint32_t server = 0;
    // The stream's chunks lie in [first_chunk, end_chunk), inside the
    // server's shard; `feed` gives `chunks` of them.
    uint64_t first_chunk = 0;
    uint64_t end_chunk = 0;
    uint64_t chunks = 0;
    ChunkFeed* feed = nullptr;
  };
  std::vector<Route> routes;
  WeightSink* sink = nullptr;
  // The tensors whose optimizer this node runs itself in a job of several
  // workers (the offload fraction, docs/gpu.md): the servers send their
  // summed gradient to `sink` (AcceptGradSum) instead of updating them.
  std::vector<uint32_t> sum_only_tensors;
  // A job of one worker: the GradSums carry no sums (StepHeader.omit_sums),
  // only the decision and the skipped tensors.
  bool omit_sums = false;
  // The sink sends the sum-only tensors' state into the servers' checkpoint
  // captures that ask for it (StepHeader.fills_captures, GradSum.
  // capture_wanted; docs/checkpoints.md, "The state the workers keep").
  bool fills_captures = false;
  // Called once, at the step's first failure (another thread may still be
  // blocked in a feed's Next or the sink's Accept, which gRPC's cancellation
  // does not reach): the feeds and the sink must then stop waiting.
  std::function<void(const absl::Status&)> on_failure;
};

// What one server reported for its shard.
struct StepStreamStats {
  uint64_t chunks = 0;
  uint64_t chunks_replayed = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  double update_seconds = 0.0;
};

// Runs the stream on `channel` to completion. Returns the server's status on
// failure (its code kept), the barrier's (two phases), or INTERNAL when the
// server's answers break the protocol (a chunk outside the stream's chunks,
// answered twice, with the wrong payload size, or missing at the end; an ack
// or GradStats in a one-phase step, or either twice; a malformed message).
// The stream's context joins `group`, so another stream's failure cancels it.
absl::StatusOr<StepStreamStats> RunStepStream(const StepChannel& channel,
                                              const StepStreamParams& params,
                                              CallGroup& group);

}  // namespace depot::client_internal

#endif  // DEPOT_CLIENT_SRC_STEP_STREAM_H_
