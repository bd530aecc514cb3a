// A chunk's life through one training step on a server: the one state
// machine of ShardState's per-chunk bookkeeping (server/chunk_state.h moves
// it; nothing else assigns a phase).
//
//   kIdle       --a worker's gradient or weights override-->  kCollecting
//   kCollecting --the last worker's gradient, one phase-->   kUpdating
//   kCollecting --the last worker's gradient, two phases-->  kSumming
//   kSumming    --the sum is kept and acknowledged-->         kSummed
//   kSummed     --the step's commit-->                        kUpdating
//   kUpdating   --the update is done (applied step + 1)-->    kIdle
//   kCollecting --a refused first piece leaves no trace-->    kIdle
//   kCollecting, kSummed --a rollback drops the step-->       kIdle
//
// Who owns what in each phase:
// - kIdle: nothing is pending; the chunk's master weights and slots are free
//   to read (pulls, replays, checksums, captures, imports).
// - kCollecting: the next step's contributions are being gathered; the
//   arrays are still free to read.
// - kSumming: the sum task owns the contributions' payloads (a retry may
//   still replace a worker's stream, not its payload).
// - kSummed: the chunk's sum waits for the step's commit.
// - kUpdating: the update task owns the arrays and everything pending;
//   readers wait for kIdle.
#ifndef DEPOT_SERVER_CHUNK_PHASE_H_
#define DEPOT_SERVER_CHUNK_PHASE_H_

#include <cstdint>

namespace depot {

enum class ChunkPhase : uint8_t {
  kIdle,
  kCollecting,
  kSumming,
  kSummed,
  kUpdating,
};

// "idle", "collecting", ... for messages.
const char* ChunkPhaseName(ChunkPhase phase);

// Whether the diagram above has an arrow from `from` to `to`.
bool ChunkPhaseMayMove(ChunkPhase from, ChunkPhase to);

// Sets `phase` to `to`. A move the diagram does not have is a bug in the
// server that would let two tasks own one chunk: it aborts the process,
// naming both phases, rather than go on with corrupt state.
void MoveChunkPhase(ChunkPhase& phase, ChunkPhase to);

}  // namespace depot

#endif  // DEPOT_SERVER_CHUNK_PHASE_H_
