// Layout: an ordered list of named tensors packed into one flat index space [0, N).
//
// Tensor i starts at offset(i), the first multiple of alignment_elems at or after the
// end of tensor i-1; the elements in between (and after the last tensor, up to the
// next multiple of alignment_elems) are padding, which is zero and stays zero.
#ifndef DEPOT_LAYOUT_H_
#define DEPOT_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "depot/export.h"

namespace depot {

struct TensorSpec {
  std::string name;
  uint64_t numel = 0;
  uint32_t param_group = 0;
};

// A run of consecutive elements that belong to one tensor.
struct Segment {
  uint64_t begin = 0;  // flat index, inclusive
  uint64_t end = 0;    // flat index, exclusive
  uint32_t param_group = 0;
  size_t tensor_index = 0;
};

class DEPOT_API Layout {
 public:
  // INVALID_ARGUMENT when: no tensors; a name is empty or repeated; a numel is 0;
  // alignment_elems is 0 or not a power of two; N would overflow 2^62.
  static absl::StatusOr<Layout> Create(std::vector<TensorSpec> tensors,
                                       uint64_t alignment_elems);

  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  uint64_t offset(size_t tensor_index) const { return offsets_[tensor_index]; }
  uint64_t alignment_elems() const { return alignment_elems_; }
  // N: the size of the flat space, padding included.
  uint64_t total_elems() const { return total_elems_; }
  // Elements that belong to tensors (N minus padding).
  uint64_t param_elems() const { return param_elems_; }

  // The tensor segments that intersect [begin, end), in order, clipped to it.
  // Elements of [begin, end) not covered by a segment are padding.
  std::vector<Segment> SegmentsIn(uint64_t begin, uint64_t end) const;

 private:
  Layout() = default;

  std::vector<TensorSpec> tensors_;
  std::vector<uint64_t> offsets_;
  uint64_t alignment_elems_ = 1;
  uint64_t total_elems_ = 0;
  uint64_t param_elems_ = 0;
};

}  // namespace depot

#endif  // DEPOT_LAYOUT_H_
