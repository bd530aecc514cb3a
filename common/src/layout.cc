#include "depot/layout.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace depot {
namespace {

// The flat index space is capped well below 2^64 so that sums of an index and a
// chunk or alignment size can never wrap.
constexpr uint64_t kMaxTotalElems = uint64_t{1} << 62;

bool IsPowerOfTwo(uint64_t value) {
  return value != 0 && (value & (value - 1)) == 0;
}

// REQUIRES: alignment is a power of two, value <= kMaxTotalElems. The result
// may exceed kMaxTotalElems (by less than `alignment`), never wrap.
uint64_t AlignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) & ~(alignment - 1);
}

absl::Status TooLargeError(size_t tensor_index) {
  return absl::InvalidArgumentError(
      absl::StrCat("tensors[", tensor_index,
                   "].numel: the layout would exceed 2^62 elements"));
}

}  // namespace

absl::StatusOr<Layout> Layout::Create(std::vector<TensorSpec> tensors,
                                      uint64_t alignment_elems) {
  if (!IsPowerOfTwo(alignment_elems)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "alignment_elems: must be a power of two, got ", alignment_elems));
  }
  if (tensors.empty()) {
    return absl::InvalidArgumentError("tensors: must not be empty");
  }
  Layout layout;
  layout.offsets_.reserve(tensors.size());
  std::unordered_map<std::string_view, size_t> index_of_name;
  index_of_name.reserve(tensors.size());
  uint64_t end = 0;  // end of the previous tensor
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& tensor = tensors[i];
    if (tensor.name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensors[", i, "].name: must not be empty"));
    }
    const auto [it, inserted] = index_of_name.emplace(tensor.name, i);
    if (!inserted) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensors[", i, "].name: \"", tensor.name,
                       "\" repeats the name of tensors[", it->second, "]"));
    }
    if (tensor.numel == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensors[", i, "].numel: must be > 0"));
    }
    const uint64_t offset = AlignUp(end, alignment_elems);
    if (offset > kMaxTotalElems || tensor.numel > kMaxTotalElems - offset) {
      return TooLargeError(i);
    }
    layout.offsets_.push_back(offset);
    end = offset + tensor.numel;
    layout.param_elems_ += tensor.numel;
  }
  layout.total_elems_ = AlignUp(end, alignment_elems);
  if (layout.total_elems_ > kMaxTotalElems) {
    return TooLargeError(tensors.size() - 1);
  }
  layout.alignment_elems_ = alignment_elems;
  layout.tensors_ = std::move(tensors);
  return layout;
}

std::vector<Segment> Layout::SegmentsIn(uint64_t begin, uint64_t end) const {
  std::vector<Segment> segments;
  if (begin >= end) return segments;
  // Binary search for the first tensor that ends after `begin` (tensor ends
  // increase with the index).
  size_t i = 0;
  size_t count = tensors_.size();
  while (count > 0) {
    const size_t half = count / 2;
    const size_t mid = i + half;
    if (offsets_[mid] + tensors_[mid].numel <= begin) {
      i = mid + 1;
      count -= half + 1;
    } else {
      count = half;
    }
  }
  for (; i < tensors_.size() && offsets_[i] < end; ++i) {
    Segment segment;
    segment.begin = std::max(begin, offsets_[i]);
    segment.end = std::min(end, offsets_[i] + tensors_[i].numel);
    segment.param_group = tensors_[i].param_group;
    segment.tensor_index = i;
    segments.push_back(segment);
  }
  return segments;
}

}  // namespace depot
