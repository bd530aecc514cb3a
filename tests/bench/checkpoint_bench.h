// depot-bench checkpoint: what server-side checkpoints cost a training run
// (issue 12; docs/checkpoints.md, docs/performance.md), in one run against a
// real depot-server on loopback with --checkpoint_dir on the disk measured:
//
//   normal   the step time of steps with no checkpoint being taken or
//            written;
//   capture  steps whose update also copies the shard (every
//            --checkpoint_every steps);
//   writing  steps that run while the background writer is still writing
//            the last capture (the server's depot_checkpoints_written_total
//            has not yet counted it);
//   disk     the same bytes written to a file in the same directory as the
//            writer writes them (WriteFileDurably bypassing the page cache,
//            then fsync): the disk's limit.
//
// ratio = median(capture and writing steps) / median(normal), goal <= 1.2;
// write_ratio = the checkpoint's write bandwidth (its bytes / its write
// seconds, from the server's metrics) / the disk probe's.
#ifndef DEPOT_TESTS_BENCH_CHECKPOINT_BENCH_H_
#define DEPOT_TESTS_BENCH_CHECKPOINT_BENCH_H_

#include "absl/status/status.h"

namespace depot::bench {

// With the --checkpoint_* flags (checkpoint_bench.cc).
absl::Status RunCheckpointCommand(bool json);

}  // namespace depot::bench

#endif  // DEPOT_TESTS_BENCH_CHECKPOINT_BENCH_H_
