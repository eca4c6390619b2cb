// CPU reduction kernels against a scalar reference written here: every dtype x op, odd
// lengths, in-place and out-of-place, NaN and infinity; and the vectorised float16/bfloat16
// loops against the scalar ones bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <limits>
#include <random>

#include "expect_error.hpp"
#include "half_patterns.hpp"
#include "loom/error.hpp"
#include "loom/kernels/reduce.hpp"
#include "simd.hpp"

namespace loom {
namespace {

using test::expect_error;

template <class T>
double value_of(T v) {
  if constexpr (std::is_same_v<T, float16_t> || std::is_same_v<T, bfloat16_t>)
    return to_float(v);
  else
    return static_cast<double>(v);
}

template <class T>
T make(double v) {
  if constexpr (std::is_same_v<T, float16_t>)
    return to_float16(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bfloat16_t>)
    return to_bfloat16(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

// The reference: one element at a time, in the storage type's own arithmetic.
template <class T>
T reference(T a, T b, ReduceOp op) {
  if constexpr (std::is_same_v<T, float16_t> || std::is_same_v<T, bfloat16_t>) {
    const float x = to_float(a), y = to_float(b);
    return make<T>(reference<float>(x, y, op));
  } else if constexpr (std::is_integral_v<T>) {
    using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:  // combines as sum; average() divides
        return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
      case ReduceOp::prod:
        return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
      case ReduceOp::min:
        return std::min(a, b);
      case ReduceOp::max:
        return std::max(a, b);
    }
    return 0;
  } else {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
        return a + b;
      case ReduceOp::prod:
        return a * b;
      case ReduceOp::min:
        return std::min(a, b);
      case ReduceOp::max:
        return std::max(a, b);
    }
    return 0;
  }
}

template <class T>
void check_all_ops(std::size_t n) {
  std::mt19937 rng(static_cast<unsigned>(n));
  std::uniform_int_distribution<int> small(-50, 50);
  for (ReduceOp op : all_reduce_ops) {
    if (!supports(op, dtype_of<T>())) continue;
    std::vector<T> a(n), b(n);
    for (std::size_t i = 0; i < n; ++i) {
      double x = small(rng), y = small(rng);
      if constexpr (std::is_unsigned_v<T>) {
        x = std::abs(x) * 5;  // products and sums overflow: they must wrap like the reference
        y = std::abs(y) * 5;
      } else if constexpr (!std::is_integral_v<T>) {
        x /= 4;  // fractions that are exact in every float type
        y /= 4;
      }
      a[i] = make<T>(x);
      b[i] = make<T>(y);
    }
    if constexpr (!std::is_integral_v<T>) {
      if (n > 5) {
        a[1] = make<T>(std::numeric_limits<double>::quiet_NaN());
        b[3] = make<T>(std::numeric_limits<double>::quiet_NaN());
        a[4] = make<T>(std::numeric_limits<double>::infinity());
        b[5] = make<T>(-std::numeric_limits<double>::infinity());
      }
    }
    std::vector<T> out(n), in_place = a;
    kernels::reduce(out.data(), a.data(), b.data(), n, dtype_of<T>(), op);
    kernels::reduce(in_place.data(), b.data(), n, dtype_of<T>(), op);
    for (std::size_t i = 0; i < n; ++i) {
      const double want = value_of(reference(a[i], b[i], op));
      for (const auto* result : {&out, &in_place}) {
        const double got = value_of((*result)[i]);
        if (std::isnan(want))
          EXPECT_TRUE(std::isnan(got)) << to_string(op) << " element " << i;
        else
          EXPECT_EQ(got, want) << to_string(op) << " element " << i << " of " << n;
      }
    }
  }
}

template <class T>
class ReduceKernel : public ::testing::Test {};
using AllTypes = ::testing::Types<float, double, float16_t, bfloat16_t, std::int32_t, std::int64_t,
                                  std::uint8_t, std::int8_t, std::int16_t>;
TYPED_TEST_SUITE(ReduceKernel, AllTypes);

TYPED_TEST(ReduceKernel, MatchesScalarReferenceAtOddLengths) {
  for (std::size_t n : {0u, 1u, 3u, 7u, 31u, 257u, 1000003u}) check_all_ops<TypeParam>(n);
}

TEST(ReduceKernel, AverageDividesFloatsAndTruncatesIntegers) {
  std::vector<float> f{3.0f, 6.0f, -9.0f};
  kernels::average(f.data(), f.size(), DType::float32, 3);
  EXPECT_EQ(f, (std::vector<float>{1.0f, 2.0f, -3.0f}));
  std::vector<bfloat16_t> h{to_bfloat16(5.0f)};
  kernels::average(h.data(), 1, DType::bfloat16, 2);
  EXPECT_EQ(to_float(h[0]), 2.5f);
  // ncclAvg on integers: truncation toward zero, negative quotients included.
  std::vector<std::int32_t> i{7, -7, 5, -1, 0};
  kernels::average(i.data(), i.size(), DType::int32, 2);
  EXPECT_EQ(i, (std::vector<std::int32_t>{3, -3, 2, 0, 0}));
  std::vector<std::int8_t> i8{-127, 127, -128, 100};
  kernels::average(i8.data(), i8.size(), DType::int8, 3);
  EXPECT_EQ(i8, (std::vector<std::int8_t>{-42, 42, -42, 33}));
  std::vector<std::int16_t> i16{-32768, 32767, 11};
  kernels::average(i16.data(), i16.size(), DType::int16, 5);
  EXPECT_EQ(i16, (std::vector<std::int16_t>{-6553, 6553, 2}));
  std::vector<std::uint8_t> u8{255, 7};
  kernels::average(u8.data(), u8.size(), DType::uint8, 2);
  EXPECT_EQ(u8, (std::vector<std::uint8_t>{127, 3}));
  std::vector<std::int64_t> i64{-(std::int64_t{1} << 62) - 1, 9};
  kernels::average(i64.data(), i64.size(), DType::int64, 4);
  EXPECT_EQ(i64, (std::vector<std::int64_t>{-(std::int64_t{1} << 60), 2}));
  std::vector<std::uint8_t> flags{1};
  expect_error(ErrorCode::unsupported, "avg is not defined for bool",
               [&] { kernels::average(flags.data(), 1, DType::boolean, 2); });
  expect_error(ErrorCode::unsupported, "reduce op avg is not defined for bool", [&] {
    kernels::reduce(flags.data(), flags.data(), 1, DType::boolean, ReduceOp::avg);
  });
}

// torch.bool: sum and max are logical or, prod and min logical and; any non-zero byte is true
// and the result is 0 or 1.
TEST(ReduceKernel, BoolReducesLogically) {
  const std::vector<std::uint8_t> a{0, 0, 1, 1, 2, 0, 255}, b{0, 1, 0, 1, 0, 3, 7};
  const std::vector<std::uint8_t> any{0, 1, 1, 1, 1, 1, 1}, all{0, 0, 0, 1, 0, 0, 1};
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::prod, ReduceOp::min}) {
    std::vector<std::uint8_t> out(a.size()), in_place = a;
    kernels::reduce(out.data(), a.data(), b.data(), a.size(), DType::boolean, op);
    kernels::reduce(in_place.data(), b.data(), a.size(), DType::boolean, op);
    const auto& want = op == ReduceOp::sum || op == ReduceOp::max ? any : all;
    EXPECT_EQ(out, want) << to_string(op);
    EXPECT_EQ(in_place, want) << to_string(op);
  }
}

// complex64/complex128 sum and average component-wise (std::complex's layout), at odd lengths;
// prod, min and max are refused by name.
template <class T>
void check_complex(DType dtype) {
  for (std::size_t n : {1u, 7u, 1001u}) {
    std::vector<std::complex<T>> a(n), b(n);
    for (std::size_t i = 0; i < n; ++i) {
      a[i] = {static_cast<T>(i) / 4, -static_cast<T>(i % 5)};
      b[i] = {static_cast<T>(3) - static_cast<T>(i % 7), static_cast<T>(i) / 8};
    }
    std::vector<std::complex<T>> sum(n), avg = a;
    kernels::reduce(sum.data(), a.data(), b.data(), n, dtype, ReduceOp::sum);
    kernels::reduce(avg.data(), b.data(), n, dtype, ReduceOp::avg);
    kernels::average(avg.data(), n, dtype, 2);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_EQ(sum[i], a[i] + b[i]) << to_string(dtype) << " element " << i;
      ASSERT_EQ(avg[i], (a[i] + b[i]) / static_cast<T>(2)) << to_string(dtype) << " element " << i;
    }
  }
  std::vector<std::complex<T>> x(2);
  for (ReduceOp op : {ReduceOp::prod, ReduceOp::min, ReduceOp::max})
    expect_error(ErrorCode::unsupported,
                 "reduce op " + std::string(to_string(op)) + " is not defined for " +
                     std::string(to_string(dtype)),
                 [&] { kernels::reduce(x.data(), x.data(), 2, dtype, op); });
}

TEST(ReduceKernel, ComplexSumsAndAveragesComponentWise) {
  check_complex<float>(DType::complex64);
  check_complex<double>(DType::complex128);
}

TEST(ReduceKernel, ScaleMultipliesFloats) {
  std::vector<double> d{1.0, -2.0};
  kernels::scale(d.data(), d.size(), DType::float64, 0.5);
  EXPECT_EQ(d, (std::vector<double>{0.5, -1.0}));
  std::uint8_t u = 3;
  expect_error(ErrorCode::unsupported, "scale is not defined for uint8",
               [&] { kernels::scale(&u, 1, DType::uint8, 2.0); });
}

TEST(ReduceKernel, ScaleOutOfPlaceLeavesItsInput) {
  const std::vector<float> in{1.0f, -3.0f, 0.7f};
  std::vector<float> out(in.size());
  kernels::scale(in.data(), out.data(), in.size(), DType::float32, 1.0 / 3);
  const float third = static_cast<float>(1.0 / 3);
  EXPECT_EQ(out, (std::vector<float>{1.0f * third, -3.0f * third, 0.7f * third}));
  EXPECT_EQ(in, (std::vector<float>{1.0f, -3.0f, 0.7f}));
}

// 16-bit floats multiply in float by (float)factor, as average() divides in float: 91 * 2^-24
// / 14 is 6.5 * 2^-24, a float16 tie; (float)(1/14) is above 1/14, so the product rounds up to
// 7 * 2^-24 (in double it would stay below the tie and give 6).
TEST(ReduceKernel, ScaleOfHalvesMultipliesInFloat) {
  float16_t h{0x005b};
  kernels::scale(&h, 1, DType::float16, 1.0 / 14);
  EXPECT_EQ(h.bits, 0x0007);
  bfloat16_t b = to_bfloat16(3.0f);
  kernels::scale(&b, 1, DType::bfloat16, 0.1);
  EXPECT_EQ(b.bits, to_bfloat16(3.0f * 0.1f).bits);
}

namespace simd = kernels::simd;
namespace patterns = kernels::testing;

class ReduceSimdSizes : public ::testing::TestWithParam<std::size_t> {};

// Every op on float16 and bfloat16 bit patterns (all 65536, then random: NaNs of both signs,
// infinities, subnormals) at each size, aligned and misaligned, into a third buffer and into
// either operand: the same bytes as the scalar loop.
TEST_P(ReduceSimdSizes, CombinesHalvesAsScalar) {
  const std::size_t n = GetParam();
  const std::vector<std::uint16_t> a_bits = patterns::half_bit_patterns(n, 3);
  std::vector<std::uint16_t> b_bits = patterns::half_bit_patterns(n, 4);
  std::mt19937 random(5);
  std::shuffle(b_bits.begin(), b_bits.end(), random);  // pair different patterns
  enum class Into { third, a, b };
  for (DType dtype : {DType::float16, DType::bfloat16})
    for (ReduceOp op : all_reduce_ops)
      for (std::size_t offset : {0u, 1u})
        for (Into into : {Into::third, Into::a, Into::b}) {
          auto run = [&] {
            patterns::ElementBuffer a(n, 2, offset), b(n, 2, offset), out(n, 2, offset);
            a.fill(a_bits);
            b.fill(b_bits);
            auto& target = into == Into::a ? a : into == Into::b ? b : out;
            kernels::reduce(target.data(), a.data(), b.data(), n, dtype, op);
            return target.contents();
          };
          // NaN + NaN and NaN * NaN: IEEE 754 leaves open which operand's sign and payload the
          // result carries, and g++ may swap the operands of + and * on either path (simd.cpp).
          const bool commutes = op != ReduceOp::min && op != ReduceOp::max;
          auto both_nan = [&](std::size_t i, std::uint16_t scalar, std::uint16_t vectorised) {
            return commutes && patterns::is_nan(a_bits[i], dtype) &&
                   patterns::is_nan(b_bits[i], dtype) && patterns::is_nan(scalar, dtype) &&
                   patterns::is_nan(vectorised, dtype);
          };
          patterns::expect_same_as_scalar(
              run, 2,
              std::string(to_string(dtype)) + " " + std::string(to_string(op)) + " n " +
                  std::to_string(n) + " offset " + std::to_string(offset) + " into " +
                  std::to_string(static_cast<int>(into)),
              both_nan);
        }
}

// scale (in place and not; 1/3 rounds, 3e4 overflows float16) and average of the same
// patterns: the same bytes as the scalar loop.
TEST_P(ReduceSimdSizes, ScalesAndAveragesHalvesAsScalar) {
  const std::size_t n = GetParam();
  const std::vector<std::uint16_t> bits = patterns::half_bit_patterns(n, 6);
  for (DType dtype : {DType::float16, DType::bfloat16})
    for (std::size_t offset : {0u, 1u}) {
      const std::string where = std::string(to_string(dtype)) + " n " + std::to_string(n) +
                                " offset " + std::to_string(offset);
      for (double factor : {1.0 / 3, 3e4})
        for (bool in_place : {false, true}) {
          auto run = [&] {
            patterns::ElementBuffer in(n, 2, offset), out(n, 2, offset);
            in.fill(bits);
            if (in_place) {
              kernels::scale(in.data(), n, dtype, factor);
              return in.contents();
            }
            kernels::scale(in.data(), out.data(), n, dtype, factor);
            return out.contents();
          };
          patterns::expect_same_as_scalar(
              run, 2,
              "scale " + where + " by " + std::to_string(factor) + (in_place ? " in place" : ""));
        }
      for (int divisor : {3, 7}) {
        auto run = [&] {
          patterns::ElementBuffer data(n, 2, offset);
          data.fill(bits);
          kernels::average(data.data(), n, dtype, divisor);
          return data.contents();
        };
        patterns::expect_same_as_scalar(run, 2,
                                        "average " + where + " by " + std::to_string(divisor));
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Sizes, ReduceSimdSizes, ::testing::ValuesIn(patterns::simd_sizes));

}  // namespace
}  // namespace loom
