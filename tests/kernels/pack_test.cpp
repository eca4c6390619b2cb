// PackPlan layout, pieces and validation, and the CPU pack/unpack round trip, checked against
// offsets and bytes computed by hand here.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "expect_error.hpp"
#include "loom/error.hpp"
#include "loom/kernels/pack.hpp"

namespace loom::kernels {
namespace {

using test::expect_error;

TEST(PackPlan, OffsetsAreAlignedInGivenOrder) {
  std::vector<std::byte> a(5), b(17), c(0), d(16);
  PackPlan plan({{a.data(), 5}, {b.data(), 17}, {c.data(), 0}, {d.data(), 16}}, 16);
  EXPECT_EQ(plan.offset(0), 0u);
  EXPECT_EQ(plan.offset(1), 16u);  // 5 rounded up to 16
  EXPECT_EQ(plan.offset(2), 48u);  // 16 + 17 = 33 -> 48
  EXPECT_EQ(plan.offset(3), 48u);  // the empty segment takes no room
  EXPECT_EQ(plan.flat_bytes(), 64u);
  PackPlan tight({{a.data(), 5}, {b.data(), 17}}, 1);
  EXPECT_EQ(tight.offset(1), 5u);
  EXPECT_EQ(tight.flat_bytes(), 22u);
}

TEST(PackPlan, PiecesCoverEverySegmentByteOnce) {
  std::vector<std::byte> a(100), b(7), c(64);
  PackPlan plan({{a.data(), 100}, {b.data(), 7}, {c.data(), 64}}, 8);
  const auto pieces = plan.pieces(32);
  // 100 -> 32+32+32+4, 7 -> 7, 64 -> 32+32
  ASSERT_EQ(pieces.size(), 7u);
  EXPECT_EQ(pieces[3].bytes, 4u);
  EXPECT_EQ(pieces[3].segment_offset, 96u);
  EXPECT_EQ(pieces[3].flat_offset, 96u);
  EXPECT_EQ(pieces[4].segment, 1u);
  EXPECT_EQ(pieces[4].flat_offset, 104u);  // 100 rounded to 8
  EXPECT_EQ(pieces[6].flat_offset, 112u + 32u);
  std::size_t total = 0;
  for (const auto& p : pieces) total += p.bytes;
  EXPECT_EQ(total, 171u);
}

TEST(PackPlan, RoundTripMovesEveryByte) {
  // Odd sizes, mixed element types, many small gradients.
  std::vector<std::vector<std::uint8_t>> grads;
  std::vector<PackSegment> segments;
  for (std::size_t i = 0; i < 37; ++i) {
    grads.emplace_back(1 + 13 * i % 101);
    std::iota(grads.back().begin(), grads.back().end(), static_cast<std::uint8_t>(i));
  }
  for (auto& g : grads) segments.push_back({g.data(), g.size()});
  PackPlan plan(segments, 16);
  std::vector<std::byte> flat(plan.flat_bytes(), std::byte{0xee});
  pack(plan, flat);
  for (std::size_t i = 0; i < grads.size(); ++i)
    for (std::size_t j = 0; j < grads[i].size(); ++j)
      ASSERT_EQ(static_cast<std::uint8_t>(flat[plan.offset(i) + j]),
                static_cast<std::uint8_t>(i + j))
          << "segment " << i << " byte " << j;
  for (std::size_t k = 0; k < flat.size(); ++k) flat[k] = static_cast<std::byte>(k * 7);
  unpack(plan, flat);
  for (std::size_t i = 0; i < grads.size(); ++i)
    for (std::size_t j = 0; j < grads[i].size(); ++j)
      ASSERT_EQ(grads[i][j], static_cast<std::uint8_t>((plan.offset(i) + j) * 7));
}

TEST(PackPlan, RefusesNullOverlapBadAlignmentAndSmallFlat) {
  std::vector<std::byte> a(64);
  try {
    PackPlan({{a.data(), 8}, {nullptr, 4}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(e.message().find("segment 1 is null with 4 bytes"), std::string::npos);
  }
  try {
    PackPlan({{a.data() + 32, 8}, {a.data(), 8}, {a.data() + 4, 8}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("segments 1 and 2 overlap"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(PackPlan({{a.data(), 8}, {a.data() + 8, 8}}));  // adjacent is fine
  try {
    PackPlan({{a.data(), 8}}, 12);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("alignment 12 is not a power of two"), std::string::npos);
  }
  PackPlan plan({{a.data(), 8}, {a.data() + 8, 9}}, 16);
  std::vector<std::byte> small(20);
  try {
    pack(plan, small);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("flat buffer of 20 bytes is smaller than the plan's 25"),
              std::string::npos)
        << e.what();
  }
  expect_error(ErrorCode::invalid_argument, "pack plan: pieces of 0 bytes",
               [&] { plan.pieces(0); });
}

}  // namespace
}  // namespace loom::kernels
