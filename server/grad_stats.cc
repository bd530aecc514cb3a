#include "server/grad_stats.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

namespace depot {
namespace {

// Independent double accumulators, so that the sum of squares is not one long
// chain of dependent additions (and vectorises): element i of a chunk (i
// counted from the chunk's first element) always goes to lane i % kLanes, and
// the lanes are added in lane order, which fixes the order of the whole sum.
constexpr uint64_t kLanes = 8;

// max that keeps NaN, as torch's max does (std::max drops a NaN second
// argument).
double MaxKeepingNan(double a, double b) {
  return std::isnan(a) || std::isnan(b) ? std::nan("") : std::max(a, b);
}

// The running statistics of one chunk.
struct Accumulator {
  double lanes[kLanes] = {};
  float max_abs = 0.0f;
  uint64_t zeros = 0;
  uint64_t non_finite = 0;  // elements that are NaN or +-Inf
  uint64_t nans = 0;

  // Element at chunk offset i.
  void Add(uint64_t i, float g) {
    // A float's square is exact in double (24 + 24 bits < 53).
    lanes[i % kLanes] += static_cast<double>(g) * static_cast<double>(g);
    const float a = std::fabs(g);
    max_abs = a > max_abs ? a : max_abs;
    zeros += g == 0.0f;
    non_finite += !(a <= FLT_MAX);
    nans += g != g;
  }

  // Elements [begin, end) of the chunk, `grad` pointing at the chunk's first.
  void AddRange(const float* grad, uint64_t begin, uint64_t end) {
    uint64_t i = begin;
    for (; i < end && i % kLanes != 0; ++i) Add(i, grad[i]);
    // Whole groups of kLanes, lane j taking element i + j: the same lanes as
    // Add, in a shape the compiler vectorises.
    for (; i + kLanes <= end; i += kLanes) {
      for (uint64_t j = 0; j < kLanes; ++j) {
        const float g = grad[i + j];
        lanes[j] += static_cast<double>(g) * static_cast<double>(g);
      }
      for (uint64_t j = 0; j < kLanes; ++j) {
        const float g = grad[i + j];
        const float a = std::fabs(g);
        max_abs = a > max_abs ? a : max_abs;
        zeros += g == 0.0f;
        non_finite += !(a <= FLT_MAX);
        nans += g != g;
      }
    }
    for (; i < end; ++i) Add(i, grad[i]);
  }
};

}  // namespace

GradStats ComputeGradStats(const Layout& layout, const ChunkRange& range,
                           const float* grad) {
  return ComputeGradStats(layout.SegmentsIn(range.begin, range.end), range,
                          grad);
}

GradStats ComputeGradStats(const std::vector<Segment>& segments,
                           const ChunkRange& range, const float* grad) {
  Accumulator acc;
  for (const Segment& segment : segments) {
    acc.AddRange(grad, segment.begin - range.begin, segment.end - range.begin);
  }
  GradStats stats;
  for (double lane : acc.lanes) stats.sum_squares += lane;
  stats.max_abs = acc.nans > 0 ? std::nan("") : acc.max_abs;
  stats.non_finite = acc.non_finite > 0;
  stats.zero_count = acc.zeros;
  return stats;
}

void AccumulateGradStats(const GradStats& chunk, GradStats& total) {
  total.sum_squares += chunk.sum_squares;
  total.max_abs = MaxKeepingNan(total.max_abs, chunk.max_abs);
  total.non_finite = total.non_finite || chunk.non_finite;
  total.zero_count += chunk.zero_count;
}

}  // namespace depot
