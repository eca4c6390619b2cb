// DType names and sizes, 16-bit float conversions against known bit patterns, loom::Error.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "expect_error.hpp"
#include "loom/buffer.hpp"
#include "loom/dtype.hpp"
#include "loom/error.hpp"

namespace loom {
namespace {

using test::expect_error;

TEST(DType, SizesAndNamesRoundTrip) {
  EXPECT_EQ(dtype_size(DType::float32), 4u);
  EXPECT_EQ(dtype_size(DType::float64), 8u);
  EXPECT_EQ(dtype_size(DType::float16), 2u);
  EXPECT_EQ(dtype_size(DType::bfloat16), 2u);
  EXPECT_EQ(dtype_size(DType::int32), 4u);
  EXPECT_EQ(dtype_size(DType::int64), 8u);
  EXPECT_EQ(dtype_size(DType::uint8), 1u);
  EXPECT_EQ(dtype_size(DType::int8), 1u);
  EXPECT_EQ(dtype_size(DType::int16), 2u);
  EXPECT_EQ(dtype_size(DType::boolean), 1u);
  EXPECT_EQ(dtype_size(DType::complex64), 8u);
  EXPECT_EQ(dtype_size(DType::complex128), 16u);
  EXPECT_EQ(to_string(DType::boolean), "bool");
  EXPECT_EQ(dtype_of<bool>(), DType::boolean);
  EXPECT_EQ(dtype_of<std::int8_t>(), DType::int8);
  EXPECT_EQ(dtype_of<std::int16_t>(), DType::int16);
  EXPECT_EQ(real_dtype(DType::complex64), DType::float32);
  EXPECT_EQ(real_dtype(DType::complex128), DType::float64);
  EXPECT_EQ(real_dtype(DType::int16), DType::int16);
  for (DType d : all_dtypes) EXPECT_EQ(parse_dtype(to_string(d)), d);
  EXPECT_EQ(parse_dtype("half"), DType::float16);
  EXPECT_EQ(parse_dtype("bf16"), DType::bfloat16);
  for (ReduceOp op : all_reduce_ops) EXPECT_EQ(parse_reduce_op(to_string(op)), op);
}

TEST(DType, UnknownNamesAreErrorsNamingTheToken) {
  try {
    parse_dtype("float128");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("'float128'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("complex128"), std::string::npos) << e.what();
  }
  expect_error(ErrorCode::invalid_argument, "unknown reduce op 'mean'",
               [] { parse_reduce_op("mean"); });
}

// As NCCL and Gloo: avg on every numeric type; bool reduces logically but has no avg; complex
// sums and averages only.
TEST(DType, OpsAreThoseNcclAndGlooDefine) {
  for (DType d : all_dtypes)
    for (ReduceOp op : all_reduce_ops) {
      const bool expected = is_complex(d)         ? op == ReduceOp::sum || op == ReduceOp::avg
                            : d == DType::boolean ? op != ReduceOp::avg
                                                  : true;
      EXPECT_EQ(supports(op, d), expected) << to_string(op) << " " << to_string(d);
      EXPECT_EQ(unsupported_reason(op, d).empty(), expected)
          << to_string(op) << " " << to_string(d);
    }
  EXPECT_TRUE(supports(ReduceOp::avg, DType::int64));
  EXPECT_TRUE(supports(ReduceOp::avg, DType::int8));
  EXPECT_FALSE(supports(ReduceOp::avg, DType::boolean));
  EXPECT_FALSE(supports(ReduceOp::max, DType::complex64));
  EXPECT_NE(unsupported_reason(ReduceOp::prod, DType::complex128).find("no order"),
            std::string_view::npos);
}

TEST(Float16, KnownBitPatterns) {
  EXPECT_EQ(to_float16(1.0f).bits, 0x3c00);
  EXPECT_EQ(to_float16(-2.0f).bits, 0xc000);
  EXPECT_EQ(to_float16(65504.0f).bits, 0x7bff);                          // largest finite
  EXPECT_EQ(to_float16(65520.0f).bits, 0x7c00);                          // rounds to infinity
  EXPECT_EQ(to_float16(std::ldexp(1.0f, -24)).bits, 0x0001);             // smallest subnormal
  EXPECT_EQ(to_float16(std::ldexp(1.0f, -26)).bits, 0x0000);             // underflows to zero
  EXPECT_EQ(to_float16(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);      // tie: to even
  EXPECT_EQ(to_float16(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3c02);  // tie: to even (up)
  EXPECT_EQ(to_float16(std::numeric_limits<float>::infinity()).bits, 0x7c00);
  EXPECT_TRUE(std::isnan(to_float(to_float16(std::nanf("")))));
  EXPECT_EQ(to_float(float16_t{0x3555}), 0.333251953125f);
  EXPECT_EQ(to_float(float16_t{0x0001}), std::ldexp(1.0f, -24));
}

TEST(Float16, EveryFiniteValueRoundTrips) {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float16_t h{static_cast<std::uint16_t>(bits)};
    const float f = to_float(h);
    if (std::isnan(f)) continue;
    EXPECT_EQ(to_float16(f).bits, h.bits) << std::hex << bits;
  }
}

TEST(BFloat16, KnownBitPatternsAndRounding) {
  EXPECT_EQ(to_bfloat16(1.0f).bits, 0x3f80);
  EXPECT_EQ(to_bfloat16(-1.5f).bits, 0xbfc0);
  EXPECT_EQ(to_float(bfloat16_t{0x4049}), 3.140625f);
  EXPECT_EQ(to_bfloat16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);      // tie: to even
  EXPECT_EQ(to_bfloat16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);  // tie: to even (up)
  EXPECT_TRUE(std::isnan(to_float(to_bfloat16(std::nanf("")))));
}

TEST(Buffer, SliceAndDescribe) {
  std::vector<double> v(10);
  Buffer b = Buffer::of(std::span(v));
  EXPECT_EQ(b.bytes(), 80u);
  EXPECT_EQ(b.describe(), "float64[10]@cpu");
  EXPECT_EQ(b.slice(3, 4).data(), v.data() + 3);
  expect_error(ErrorCode::invalid_argument, "slice [8, 11) of float64[10]@cpu is out of range",
               [&] { b.slice(8, 3); });
}

TEST(Error, MessageCarriesTheCode) {
  Error e(ErrorCode::timeout, "allreduce #3 did not complete");
  EXPECT_STREQ(e.what(), "[loom:timeout] allreduce #3 did not complete");
  EXPECT_EQ(e.message(), "allreduce #3 did not complete");
}

}  // namespace
}  // namespace loom
