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
  // Weights overrides of the whole job, sorted by chunk index; each stream
  // sends those of its chunks. Null: none.
  const std::vector<ChunkOverride>* overrides = nullptr;
  // Two phases: the step's barrier, shared by its streams; null in one phase.
  CommitBarrier* barrier = nullptr;
  const ShardPlan* plan = nullptr;
  uint32_t server = 0;  // the shard this stream's chunks are in
  // The chunks this stream carries: REQUIRES a non-empty range inside the
  // server's shard, the whole shard in a two-phase step.
  uint64_t first_chunk = 0;
  uint64_t end_chunk = 0;
  DType grad_dtype = DType::kFloat32;
  DType weight_dtype = DType::kFloat32;
  const void* grads = nullptr;  // the whole flat gradient buffer
  void* weights_out = nullptr;  // the whole flat weight buffer
  int max_inflight_chunks = 1;  // >= 1
  absl::Time deadline;
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
