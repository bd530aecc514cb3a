#include "depot/layout.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace depot {
namespace {

constexpr uint64_t kMaxTotalElems = uint64_t{1} << 62;

// Three tensors of awkward sizes in two param groups, aligned to 64: offsets 0,
// 128 (after 100 + 28 pad) and 192 (after 64, no pad); N = 192 + 64 (after 1 +
// 63 pad) = 256.
Layout ThreeTensorLayout() {
  return Layout::Create({{"a", 100, 0}, {"b", 64, 1}, {"c", 1, 0}}, 64).value();
}

void ExpectInvalid(const absl::StatusOr<Layout>& layout,
                   const std::string& message_part) {
  ASSERT_FALSE(layout.ok());
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(layout.status().message().find(message_part), std::string::npos)
      << layout.status().message();
}

TEST(LayoutTest, TensorsStartAtAlignedOffsets) {
  const Layout layout = ThreeTensorLayout();
  EXPECT_EQ(layout.offset(0), 0u);
  EXPECT_EQ(layout.offset(1), 128u);
  EXPECT_EQ(layout.offset(2), 192u);
  for (size_t i = 0; i < layout.tensors().size(); ++i) {
    EXPECT_EQ(layout.offset(i) % layout.alignment_elems(), 0u) << i;
  }
}

TEST(LayoutTest, TotalCountsPaddingIncludingTheTail) {
  const Layout layout = ThreeTensorLayout();
  EXPECT_EQ(layout.total_elems(), 256u);
  EXPECT_EQ(layout.param_elems(), 165u);
}

TEST(LayoutTest, AlignmentOfOneLeavesNoPadding) {
  const Layout layout = Layout::Create({{"a", 3, 0}, {"b", 5, 0}}, 1).value();
  EXPECT_EQ(layout.offset(1), 3u);
  EXPECT_EQ(layout.total_elems(), 8u);
  EXPECT_EQ(layout.param_elems(), 8u);
}

TEST(LayoutTest, KeepsTheTensorsInOrder) {
  const Layout layout = ThreeTensorLayout();
  ASSERT_EQ(layout.tensors().size(), 3u);
  EXPECT_EQ(layout.tensors()[0].name, "a");
  EXPECT_EQ(layout.tensors()[1].name, "b");
  EXPECT_EQ(layout.tensors()[2].param_group, 0u);
}

TEST(LayoutTest, SegmentsInClipsToTheRangeAndSkipsPadding) {
  const Layout layout = ThreeTensorLayout();
  // [50, 193) covers the end of a, the padding after it, all of b and the start
  // of c.
  const std::vector<Segment> segments = layout.SegmentsIn(50, 193);
  ASSERT_EQ(segments.size(), 3u);
  EXPECT_EQ(segments[0].begin, 50u);
  EXPECT_EQ(segments[0].end, 100u);
  EXPECT_EQ(segments[0].tensor_index, 0u);
  EXPECT_EQ(segments[0].param_group, 0u);
  EXPECT_EQ(segments[1].begin, 128u);
  EXPECT_EQ(segments[1].end, 192u);
  EXPECT_EQ(segments[1].tensor_index, 1u);
  EXPECT_EQ(segments[1].param_group, 1u);
  EXPECT_EQ(segments[2].begin, 192u);
  EXPECT_EQ(segments[2].end, 193u);
  EXPECT_EQ(segments[2].tensor_index, 2u);
}

TEST(LayoutTest, SegmentsInsideOneTensorIsOneClippedSegment) {
  const std::vector<Segment> segments = ThreeTensorLayout().SegmentsIn(10, 20);
  ASSERT_EQ(segments.size(), 1u);
  EXPECT_EQ(segments[0].begin, 10u);
  EXPECT_EQ(segments[0].end, 20u);
}

TEST(LayoutTest, SegmentsInPaddingOnlyIsEmpty) {
  const Layout layout = ThreeTensorLayout();
  EXPECT_TRUE(layout.SegmentsIn(100, 128).empty());
  EXPECT_TRUE(layout.SegmentsIn(193, 256).empty());
}

TEST(LayoutTest, SegmentsInEmptyRangeIsEmpty) {
  const Layout layout = ThreeTensorLayout();
  EXPECT_TRUE(layout.SegmentsIn(10, 10).empty());
  EXPECT_TRUE(layout.SegmentsIn(20, 10).empty());
}

TEST(LayoutTest, SegmentsInWholeSpaceCoversEveryParameterOnce) {
  const Layout layout = ThreeTensorLayout();
  const std::vector<Segment> segments =
      layout.SegmentsIn(0, layout.total_elems());
  ASSERT_EQ(segments.size(), layout.tensors().size());
  uint64_t covered = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    EXPECT_EQ(segments[i].begin, layout.offset(i));
    EXPECT_EQ(segments[i].end - segments[i].begin, layout.tensors()[i].numel);
    covered += segments[i].end - segments[i].begin;
  }
  EXPECT_EQ(covered, layout.param_elems());
}

TEST(LayoutTest, SegmentsInMatchesAScanOfEveryTensor) {
  std::vector<TensorSpec> tensors;
  for (int i = 0; i < 40; ++i) {
    tensors.push_back(
        {absl::StrCat("t", i), static_cast<uint64_t>(1 + (i * 37) % 23), 0});
  }
  const Layout layout = Layout::Create(tensors, 8).value();
  for (uint64_t begin = 0; begin <= layout.total_elems(); begin += 3) {
    for (uint64_t end = begin; end <= layout.total_elems(); end += 7) {
      std::vector<Segment> expected;
      for (size_t i = 0; i < tensors.size(); ++i) {
        const uint64_t from = std::max(begin, layout.offset(i));
        const uint64_t to = std::min(end, layout.offset(i) + tensors[i].numel);
        if (from < to) expected.push_back({from, to, 0, i});
      }
      const std::vector<Segment> actual = layout.SegmentsIn(begin, end);
      ASSERT_EQ(actual.size(), expected.size()) << begin << ".." << end;
      for (size_t k = 0; k < actual.size(); ++k) {
        EXPECT_EQ(actual[k].begin, expected[k].begin);
        EXPECT_EQ(actual[k].end, expected[k].end);
        EXPECT_EQ(actual[k].tensor_index, expected[k].tensor_index);
      }
    }
  }
}

TEST(LayoutTest, RejectsNoTensors) {
  ExpectInvalid(Layout::Create({}, 64), "tensors: must not be empty");
}

TEST(LayoutTest, RejectsAnEmptyName) {
  ExpectInvalid(Layout::Create({{"a", 1, 0}, {"", 1, 0}}, 64),
                "tensors[1].name");
}

TEST(LayoutTest, RejectsARepeatedName) {
  ExpectInvalid(Layout::Create({{"a", 1, 0}, {"b", 1, 0}, {"a", 1, 0}}, 64),
                "tensors[2].name: \"a\" repeats the name of tensors[0]");
}

TEST(LayoutTest, RejectsAZeroNumel) {
  ExpectInvalid(Layout::Create({{"a", 1, 0}, {"b", 0, 0}}, 64),
                "tensors[1].numel: must be > 0");
}

TEST(LayoutTest, RejectsZeroAlignment) {
  ExpectInvalid(Layout::Create({{"a", 1, 0}}, 0), "alignment_elems");
}

TEST(LayoutTest, RejectsAlignmentThatIsNotAPowerOfTwo) {
  ExpectInvalid(Layout::Create({{"a", 1, 0}}, 48), "alignment_elems");
}

TEST(LayoutTest, AcceptsExactlyTwoToThe62Elements) {
  const absl::StatusOr<Layout> layout =
      Layout::Create({{"a", kMaxTotalElems - 64, 0}, {"b", 64, 0}}, 64);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->total_elems(), kMaxTotalElems);
}

TEST(LayoutTest, RejectsOneTensorOverTwoToThe62) {
  ExpectInvalid(Layout::Create({{"a", kMaxTotalElems + 1, 0}}, 1),
                "tensors[0].numel: the layout would exceed 2^62 elements");
}

TEST(LayoutTest, RejectsTensorsSummingOverTwoToThe62) {
  ExpectInvalid(Layout::Create({{"a", kMaxTotalElems, 0}, {"b", 1, 0}}, 1),
                "tensors[1].numel");
}

TEST(LayoutTest, RejectsNumelsThatWouldWrapAround) {
  ExpectInvalid(Layout::Create({{"a", 16, 0}, {"b", UINT64_MAX - 8, 0}}, 1),
                "tensors[1].numel");
}

TEST(LayoutTest, RejectsPaddingThatPushesTheTotalOverTwoToThe62) {
  // The tensor fits, but rounding the end up to the alignment does not.
  ExpectInvalid(Layout::Create({{"a", 1, 0}}, uint64_t{1} << 63),
                "exceed 2^62");
}

}  // namespace
}  // namespace depot
