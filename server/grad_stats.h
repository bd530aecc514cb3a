// GradStats: the statistics of a step's summed (unscaled) gradient that global
// clipping and non-finite skipping need, for one chunk and for a whole shard.
// Padding elements are excluded. The sum of squares is accumulated in double
// in a fixed element order and chunks are combined in chunk-index order, so the
// result is the same bits whatever order the chunks were summed in.
#ifndef DEPOT_SERVER_GRAD_STATS_H_
#define DEPOT_SERVER_GRAD_STATS_H_

#include <cstdint>
#include <vector>

#include "depot/layout.h"
#include "depot/shard_plan.h"

namespace depot {

struct GradStats {
  double sum_squares = 0.0;  // sum of g * g (each square exact in double)
  double max_abs = 0.0;      // max |g|; NaN when some g is NaN
  bool non_finite = false;   // some g is NaN or +-Inf
  uint64_t zero_count = 0;   // elements with g == 0 exactly
};

// The statistics of grad[0, range.size()), the gradient of `range`, over the
// elements of `layout`'s tensors (padding skipped).
GradStats ComputeGradStats(const Layout& layout, const ChunkRange& range,
                           const float* grad);
// The same over `segments` only (a subset of the chunk's, in element order:
// Layout::SegmentsIn), e.g. leaving out tensors no worker has a gradient for.
GradStats ComputeGradStats(const std::vector<Segment>& segments,
                           const ChunkRange& range, const float* grad);

// Adds the statistics of the next chunk (in index order) to `total`.
void AccumulateGradStats(const GradStats& chunk, GradStats& total);

}  // namespace depot

#endif  // DEPOT_SERVER_GRAD_STATS_H_
