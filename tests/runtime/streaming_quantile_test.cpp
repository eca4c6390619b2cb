// Tests runtime/streaming_quantile: exact quantiles while few values were added, within half a
// bin after, fixed memory however many values, and its errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "expect_error.hpp"
#include "loom/error.hpp"
#include "loom/streaming_quantile.hpp"

namespace loom {
namespace {

using test::expect_error;

double exact_quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  // The value of rank ceil(q * n), as the histogram form reports.
  const auto rank = std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(q * v.size())));
  return v[rank - 1];
}

TEST(StreamingQuantile, ExactWhileFewValues) {
  StreamingQuantile s(8);
  EXPECT_EQ(s.median(), 0.0);  // nothing added
  for (double v : {5.0, 1.0, 4.0}) s.add(v);
  EXPECT_TRUE(s.exact());
  EXPECT_EQ(s.median(), 4.0);
  s.add(2.0);
  EXPECT_EQ(s.median(), 3.0);  // even count: the mean of the middle two
  EXPECT_EQ(s.quantile(0), 1.0);
  EXPECT_EQ(s.quantile(1), 5.0);
  EXPECT_EQ(s.min(), 1.0);
  EXPECT_EQ(s.max(), 5.0);
  EXPECT_EQ(s.mean(), 3.0);
  EXPECT_EQ(s.count(), 4u);
}

TEST(StreamingQuantile, WithinHalfABinOfExactForManyValues) {
  std::mt19937_64 random(7);
  std::lognormal_distribution<double> step_ms(std::log(15.0), 0.3);
  StreamingQuantile s(64);
  std::vector<double> all;
  for (int i = 0; i < 200000; ++i) {
    const double v = step_ms(random);
    all.push_back(v);
    s.add(v);
  }
  EXPECT_FALSE(s.exact());
  for (double q : {0.1, 0.5, 0.9, 0.99}) {
    const double expected = exact_quantile(all, q);
    EXPECT_NEAR(s.quantile(q), expected, expected * 0.0026) << "q " << q;
  }
  EXPECT_EQ(s.min(), *std::min_element(all.begin(), all.end()));
  EXPECT_EQ(s.max(), *std::max_element(all.begin(), all.end()));
}

TEST(StreamingQuantile, ZerosAndRatiosAfterTheExactValues) {
  StreamingQuantile s(4);
  for (int i = 0; i < 6; ++i) s.add(0.0);  // overlap efficiency 0: nothing hidden
  for (int i = 0; i < 5; ++i) s.add(0.75);
  EXPECT_FALSE(s.exact());
  EXPECT_EQ(s.median(), 0.0);  // 6 zeros of 11
  s.add(0.75);
  s.add(0.75);
  EXPECT_NEAR(s.median(), 0.75, 0.75 * 0.0026);  // 7 of 13 are 0.75
}

TEST(StreamingQuantile, MemoryIsFixed) {
  StreamingQuantile s;
  const std::size_t bytes = s.heap_bytes();
  EXPECT_LT(bytes, std::size_t{64} << 10);
  for (int i = 0; i < 100000; ++i) s.add(1.0 + i % 97);
  EXPECT_EQ(s.heap_bytes(), bytes);
}

TEST(StreamingQuantile, BadInputIsNamed) {
  StreamingQuantile s;
  try {
    s.add(-1.5);
    ADD_FAILURE() << "a negative value was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(e.message().find("-1.5"), std::string::npos) << e.what();
  }
  // std::to_string writes NaN as "nan" (or "-nan").
  expect_error(ErrorCode::invalid_argument, "nan is not a non-negative number",
               [&] { s.add(std::nan("")); });
  expect_error(ErrorCode::invalid_argument, "q 1.500000 is outside [0, 1]",
               [&] { s.quantile(1.5); });
  expect_error(ErrorCode::invalid_argument, "relative_resolution 0.000000 is outside (0, 1)",
               [] { StreamingQuantile(16, 0.0); });
}

}  // namespace
}  // namespace loom
