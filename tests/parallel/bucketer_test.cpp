// Bucketer: DDP assignment (caps, first bucket, per dtype), splitting, rebuild from the ready
// order, issue orders, and reduced values through every mode on 2 and 3 local ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "loom/bucketer.hpp"
#include "loom/cuda_device.hpp"
#include "loom/error.hpp"
#include "loom/executor.hpp"
#include "loom/graph.hpp"
#include "loom/local.hpp"
#include "loom/pinned_pool.hpp"

namespace loom {
namespace {

std::vector<ParameterSpec> float_gradients(std::vector<std::size_t> counts) {
  std::vector<ParameterSpec> out;
  for (std::size_t i = 0; i < counts.size(); ++i)
    out.push_back({"g" + std::to_string(i), "", counts[i], DType::float32});
  return out;
}

std::vector<std::size_t> reverse_order(std::size_t n) {
  std::vector<std::size_t> order;
  for (std::size_t i = n; i-- > 0;) order.push_back(i);
  return order;
}

struct Piece {
  std::size_t gradient, offset, count, bucket_offset;
  bool operator==(const Piece&) const = default;
};

std::vector<Piece> pieces_of(const Bucket& b) {
  std::vector<Piece> out;
  for (const auto& p : b.pieces) out.push_back({p.gradient, p.offset, p.count, p.bucket_offset});
  return out;
}

// Float counts 10, 30, 8, 12, 50, 4 (bytes 40, 120, 32, 48, 200, 16); first bucket 64 B, cap
// 160 B. Reverse order: g5 16 B + g4 200 B = 216 >= 64 closes bucket 0 (overshooting, as DDP
// does); g3 48 + g2 32 + g1 120 = 200 >= 160 closes bucket 1; g0 is left open: bucket 2.
TEST(Bucketer, AssignsLikeDdp) {
  const auto grads = float_gradients({10, 30, 8, 12, 50, 4});
  BucketerOptions options{.bucket_cap_bytes = 160, .first_bucket_bytes = 64};
  const auto buckets = Bucketer::assign(grads, reverse_order(6), options);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(pieces_of(buckets[0]), (std::vector<Piece>{{5, 0, 4, 0}, {4, 0, 50, 4}}));
  EXPECT_EQ(pieces_of(buckets[1]),
            (std::vector<Piece>{{3, 0, 12, 0}, {2, 0, 8, 12}, {1, 0, 30, 20}}));
  EXPECT_EQ(pieces_of(buckets[2]), (std::vector<Piece>{{0, 0, 10, 0}}));
  EXPECT_EQ(buckets[0].count, 54u);
  EXPECT_EQ(buckets[0].bytes(), 216u);
  EXPECT_EQ(buckets[0].limit_bytes, 64u);
  EXPECT_EQ(buckets[1].limit_bytes, 160u);
  EXPECT_EQ(buckets[2].limit_bytes, 160u);
}

TEST(Bucketer, DefaultCapsAre25MiBAnd1MiB) {
  const BucketerOptions defaults;
  EXPECT_EQ(defaults.bucket_cap_bytes, 25u << 20);
  EXPECT_EQ(defaults.first_bucket_bytes, 1u << 20);
  // Ten 4 MiB gradients: the first bucket closes at one (4 >= 1 MiB), the next at seven
  // (28 >= 25 MiB), two are left.
  const auto buckets = Bucketer::assign(float_gradients(std::vector<std::size_t>(10, 1 << 20)),
                                        reverse_order(10), defaults);
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets[0].pieces.size(), 1u);
  EXPECT_EQ(buckets[0].pieces[0].gradient, 9u);
  EXPECT_EQ(buckets[1].pieces.size(), 7u);
  EXPECT_EQ(buckets[1].pieces.back().gradient, 2u);
  EXPECT_EQ(buckets[2].pieces.size(), 2u);
  EXPECT_EQ(buckets[2].bytes(), 8u << 20);
}

// Same gradients, splitting at the limits: g4 is cut after 12 floats (bucket 0 = 64 B
// exactly), its other 38 and 2 floats of g3 fill bucket 1 (160 B), and so on.
TEST(Bucketer, SplitsLargeGradientsAtTheCap) {
  const auto grads = float_gradients({10, 30, 8, 12, 50, 4});
  BucketerOptions options{
      .bucket_cap_bytes = 160, .first_bucket_bytes = 64, .partition_large = true};
  const auto buckets = Bucketer::assign(grads, reverse_order(6), options);
  ASSERT_EQ(buckets.size(), 4u);
  EXPECT_EQ(pieces_of(buckets[0]), (std::vector<Piece>{{5, 0, 4, 0}, {4, 0, 12, 4}}));
  EXPECT_EQ(pieces_of(buckets[1]), (std::vector<Piece>{{4, 12, 38, 0}, {3, 0, 2, 38}}));
  EXPECT_EQ(pieces_of(buckets[2]),
            (std::vector<Piece>{{3, 2, 10, 0}, {2, 0, 8, 10}, {1, 0, 22, 18}}));
  EXPECT_EQ(pieces_of(buckets[3]), (std::vector<Piece>{{1, 22, 8, 0}, {0, 0, 10, 8}}));
  EXPECT_EQ(buckets[0].bytes(), 64u);
  EXPECT_EQ(buckets[1].bytes(), 160u);
  EXPECT_EQ(buckets[2].bytes(), 160u);
}

TEST(Bucketer, SplitKeepsTheLastBucketSmall) {
  // One 1000-float gradient after a small one: without splitting it is one 4000 B bucket.
  const auto grads = float_gradients({1000, 3});
  BucketerOptions options{.bucket_cap_bytes = 400, .first_bucket_bytes = 100};
  const auto whole = Bucketer::assign(grads, reverse_order(2), options);
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0].bytes(), 4012u);
  options.partition_large = true;
  const auto split = Bucketer::assign(grads, reverse_order(2), options);
  // 100 B first (3 + 22 floats), then 400 B buckets: 978 floats left = 9 x 100 + 78.
  ASSERT_EQ(split.size(), 11u);
  EXPECT_EQ(split[0].bytes(), 100u);
  std::size_t total = 0;
  for (std::size_t b = 0; b < split.size(); ++b) {
    total += split[b].count;
    EXPECT_LE(split[b].bytes(), b == 0 ? 100u : 400u) << "bucket " << b;
  }
  EXPECT_EQ(total, 1003u);
  EXPECT_EQ(split.back().bytes(), 78u * 4);
}

TEST(Bucketer, GroupsByDtypeEachWithItsFirstBucket) {
  std::vector<ParameterSpec> grads{{"a", "", 20, DType::float32},
                                   {"b", "", 10, DType::float64},
                                   {"c", "", 20, DType::float32},
                                   {"d", "", 10, DType::float64}};
  BucketerOptions options{.bucket_cap_bytes = 1000, .first_bucket_bytes = 64};
  // d (80 B) closes float64's first bucket, c (80 B) float32's; b and a stay open, float64
  // first because it was seen first.
  const auto buckets = Bucketer::assign(grads, reverse_order(4), options);
  ASSERT_EQ(buckets.size(), 4u);
  EXPECT_EQ(pieces_of(buckets[0]), (std::vector<Piece>{{3, 0, 10, 0}}));
  EXPECT_EQ(buckets[0].dtype, DType::float64);
  EXPECT_EQ(pieces_of(buckets[1]), (std::vector<Piece>{{2, 0, 20, 0}}));
  EXPECT_EQ(buckets[1].dtype, DType::float32);
  EXPECT_EQ(pieces_of(buckets[2]), (std::vector<Piece>{{1, 0, 10, 0}}));
  EXPECT_EQ(buckets[2].dtype, DType::float64);
  EXPECT_EQ(pieces_of(buckets[3]), (std::vector<Piece>{{0, 0, 20, 0}}));
}

TEST(Bucketer, ViewsAreContiguousAcrossSplitBuckets) {
  BucketerOptions options{
      .bucket_cap_bytes = 160, .first_bucket_bytes = 64, .partition_large = true};
  Bucketer bucketer(float_gradients({10, 30, 8, 12, 50, 4}), options);
  ASSERT_TRUE(bucketer.gradients_are_views());
  EXPECT_EQ(bucketer.buckets_of(4), (std::vector<std::size_t>{0, 1}));
  const Buffer g4 = bucketer.gradient(4);
  ASSERT_EQ(g4.count(), 50u);
  for (std::size_t j = 0; j < 50; ++j) {
    EXPECT_EQ(g4.as<float>()[j], 0.0f) << "bucket memory starts zeroed";
    g4.as<float>()[j] = static_cast<float>(j + 1);
  }
  // Bucket 0 holds g5 then g4[0, 12); bucket 1 holds g4[12, 50) first.
  for (std::size_t j = 0; j < 12; ++j) EXPECT_EQ(bucketer.wire_buffer(0).as<float>()[4 + j], j + 1);
  for (std::size_t j = 12; j < 50; ++j)
    EXPECT_EQ(bucketer.wire_buffer(1).as<float>()[j - 12], j + 1);
}

TEST(Bucketer, RebuildsFromTheReadyOrder) {
  BucketerOptions options{.bucket_cap_bytes = 160, .first_bucket_bytes = 64};
  Bucketer bucketer(float_gradients({10, 30, 8, 12, 50, 4}), options);
  bucketer.gradient(0).as<float>()[0] = 7;
  EXPECT_FALSE(bucketer.rebuilt());
  // Became ready in registration order: g0 40 B + g1 120 B = 160 >= 64 closes bucket 0;
  // g2 + g3 + g4 = 280 >= 160 closes bucket 1; g5 is left.
  const std::vector<std::size_t> ready{0, 1, 2, 3, 4, 5};
  bucketer.rebuild(ready);
  EXPECT_TRUE(bucketer.rebuilt());
  ASSERT_EQ(bucketer.buckets().size(), 3u);
  EXPECT_EQ(pieces_of(bucketer.buckets()[0]), (std::vector<Piece>{{0, 0, 10, 0}, {1, 0, 30, 10}}));
  EXPECT_EQ(pieces_of(bucketer.buckets()[1]),
            (std::vector<Piece>{{2, 0, 8, 0}, {3, 0, 12, 8}, {4, 0, 50, 20}}));
  EXPECT_EQ(pieces_of(bucketer.buckets()[2]), (std::vector<Piece>{{5, 0, 4, 0}}));
  EXPECT_EQ(bucketer.gradient(0).as<float>()[0], 0.0f) << "rebuilt memory is zeroed";
  EXPECT_EQ(bucketer.gradient(1).data(), bucketer.gradient(0).as<float>() + 10);
}

TEST(Bucketer, ReadyOrderFromTimings) {
  std::vector<NodeTiming> timings{{"p0", NodeKind::compute, 10, 90},
                                  {"p1", NodeKind::compute, 10, 30},
                                  {"p2", NodeKind::compute, 10, 30},
                                  {"other", NodeKind::compute, 0, 5}};
  const std::vector<std::string> producers{"p0", "p1", "p2", "p1"};
  // p1 and p2 end together: later registration first (3 and 1 share p1).
  EXPECT_EQ(Bucketer::ready_order(timings, producers), (std::vector<std::size_t>{3, 2, 1, 0}));
  const std::vector<std::string> missing{"p0", "nope"};
  try {
    Bucketer::ready_order(timings, missing);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(e.message().find("'nope' of gradient #1"), std::string::npos) << e.message();
  }
}

TEST(Bucketer, RankZerosReadyOrderReachesEveryRank) {
  std::mutex mutex;
  std::vector<std::vector<std::size_t>> seen(3);
  LocalWorld::run(3, [&](Backend& backend) {
    std::vector<std::size_t> mine{0, 1, 2, 3};
    if (backend.rank() != 0) std::swap(mine[0], mine[backend.rank()]);
    auto agreed = Bucketer::agreed_ready_order(mine, backend);
    std::lock_guard lock(mutex);
    seen[backend.rank()] = agreed;
  });
  for (const auto& order : seen) EXPECT_EQ(order, (std::vector<std::size_t>{0, 1, 2, 3}));
}

TEST(Bucketer, DifferentGradientCountsAreAMismatchOnEveryRank) {
  std::mutex mutex;
  int mismatches = 0;
  LocalWorld::run(3, [&](Backend& backend) {
    std::vector<std::size_t> mine(backend.rank() == 2 ? 5 : 4, 0);
    try {
      Bucketer::agreed_ready_order(mine, backend);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::mismatch &&
          e.message().find("Bucketer::agreed_ready_order on rank " +
                           std::to_string(backend.rank()) +
                           ": ranks hold between 4 and 5 values") != std::string::npos) {
        std::lock_guard lock(mutex);
        ++mismatches;
      }
    }
  });
  EXPECT_EQ(mismatches, 3);
}

// Producers chained p0 -> p1 -> ... -> p5: gradients become ready in registration order, the
// opposite of DDP's assumption. DDP's buckets {g5,g4}, {g3,g2,g1}, {g0} are then ready last
// to first: bucket order issues bucket 0 first (it waits for all of backward); ready order
// issues bucket 2 first.
TEST(Bucketer, IssueOrderByBucketOrByReadiness) {
  BucketerOptions options{.bucket_cap_bytes = 160, .first_bucket_bytes = 64};
  Bucketer bucketer(float_gradients({10, 30, 8, 12, 50, 4}), options);
  auto backend = make_local_backend();
  for (BucketOrder order : {BucketOrder::bucket, BucketOrder::ready}) {
    Graph g;
    std::vector<Task> producers;
    for (std::size_t i = 0; i < 6; ++i) {
      producers.push_back(
          g.compute("p" + std::to_string(i), [] {}, {.writes = {bucketer.gradient(i)}}));
      if (i > 0) producers[i - 1].precede(producers[i]);
    }
    bucketer.attach(g, producers, 1, {.order = order});
    Executor ex(g, *backend);
    if (order == BucketOrder::bucket)
      EXPECT_EQ(ex.issue_order(),
                (std::vector<std::string>{"bucket0.allreduce", "bucket1.allreduce",
                                          "bucket2.allreduce"}));
    else
      EXPECT_EQ(ex.issue_order(),
                (std::vector<std::string>{"bucket2.allreduce", "bucket1.allreduce",
                                          "bucket0.allreduce"}));
    ex.run();
  }
}

// An explicit issue order (a plan) replaces both: the executor issues the buckets as named,
// whenever they become ready; a list that is not a permutation of the buckets is refused.
TEST(Bucketer, ExplicitIssueOrder) {
  BucketerOptions options{.bucket_cap_bytes = 160, .first_bucket_bytes = 64};
  Bucketer bucketer(float_gradients({10, 30, 8, 12, 50, 4}), options);
  auto backend = make_local_backend();
  auto graph_with = [&](Graph& g) {
    std::vector<Task> producers;
    for (std::size_t i = 0; i < 6; ++i) {
      producers.push_back(
          g.compute("p" + std::to_string(i), [] {}, {.writes = {bucketer.gradient(i)}}));
      if (i > 0) producers[i - 1].precede(producers[i]);
    }
    return producers;
  };
  {
    Graph g;
    const auto producers = graph_with(g);
    bucketer.attach(g, producers, 1, {.issue_order = {1, 0, 2}});
    Executor ex(g, *backend);
    EXPECT_EQ(ex.issue_order(), (std::vector<std::string>{"bucket1.allreduce", "bucket0.allreduce",
                                                          "bucket2.allreduce"}));
    ex.run();
  }
  const std::vector<std::pair<std::vector<std::size_t>, std::string>> bad{
      {{0, 1}, "issue_order has 2 entries for 3 buckets"},
      {{0, 3, 1}, "issue_order names bucket 3 of 3"},
      {{2, 0, 2}, "issue_order names bucket 2 twice"}};
  for (const auto& [order, message] : bad) {
    Graph g;
    const auto producers = graph_with(g);
    try {
      bucketer.attach(g, producers, 1, {.issue_order = order});
      ADD_FAILURE() << "accepted " << message;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(e.message().find(message), std::string::npos) << e.message();
    }
  }
}

struct Mode {
  bool views;
  Compression compression;
  bool split;
};

std::string mode_name(const testing::TestParamInfo<std::tuple<Mode, int>>& info) {
  const auto& [mode, ranks] = info.param;
  return std::string(mode.views ? "views" : "packed") + "_" +
         std::string(to_string(mode.compression)) + (mode.split ? "_split" : "") + "_" +
         std::to_string(ranks) + "ranks";
}

class BucketerRoundTrip : public testing::TestWithParam<std::tuple<Mode, int>> {};

// Every rank writes gradient i[j] = (rank + 1) * (i + 1) + j / 8 (exact in float16 for these
// sizes); after the step each gradient must hold the mean over ranks, computed here directly.
TEST_P(BucketerRoundTrip, AveragesEveryGradient) {
  const auto& [mode, ranks] = GetParam();
  const std::vector<std::size_t> counts{37, 5, 130, 64, 3, 91};  // odd sizes on purpose
  std::mutex mutex;
  int wrong = 0, runs_checked = 0;
  LocalWorld::run(ranks, [&](Backend& backend) {
    std::vector<std::vector<float>> own(counts.size());
    std::vector<ParameterSpec> specs = float_gradients(counts);
    if (!mode.views)
      for (std::size_t i = 0; i < counts.size(); ++i) {
        own[i].assign(counts[i], -1.0f);
        specs[i].storage = Buffer::of(std::span(own[i]));
      }
    PinnedPool pool;
    Bucketer bucketer(std::move(specs), {.bucket_cap_bytes = 256,
                                         .first_bucket_bytes = 64,
                                         .partition_large = mode.split,
                                         .compression = mode.compression,
                                         .pool = &pool});
    Graph g;
    std::vector<Task> producers;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      const Buffer grad = bucketer.gradient(i);
      producers.push_back(g.compute("backward" + std::to_string(i),
                                    [grad, i, r = backend.rank()] {
                                      for (std::size_t j = 0; j < grad.count(); ++j)
                                        grad.as<float>()[j] =
                                            static_cast<float>((r + 1) * (i + 1)) + j / 8.0f;
                                    },
                                    {.writes = {grad}}));
    }
    auto tasks = bucketer.attach(g, producers, backend.world_size());
    int local_wrong = 0;
    auto check = g.compute("check", [&] {
      const double mean_factor = (ranks + 1) / 2.0;  // mean of (r + 1) over ranks
      // float16 keeps 11 significant bits; bfloat16 8; float32 rounds the division only.
      const double tolerance = mode.compression == Compression::float16    ? 4e-3
                               : mode.compression == Compression::bfloat16 ? 3e-2
                                                                           : 1e-6;
      for (std::size_t i = 0; i < counts.size(); ++i) {
        const Buffer grad = bucketer.gradient(i);
        for (std::size_t j = 0; j < grad.count(); ++j) {
          const double expected = mean_factor * (i + 1) + j / 8.0;
          const double got = grad.as<float>()[j];
          if (std::fabs(got - expected) > tolerance * std::fabs(expected)) ++local_wrong;
        }
      }
    });
    for (const auto& t : tasks) {
      EXPECT_EQ(t.pack.valid(), !mode.views || mode.compression != Compression::none);
      EXPECT_EQ(t.unpack.valid(), t.pack.valid());
      t.done().precede(check);
    }
    Executor ex(g, backend);
    ex.run(2);
    std::lock_guard lock(mutex);
    wrong += local_wrong;
    ++runs_checked;
  });
  EXPECT_EQ(runs_checked, ranks);
  EXPECT_EQ(wrong, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, BucketerRoundTrip,
                         testing::Combine(testing::Values(Mode{true, Compression::none, false},
                                                          Mode{false, Compression::none, false},
                                                          Mode{true, Compression::none, true},
                                                          Mode{false, Compression::none, true},
                                                          Mode{true, Compression::float16, false},
                                                          Mode{false, Compression::float16, true},
                                                          Mode{true, Compression::bfloat16, true},
                                                          Mode{false, Compression::bfloat16,
                                                               false}),
                                          testing::Values(2, 3)),
                         mode_name);

// Bit for bit: each mode's arithmetic on 3 ranks (1/3 is inexact). Rank 0 writes x and the
// others 0, so the sum is exactly what rank 0 sent, in any order the backend adds; the rest is
// the Bucketer's own arithmetic, computed here from its definition: a pack with compression
// casts x * float(1/3) to the wire type, an unpack without compression multiplies the sum by
// 1/3 (as a float, each product rounded once to the gradient type; float64 in double), a cast
// back to float32 is exact.
struct Exact {
  DType dtype;
  bool views;
  Compression compression;
  bool split;
  bool average;
};

std::string exact_name(const testing::TestParamInfo<Exact>& info) {
  const Exact& c = info.param;
  return std::string(to_string(c.dtype)) + "_" + (c.views ? "views" : "packed") + "_" +
         std::string(to_string(c.compression)) + (c.split ? "_split" : "") +
         (c.average ? "_average" : "_sum");
}

// Values of every magnitude from 2^-20 to 2^12 and both signs, as the gradient dtype rounds them.
double exact_input(std::size_t gradient, std::size_t j) {
  std::uint32_t h = static_cast<std::uint32_t>(gradient * 7919 + j) * 2654435761u;
  h ^= h >> 15;
  const double mantissa = 1.0 + (h & 0xffff) / 65536.0;
  const int exponent = static_cast<int>((h >> 16) % 33) - 20;
  return ((h >> 31) != 0 ? -1.0 : 1.0) * std::ldexp(mantissa, exponent);
}

// x rounded to `dtype` and back (the value a gradient of that dtype holds).
double rounded(double x, DType dtype) {
  switch (dtype) {
    case DType::float16:
      return to_float(to_float16(static_cast<float>(x)));
    case DType::bfloat16:
      return to_float(to_bfloat16(static_cast<float>(x)));
    case DType::float64:
      return x;
    default:
      return static_cast<float>(x);
  }
}

void store(const Buffer& b, std::size_t j, double x) {
  switch (b.dtype()) {
    case DType::float16:
      b.as<float16_t>()[j] = to_float16(static_cast<float>(x));
      return;
    case DType::bfloat16:
      b.as<bfloat16_t>()[j] = to_bfloat16(static_cast<float>(x));
      return;
    case DType::float64:
      b.as<double>()[j] = x;
      return;
    default:
      b.as<float>()[j] = static_cast<float>(x);
  }
}

// What the Bucketer leaves in a gradient element that holds x on rank 0 and 0 elsewhere.
double expected_after_step(double x, const Exact& c) {
  const float third = c.average ? static_cast<float>(1.0 / 3) : 1.0f;
  if (c.compression != Compression::none)
    return rounded(static_cast<float>(x) * third,
                   c.compression == Compression::float16 ? DType::float16 : DType::bfloat16);
  if (c.dtype == DType::float64) return x * (c.average ? 1.0 / 3 : 1.0);
  return rounded(static_cast<float>(x) * third, c.dtype);
}

class BucketerExact : public testing::TestWithParam<Exact> {};

TEST_P(BucketerExact, EveryModeComputesWhatItDefines) {
  const Exact c = GetParam();
  const std::vector<std::size_t> counts{37, 5, 130, 64, 3, 91};
  constexpr int ranks = 3;
  std::mutex mutex;
  std::vector<std::string> wrong;
  LocalWorld::run(ranks, [&](Backend& backend) {
    std::vector<std::vector<std::byte>> own(counts.size());
    std::vector<ParameterSpec> specs;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      specs.push_back({"g" + std::to_string(i), "", counts[i], c.dtype});
      if (!c.views) {
        own[i].resize(counts[i] * dtype_size(c.dtype));
        specs[i].storage = Buffer(own[i].data(), counts[i], c.dtype);
      }
    }
    PinnedPool pool;
    Bucketer bucketer(std::move(specs), {.bucket_cap_bytes = 256,
                                         .first_bucket_bytes = 64,
                                         .partition_large = c.split,
                                         .compression = c.compression,
                                         .average = c.average,
                                         .pool = &pool});
    Graph g;
    std::vector<Task> producers;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      const Buffer grad = bucketer.gradient(i);
      producers.push_back(g.compute("backward" + std::to_string(i),
                                    [grad, i, r = backend.rank()] {
                                      for (std::size_t j = 0; j < grad.count(); ++j)
                                        store(grad, j, r == 0 ? exact_input(i, j) : 0.0);
                                    },
                                    {.writes = {grad}}));
    }
    bucketer.attach(g, producers, backend.world_size());
    Executor(g, backend).run();
    if (backend.rank() != 0) return;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      const Buffer grad = bucketer.gradient(i);
      for (std::size_t j = 0; j < grad.count(); ++j) {
        std::vector<std::byte> want(dtype_size(c.dtype));
        store(Buffer(want.data(), 1, c.dtype), 0,
              expected_after_step(rounded(exact_input(i, j), c.dtype), c));
        const auto* got = static_cast<const std::byte*>(grad.slice(j, 1).data());
        if (std::memcmp(got, want.data(), want.size()) != 0) {
          std::lock_guard lock(mutex);
          wrong.push_back("g" + std::to_string(i) + "[" + std::to_string(j) + "]");
        }
      }
    }
  });
  EXPECT_TRUE(wrong.empty()) << wrong.size() << " elements differ, first " << wrong.front();
}

INSTANTIATE_TEST_SUITE_P(
    Modes, BucketerExact,
    testing::Values(Exact{DType::float32, false, Compression::none, false, true},
                    Exact{DType::float32, false, Compression::none, true, true},
                    Exact{DType::float32, false, Compression::none, false, false},
                    Exact{DType::float64, false, Compression::none, true, true},
                    Exact{DType::float16, false, Compression::none, false, true},
                    Exact{DType::bfloat16, false, Compression::none, true, true},
                    Exact{DType::float32, true, Compression::float16, false, true},
                    Exact{DType::float32, false, Compression::float16, true, true},
                    Exact{DType::float32, true, Compression::bfloat16, true, true},
                    Exact{DType::float32, false, Compression::bfloat16, false, true},
                    Exact{DType::float32, false, Compression::float16, false, false}),
    exact_name);

using test::expect_error;

// Device gradients: buckets in device memory where loom has CUDA (the GPU tests run them:
// tests/gpu/device_buckets_test.cpp); here what each build says where it cannot.
TEST(Bucketer, DeviceGradientsWithoutADeviceAreNamed) {
  const std::vector<ParameterSpec> on_gpu{{"v", "", 3, DType::float32, Device::cuda(0)}};
  if (!cuda::built_with_cuda()) {
    expect_error(ErrorCode::unsupported,
                 "Bucketer: gradient 'v' (#0) is on cuda:0, but this loom was built without "
                 "CUDA",
                 [&] { Bucketer{on_gpu}; });
    return;
  }
  for (const BucketerOptions options :
       {BucketerOptions{.exact_memory = true}, BucketerOptions{.parameter_memory = true}})
    expect_error(ErrorCode::unsupported,
                 "'v' (#0) is on cuda:0; exact_memory, release_after_scatter and "
                 "parameter_memory are host memory",
                 [&] { Bucketer(on_gpu, options); });
  if (cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is visible: device_buckets_test";
  expect_error(ErrorCode::unavailable,
               "Bucketer: bucket memory for the gradients on cuda:0 (12 bytes): no CUDA device "
               "is visible",
               [&] { Bucketer{on_gpu}; });
}

TEST(Bucketer, BadInputNamesWhatIsWrong) {
  expect_error(ErrorCode::invalid_argument, "no gradients", [] { Bucketer({}); });
  expect_error(ErrorCode::invalid_argument, "'w' (#1) has no elements", [] {
    Bucketer({{"v", "", 3}, {"w", "", 0}});
  });
  expect_error(ErrorCode::invalid_argument, "#0 and #1 are both named 'v'", [] {
    Bucketer({{"v", "", 3}, {"v", "", 4}});
  });
  expect_error(ErrorCode::invalid_argument, "bucket_cap_bytes must be > 0", [] {
    Bucketer({{"v", "", 3}}, {.bucket_cap_bytes = 0});
  });
  std::vector<float> host(3);
  expect_error(
      ErrorCode::invalid_argument,
      "'v' (#0) is declared on cuda:0 but its storage is float32[3]@cpu", [&] {
        Bucketer({{"v", "", 3, DType::float32, Device::cuda(0), Buffer::of(std::span(host))}});
      });
  expect_error(ErrorCode::unsupported, "compression float16 casts float32 gradients", [] {
    Bucketer({{"v", "", 3, DType::float64}}, {.compression = Compression::float16});
  });
  expect_error(ErrorCode::unsupported, "average is not defined for gradient 'i' (#0)", [] {
    Bucketer({{"i", "", 3, DType::int32}});
  });
  std::vector<float> a(3), b(4);
  expect_error(ErrorCode::invalid_argument, "1 of 2 gradients have storage", [&] {
    Bucketer({{"a", "", 3, DType::float32, Device::cpu(), Buffer::of(std::span(a))}, {"b", "", 4}});
  });
  expect_error(ErrorCode::invalid_argument, "declared float32[3] but its storage is float32[4]",
               [&] {
                 Bucketer({{"a", "", 3, DType::float32, Device::cpu(), Buffer::of(std::span(b))}});
               });
  expect_error(ErrorCode::invalid_argument, "unknown compression 'fp8'",
               [] { parse_compression("fp8"); });

  Bucketer bucketer({{"a", "", 3}, {"b", "", 4}});
  expect_error(ErrorCode::invalid_argument, "names gradient #1 twice", [&] {
    const std::vector<std::size_t> order{1, 1};
    bucketer.rebuild(order);
  });
  expect_error(ErrorCode::invalid_argument, "3 entries for 2 gradients", [&] {
    const std::vector<std::size_t> order{0, 1, 2};
    bucketer.rebuild(order);
  });
  Graph g, other;
  auto pa = g.compute("pa", [] {});
  auto foreign = other.compute("pb", [] {});
  expect_error(ErrorCode::invalid_argument, "1 producers for 2 gradients", [&] {
    const std::vector<Task> producers{pa};
    bucketer.attach(g, producers, 2);
  });
  expect_error(ErrorCode::invalid_argument, "producer of gradient 'b' (#1) is a task of another",
               [&] {
                 const std::vector<Task> producers{pa, foreign};
                 bucketer.attach(g, producers, 2);
               });
  expect_error(ErrorCode::invalid_argument, "default-constructed Task", [&] {
    const std::vector<Task> producers{pa, Task{}};
    bucketer.attach(g, producers, 2);
  });
  expect_error(ErrorCode::invalid_argument, "world size 0 is below 1", [&] {
    const std::vector<Task> producers{pa, pa};
    bucketer.attach(g, producers, 0);
  });
  // Packing two gradients of one bucket that share memory would unpack into it twice.
  std::vector<float> shared(4);
  Bucketer aliased({{"x", "", 4, DType::float32, Device::cpu(), Buffer::of(std::span(shared))},
                    {"y", "", 4, DType::float32, Device::cpu(), Buffer::of(std::span(shared))}});
  expect_error(ErrorCode::invalid_argument, "bucket0: the storage of its gradients overlaps", [&] {
    const std::vector<Task> producers{pa, pa};
    aliased.attach(g, producers, 2);
  });
}

}  // namespace
}  // namespace loom
