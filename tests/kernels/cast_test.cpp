// CPU casts between float32, float16 and bfloat16 against bit patterns worked out by hand, and
// the vectorised loops against the scalar ones bit for bit.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "half_patterns.hpp"
#include "loom/error.hpp"
#include "loom/kernels/cast.hpp"
#include "simd.hpp"

namespace loom::kernels {
namespace {

using test::expect_error;

TEST(Cast, Float32ToFloat16RoundsToNearestEven) {
  // 1 + 2^-11 is exactly between 1 and the next half (1 + 2^-10): ties to even gives 1.0.
  // 1 + 3 * 2^-11 is between 1 + 2^-10 and 1 + 2^-9: ties to even gives 1 + 2^-9.
  const std::vector<float> in{1.0f,
                              1.0f + 0x1p-11f,
                              1.0f + 3 * 0x1p-11f,
                              -2.5f,
                              65504.0f,
                              70000.0f,
                              std::numeric_limits<float>::infinity(),
                              0x1p-24f,
                              0.0f};
  const std::vector<std::uint16_t> expected{0x3c00, 0x3c00, 0x3c02, 0xc100, 0x7bff,
                                            0x7c00, 0x7c00, 0x0001, 0x0000};
  std::vector<float16_t> out(in.size());
  cast(in.data(), DType::float32, out.data(), DType::float16, in.size());
  for (std::size_t i = 0; i < in.size(); ++i) EXPECT_EQ(out[i].bits, expected[i]) << "index " << i;
}

TEST(Cast, Float32ToBfloat16AndBack) {
  const std::vector<float> in{1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -3.0f, 1e30f};
  // bfloat16 keeps 7 mantissa bits: 1 + 2^-8 ties to 1.0, 1 + 3 * 2^-8 ties up to 1 + 2^-6.
  // 1e30f is 0x7149f2ca: the dropped half 0xf2ca is above 0x8000, so it rounds up.
  const std::vector<std::uint16_t> expected{0x3f80, 0x3f80, 0x3f82, 0xc040, 0x714a};
  std::vector<bfloat16_t> out(in.size());
  cast(in.data(), DType::float32, out.data(), DType::bfloat16, in.size());
  for (std::size_t i = 0; i < in.size(); ++i) EXPECT_EQ(out[i].bits, expected[i]) << "index " << i;
  std::vector<float> back(in.size());
  cast(out.data(), DType::bfloat16, back.data(), DType::float32, in.size());
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[2], 1.0f + 0x1p-6f);
  EXPECT_EQ(back[3], -3.0f);
}

TEST(Cast, Float16ToBfloat16GoesThroughFloat) {
  std::vector<float16_t> in{{0x3c01}, {0x7e00}, {0x8000}};  // 1 + 2^-10, NaN, -0
  std::vector<bfloat16_t> out(in.size());
  cast(in.data(), DType::float16, out.data(), DType::bfloat16, in.size());
  EXPECT_EQ(out[0].bits, 0x3f80);  // 2^-10 is below bfloat16's half-ulp (2^-8): rounds to 1
  EXPECT_TRUE(std::isnan(to_float(out[1])));
  EXPECT_EQ(out[2].bits, 0x8000);
}

TEST(Cast, SameTypeIsACopyAndInPlaceWorks) {
  std::vector<float> a{1.5f, -2.0f, 3.25f}, b(3);
  cast(a.data(), DType::float32, b.data(), DType::float32, 3);
  EXPECT_EQ(b, a);
  std::vector<float16_t> h{{0x3c00}, {0x4000}};
  cast(h.data(), DType::float16, h.data(), DType::bfloat16, 2);  // equal sizes: in place
  EXPECT_EQ(h[0].bits, 0x3f80);
  EXPECT_EQ(h[1].bits, 0x4000);
}

// The scaled cast multiplies in float by (float)factor, then rounds to the target.
TEST(Cast, ScaledMultipliesInFloatThenRounds) {
  const std::vector<float> in{1.0f, -3.0f, 1e-3f, 6e4f, 0x1p-20f, 123.456f};
  std::vector<float> f32(in.size());
  std::vector<float16_t> f16(in.size());
  std::vector<bfloat16_t> bf16(in.size());
  cast(in.data(), DType::float32, f32.data(), DType::float32, in.size(), 0.1);
  cast(in.data(), DType::float32, f16.data(), DType::float16, in.size(), 0.1);
  cast(in.data(), DType::float32, bf16.data(), DType::bfloat16, in.size(), 0.1);
  for (std::size_t i = 0; i < in.size(); ++i) {
    const float product = in[i] * 0.1f;
    EXPECT_EQ(f32[i], product) << "index " << i;
    EXPECT_EQ(f16[i].bits, to_float16(product).bits) << "index " << i;
    EXPECT_EQ(bf16[i].bits, to_bfloat16(product).bits) << "index " << i;
  }
  // 91 * 2^-24 / 14 is 6.5 * 2^-24, a float16 tie; (float)(1/14) is above 1/14, so the float
  // product is above the tie and rounds up to 7 * 2^-24 (a product in double would give 6).
  float16_t h{0x005b};
  cast(&h, DType::float16, &h, DType::float16, 1, 1.0 / 14);
  EXPECT_EQ(h.bits, 0x0007);
}

TEST(Cast, RefusesOtherTypesAndNullBuffers) {
  std::vector<double> d(2);
  std::vector<float> f(2);
  try {
    cast(d.data(), DType::float64, f.data(), DType::float32, 2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
    EXPECT_NE(e.message().find("cast from float64 to float32"), std::string::npos);
  }
  EXPECT_FALSE(can_cast(DType::int32, DType::float32));
  EXPECT_TRUE(can_cast(DType::bfloat16, DType::float16));
  expect_error(ErrorCode::invalid_argument,
               "cast of 2 elements from float32 to float16: the input buffer is null",
               [&] { cast(nullptr, DType::float32, f.data(), DType::float16, 2); });
  expect_error(ErrorCode::invalid_argument, "the output buffer is null",
               [&] { cast(f.data(), DType::float32, nullptr, DType::float16, 2); });
  expect_error(ErrorCode::invalid_argument, "the input and output buffers are null",
               [&] { cast(nullptr, DType::float32, nullptr, DType::float16, 2); });
  EXPECT_NO_THROW(cast(nullptr, DType::float32, nullptr, DType::float16, 0));
}

// The Isa in use can be forced to scalar (how every comparison below gets its reference) and
// comes back; an Isa this CPU lacks is refused.
TEST(CastSimd, ScalarCanBeForcedAndComesBack) {
  std::cout << "kernels: best Isa on this CPU: " << simd::to_string(simd::best()) << "\n";
  EXPECT_EQ(simd::current(), simd::best());
  {
    simd::ScopedIsa scalar(simd::Isa::scalar);
    EXPECT_EQ(simd::current(), simd::Isa::scalar);
  }
  EXPECT_EQ(simd::current(), simd::best());
  EXPECT_TRUE(simd::supported(simd::Isa::scalar));
  if (!simd::supported(simd::Isa::avx2_f16c)) {
    expect_error(ErrorCode::unsupported, "this CPU cannot run the avx2_f16c loops",
                 [] { simd::use(simd::Isa::avx2_f16c); });
  }
}

// Every 16-bit pattern widened to float on every Isa gives half_bits.hpp's bits (signalling
// NaNs included: F16C alone would quiet them).
TEST(CastSimd, WidensEvery16BitPatternAsScalar) {
  const std::vector<std::uint16_t> all = testing::half_bit_patterns(65536, 1);
  for (simd::Isa isa : {simd::Isa::scalar, simd::best()}) {
    simd::ScopedIsa use(isa);
    std::vector<float> f16(all.size()), bf16(all.size());
    cast(all.data(), DType::float16, f16.data(), DType::float32, all.size());
    cast(all.data(), DType::bfloat16, bf16.data(), DType::float32, all.size());
    for (std::size_t h = 0; h < all.size(); ++h) {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(f16[h]),
                std::bit_cast<std::uint32_t>(to_float(float16_t{all[h]})))
          << simd::to_string(isa) << " float16 0x" << std::hex << h;
      ASSERT_EQ(std::bit_cast<std::uint32_t>(bf16[h]),
                std::bit_cast<std::uint32_t>(to_float(bfloat16_t{all[h]})))
          << simd::to_string(isa) << " bfloat16 0x" << std::hex << h;
    }
  }
}

// Float patterns on and around every halfway point, subnormal, overflow, infinity and NaN
// narrowed on every Isa give to_float16 / to_bfloat16's bits.
TEST(CastSimd, NarrowsEdgePatternsAsScalar) {
  const std::vector<std::uint32_t> bits = testing::float_bit_patterns(60000);
  for (simd::Isa isa : {simd::Isa::scalar, simd::best()}) {
    simd::ScopedIsa use(isa);
    std::vector<float16_t> f16(bits.size());
    std::vector<bfloat16_t> bf16(bits.size());
    cast(bits.data(), DType::float32, f16.data(), DType::float16, bits.size());
    cast(bits.data(), DType::float32, bf16.data(), DType::bfloat16, bits.size());
    for (std::size_t i = 0; i < bits.size(); ++i) {
      const float x = std::bit_cast<float>(bits[i]);
      ASSERT_EQ(f16[i].bits, to_float16(x).bits)
          << simd::to_string(isa) << " float 0x" << std::hex << bits[i];
      ASSERT_EQ(bf16[i].bits, to_bfloat16(x).bits)
          << simd::to_string(isa) << " float 0x" << std::hex << bits[i];
    }
  }
}

struct CastCase {
  DType from, to;
  bool scaled;
};

// Every cast the vectorised loops take, with and without a scale: 1/3 makes inexact products,
// 3e4 overflows float16.
std::vector<CastCase> simd_cases() {
  std::vector<CastCase> cases;
  const DType types[] = {DType::float32, DType::float16, DType::bfloat16};
  for (DType from : types)
    for (DType to : types)
      for (bool scaled : {false, true})
        if (from != DType::float32 || to != DType::float32)
          if (from != to || scaled) cases.push_back({from, to, scaled});
  return cases;
}

class CastSimdSizes : public ::testing::TestWithParam<std::size_t> {};

// Each cast at each size (tails of every length) from an aligned and a misaligned pointer, out
// of place and, where the element sizes are equal, in place: the same bytes as the scalar loop.
TEST_P(CastSimdSizes, MatchesScalarBitForBit) {
  const std::size_t n = GetParam();
  const std::vector<std::uint32_t> floats = testing::float_bit_patterns(n);
  const std::vector<std::uint16_t> halves = testing::half_bit_patterns(n, 2);
  for (const CastCase& c : simd_cases()) {
    const std::size_t in_size = dtype_size(c.from), out_size = dtype_size(c.to);
    for (double factor : c.scaled ? std::vector<double>{1.0 / 3, 3e4} : std::vector<double>{1.0})
      for (std::size_t offset : {0u, 1u})
        for (bool in_place : {false, true}) {
          if (in_place && in_size != out_size) continue;
          const std::string what = std::string(to_string(c.from)) + " -> " +
                                   std::string(to_string(c.to)) + " n " + std::to_string(n) +
                                   " factor " + std::to_string(factor) + " offset " +
                                   std::to_string(offset) + (in_place ? " in place" : "");
          auto run = [&] {
            testing::ElementBuffer in(n, in_size, offset), out(n, out_size, offset);
            if (c.from == DType::float32)
              in.fill(floats);
            else
              in.fill(halves);
            void* target = in_place ? in.data() : out.data();
            if (c.scaled)
              cast(in.data(), c.from, target, c.to, n, factor);
            else
              cast(in.data(), c.from, target, c.to, n);
            return in_place ? in.contents() : out.contents();
          };
          testing::expect_same_as_scalar(run, out_size, what);
        }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, CastSimdSizes, ::testing::ValuesIn(testing::simd_sizes));

}  // namespace
}  // namespace loom::kernels
