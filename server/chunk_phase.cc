#include "server/chunk_phase.h"

#include <cstdio>
#include <cstdlib>

namespace depot {

const char* ChunkPhaseName(ChunkPhase phase) {
  switch (phase) {
    case ChunkPhase::kIdle:
      return "idle";
    case ChunkPhase::kCollecting:
      return "collecting";
    case ChunkPhase::kSumming:
      return "summing";
    case ChunkPhase::kSummed:
      return "summed";
    case ChunkPhase::kUpdating:
      return "updating";
  }
  return "unknown";
}

bool ChunkPhaseMayMove(ChunkPhase from, ChunkPhase to) {
  switch (from) {
    case ChunkPhase::kIdle:
      return to == ChunkPhase::kCollecting;
    case ChunkPhase::kCollecting:
      return to == ChunkPhase::kUpdating || to == ChunkPhase::kSumming ||
             to == ChunkPhase::kIdle;
    case ChunkPhase::kSumming:
      return to == ChunkPhase::kSummed;
    case ChunkPhase::kSummed:
      return to == ChunkPhase::kUpdating || to == ChunkPhase::kIdle;
    case ChunkPhase::kUpdating:
      return to == ChunkPhase::kIdle;
  }
  return false;
}

void MoveChunkPhase(ChunkPhase& phase, ChunkPhase to) {
  if (!ChunkPhaseMayMove(phase, to)) {
    std::fprintf(stderr,
                 "depot-server: internal error: a chunk moved from %s to %s, "
                 "which its state machine does not allow "
                 "(server/chunk_phase.h)\n",
                 ChunkPhaseName(phase), ChunkPhaseName(to));
    std::abort();
  }
  phase = to;
}

}  // namespace depot
