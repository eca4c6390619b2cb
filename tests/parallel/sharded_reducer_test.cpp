// GradientReducer with a sharded plan (ZeRO-1: ShardLevel::optimizer, ZeRO-2: gradients) on
// local ranks: each rank updates only its pieces with plain SGD, and after the all-gathers every
// rank's parameter memory equals SGD on the whole model with the average, at 2, 3 and 5 ranks
// (odd counts, padded buckets), with split gradients, compression and a collective limit; the
// pieces cover every element exactly once; the nodes are in the graph; the misuses are named.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <numeric>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "expect_error.hpp"
#include "loom/error.hpp"
#include "loom/gradient_reducer.hpp"
#include "loom/local.hpp"

namespace loom {
namespace {

using test::expect_error;

ExecutorOptions options(double timeout_s = 20) {
  ExecutorOptions o;
  o.timeout = std::chrono::duration<double>(timeout_s);
  return o;
}

// Odd element counts, so that no bucket divides by the world size without padding.
std::vector<ParameterSpec> model() {
  return {{"embed.weight", "embed", 301},    {"layers.0.weight", "layers.0", 1001},
          {"layers.0.bias", "layers.0", 11}, {"layers.1.weight", "layers.1", 1999},
          {"layers.1.bias", "layers.1", 21}, {"head.weight", "head", 77}};
}

float initial_value(std::size_t p, std::size_t i) {
  return 0.5f - 0.01f * float(p) + 0.0001f * float(i % 113);
}

float local_gradient(int r, std::size_t p, int s, std::size_t i) {
  return float(r + 1) * 0.25f + float(p) * 0.1f + 0.001f * float(i % 97) - 0.3f * float(s);
}

float average(int world, std::size_t p, int s, std::size_t i) {
  double sum = 0;
  for (int r = 0; r < world; ++r) sum += local_gradient(r, p, s, i) * (1.0 / world);
  return float(sum);
}

constexpr float lr = 0.1f;
constexpr int steps = 5;

struct Counts {
  std::atomic<long> wrong_gradients{0}, wrong_values{0}, checked{0};
};

// Every rank runs `steps` sharded SGD steps; the parameter memory is then compared with SGD on
// the whole model, computed here from the known averages.
// deferred: every group's reduction is waited for before any update (as with defer_updates:
// backward ends with every gradient averaged), which needs every all-gather issued after every
// reduction.
void train(int world, ReducerPlan plan, float tolerance, bool deferred = false) {
  Counts counts;
  std::vector<std::vector<float>> want;  // the reference parameters after every step
  for (const ParameterSpec& spec : model()) {
    std::vector<float>& v = want.emplace_back(spec.count);
    for (std::size_t i = 0; i < spec.count; ++i) v[i] = initial_value(want.size() - 1, i);
  }
  for (int s = 0; s < steps; ++s)
    for (std::size_t p = 0; p < want.size(); ++p)
      for (std::size_t i = 0; i < want[p].size(); ++i) want[p][i] -= lr * average(world, p, s, i);
  const auto off = [&](float got, float expected) {
    return std::fabs(got - expected) > tolerance * std::max(1.0f, std::fabs(expected));
  };
  LocalWorld::run(world, [&](Backend& backend) {
    GradientReducer reducer(model(), backend, plan, options());
    const std::size_t n = reducer.num_parameters();
    for (std::size_t p = 0; p < n; ++p) {
      float* v = reducer.parameter_values(p).as<float>();
      for (std::size_t i = 0; i < reducer.parameter(p).count; ++i) v[i] = initial_value(p, i);
    }
    std::vector<std::vector<float>> grads(n);
    for (std::size_t p = 0; p < n; ++p) grads[p].resize(reducer.parameter(p).count);
    std::mt19937 rng(7 + backend.rank());
    for (int step = 0; step < steps; ++step) {
      reducer.begin();
      std::vector<std::size_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      std::thread autograd([&] {
        for (std::size_t p : order) {
          for (std::size_t i = 0; i < grads[p].size(); ++i)
            grads[p][i] = local_gradient(backend.rank(), p, step, i);
          reducer.ready(p, Buffer::of(std::span(grads[p])));
        }
      });
      if (deferred)
        for (std::size_t k = 0; k < reducer.num_update_groups(); ++k) reducer.wait_update(k);
      for (std::size_t k = 0; k < reducer.num_update_groups(); ++k) {
        reducer.wait_update(k);
        for (const ShardPiece& piece : reducer.shard_pieces(k)) {
          float* values = piece.values.as<float>();
          const float* g = piece.gradient.as<float>();
          for (std::size_t i = 0; i < piece.count; ++i) {
            if (off(g[i], average(world, piece.parameter, step, piece.offset + i)))
              ++counts.wrong_gradients;
            values[i] -= lr * g[i];
          }
        }
        reducer.updated(k);
      }
      for (std::size_t k = 0; k < reducer.num_update_groups(); ++k) reducer.wait_gathered(k);
      autograd.join();
      reducer.finish();
    }
    for (std::size_t p = 0; p < n; ++p) {
      const float* v = reducer.parameter_values(p).as<float>();
      for (std::size_t i = 0; i < reducer.parameter(p).count; ++i, ++counts.checked)
        if (off(v[i], want[p][i])) ++counts.wrong_values;
    }
  });
  EXPECT_EQ(counts.wrong_gradients.load(), 0);
  EXPECT_EQ(counts.wrong_values.load(), 0);
  std::size_t total = 0;
  for (const ParameterSpec& spec : model()) total += spec.count;
  EXPECT_EQ(counts.checked.load(), long(total) * world);
}

ReducerPlan sharded(ShardLevel level, std::size_t cap = 4096, bool partition = false) {
  ReducerPlan plan;
  plan.shard = level;
  plan.bucket_cap_bytes = cap;
  plan.first_bucket_bytes = 1024;
  plan.partition_large = partition;
  return plan;
}

class Sharded : public ::testing::TestWithParam<std::tuple<ShardLevel, int>> {};

TEST_P(Sharded, UpdatesItsShardAndGathersSgdOnTheWholeModel) {
  const auto [level, world] = GetParam();
  train(world, sharded(level), 1e-6f);
}

TEST_P(Sharded, EveryReductionLandsBeforeTheFirstUpdate) {
  const auto [level, world] = GetParam();
  train(world, sharded(level, 1500, true), 1e-6f, /*deferred=*/true);
}

TEST_P(Sharded, SplitGradientsStayContiguousAcrossPaddedBuckets) {
  const auto [level, world] = GetParam();
  train(world, sharded(level, 1500, /*partition=*/true), 1e-6f);
}

TEST_P(Sharded, OneCollectiveInFlightWithForwardPriority) {
  const auto [level, world] = GetParam();
  ReducerPlan plan = sharded(level, 2048, true);
  plan.collectives_in_flight = 1;
  plan.priority = IssuePriority::forward;
  train(world, plan, 1e-6f);
}

TEST_P(Sharded, CompressedToFloat16) {
  const auto [level, world] = GetParam();
  ReducerPlan plan = sharded(level);
  plan.compression = Compression::float16;
  train(world, plan, 2e-3f);
}

INSTANTIATE_TEST_SUITE_P(Levels, Sharded,
                         ::testing::Combine(::testing::Values(ShardLevel::optimizer,
                                                              ShardLevel::gradients),
                                            ::testing::Values(2, 3, 5)),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "_ranks";
                         });

TEST(ShardedReducer, PiecesCoverEveryElementOnceAcrossRanks) {
  for (const int world : {2, 3, 4}) {
    std::mutex mutex;
    std::vector<std::vector<int>> covered;
    for (const ParameterSpec& spec : model()) covered.emplace_back(spec.count, 0);
    LocalWorld::run(world, [&](Backend& backend) {
      GradientReducer reducer(model(), backend, sharded(ShardLevel::gradients, 1500, true),
                              options());
      for (const Bucket& b : reducer.buckets()) {
        EXPECT_EQ(b.padded_count % std::size_t(world), 0u);
        EXPECT_GE(b.padded_count, b.count);
        EXPECT_LT(b.padded_count - b.count, std::size_t(world));
      }
      std::lock_guard lock(mutex);
      for (std::size_t k = 0; k < reducer.num_update_groups(); ++k)
        for (const ShardPiece& piece : reducer.shard_pieces(k)) {
          EXPECT_EQ(reducer.update_group_of(piece.parameter), k);
          const float* base = reducer.parameter_values(piece.parameter).as<float>();
          EXPECT_EQ(piece.values.as<float>(), base + piece.offset);
          for (std::size_t i = 0; i < piece.count; ++i)
            ++covered[piece.parameter][piece.offset + i];
        }
    });
    for (std::size_t p = 0; p < covered.size(); ++p)
      for (std::size_t i = 0; i < covered[p].size(); ++i)
        ASSERT_EQ(covered[p][i], 1)
            << "world " << world << ", parameter " << p << ", element " << i;
  }
}

TEST(ShardedReducer, TheGraphReduceScattersThenAllGathers) {
  LocalWorld::run(2, [&](Backend& backend) {
    for (ShardLevel level : {ShardLevel::optimizer, ShardLevel::gradients}) {
      GradientReducer reducer(model(), backend, sharded(level), options());
      for (std::size_t b = 0; b < reducer.buckets().size(); ++b) {
        const std::string name = "bucket" + std::to_string(b);
        EXPECT_TRUE(reducer.graph().find(name + ".reduce_scatter").valid());
        EXPECT_FALSE(reducer.graph().find(name + ".allreduce").valid());
        EXPECT_EQ(reducer.graph().find(name + ".release").valid(), level == ShardLevel::gradients);
        EXPECT_TRUE(reducer.graph().find(name + ".shard").valid());
        EXPECT_TRUE(reducer.graph().find(name + ".allgather").valid());
      }
      EXPECT_NE(describe(reducer.plan()).find(std::string("shard ") + to_string(level)),
                std::string::npos);
    }
  });
}

// The all-gathers go in the order the next forward needs the groups: registration order, or the
// plan's forward_order; a client that updates in that order and waits for each group's gather
// before the next forward's module never waits on an update it has yet to make.
TEST(ShardedReducer, GathersFollowTheForwardOrder) {
  LocalWorld::run(2, [&](Backend& backend) {
    for (bool reversed : {false, true}) {
      ReducerPlan plan = sharded(ShardLevel::optimizer, 1024);
      if (reversed) plan.forward_order = {5, 4, 3, 2, 1, 0};
      GradientReducer reducer(model(), backend, plan, options());
      const std::vector<std::size_t>& order = reducer.gather_order();
      ASSERT_EQ(order.size(), reducer.num_update_groups());
      std::size_t last = 0;
      for (std::size_t k : order) {
        std::size_t first = reducer.num_parameters();
        for (std::size_t p : reducer.update_group(k)) first = std::min(first, reversed ? 5 - p : p);
        EXPECT_GE(first, last) << "group " << k;
        last = first;
      }
      // Updated and gathered in that order, group by group.
      std::vector<std::vector<float>> grads;
      reducer.begin();
      for (std::size_t p = 0; p < reducer.num_parameters(); ++p) {
        grads.emplace_back(reducer.parameter(p).count, 1.0f);
        reducer.ready(p, Buffer::of(std::span(grads.back())));
      }
      for (std::size_t k : order) {
        reducer.wait_update(k);
        reducer.updated(k);
        reducer.wait_gathered(k);
        EXPECT_TRUE(reducer.gathered(k));
      }
      reducer.finish();
    }
  });
}

// ZeRO-2's memory: once a bucket's reduce-scatter landed its whole pages go back to the kernel
// (they read as zero), and the next step's gradients fault them in again with the right values.
TEST(ShardedReducer, GradientBucketsGiveTheirPagesBackAfterTheScatter) {
  std::atomic<long> resident{0}, wrong{0};
  LocalWorld::run(3, [&](Backend& backend) {
    std::vector<ParameterSpec> big = {{"a", "m", 40001}, {"b", "m", 30011}};
    ReducerPlan plan = sharded(ShardLevel::gradients, 64 << 10);
    GradientReducer reducer(big, backend, plan, options());
    EXPECT_TRUE(reducer.graph().find("bucket0.release").valid());
    std::vector<std::vector<float>> grads = {std::vector<float>(40001), std::vector<float>(30011)};
    for (int step = 0; step < 2; ++step) {
      reducer.begin();
      for (std::size_t p = 0; p < 2; ++p) {
        for (std::size_t i = 0; i < grads[p].size(); ++i)
          grads[p][i] = local_gradient(backend.rank(), p, step, i);
        reducer.ready(p, Buffer::of(std::span(grads[p])));
      }
      for (std::size_t k = 0; k < reducer.num_update_groups(); ++k) {
        reducer.wait_update(k);
        for (const ShardPiece& piece : reducer.shard_pieces(k)) {
          const float* g = piece.gradient.as<float>();
          for (std::size_t i = 0; i < piece.count; ++i)
            if (std::fabs(g[i] - average(3, piece.parameter, step, piece.offset + i)) > 1e-5f)
              ++wrong;
        }
        reducer.updated(k);
      }
      reducer.finish();
      // Every element of the buckets' interior pages reads zero now.
      for (std::size_t p = 0; p < 2; ++p) {
        const float* v = reducer.gradient(p).as<float>();
        for (std::size_t i = 2048; i + 2048 < grads[p].size(); ++i)
          if (v[i] != 0.0f) ++resident;
      }
    }
  });
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(resident.load(), 0);
}

TEST(ShardedReducer, ReplanKeepsTheParameterValues) {
  LocalWorld::run(3, [&](Backend& backend) {
    GradientReducer reducer(model(), backend, sharded(ShardLevel::optimizer), options());
    for (std::size_t p = 0; p < reducer.num_parameters(); ++p) {
      float* v = reducer.parameter_values(p).as<float>();
      for (std::size_t i = 0; i < reducer.parameter(p).count; ++i) v[i] = initial_value(p, i);
    }
    reducer.replan(sharded(ShardLevel::gradients, 1500, true));
    EXPECT_EQ(reducer.plan().shard, ShardLevel::gradients);
    for (std::size_t p = 0; p < reducer.num_parameters(); ++p) {
      const float* v = reducer.parameter_values(p).as<float>();
      for (std::size_t i = 0; i < reducer.parameter(p).count; ++i)
        ASSERT_EQ(v[i], initial_value(p, i)) << reducer.parameter(p).name << "[" << i << "]";
    }
  });
}

TEST(ShardedReducer, MisusesAreNamedErrors) {
  LocalWorld::run(2, [&](Backend& backend) {
    ReducerPlan no_updates = sharded(ShardLevel::optimizer);
    no_updates.external_updates = false;
    expect_error(ErrorCode::invalid_argument, "needs external_updates",
                 [&] { GradientReducer(model(), backend, no_updates, options()); });
    std::vector<ParameterSpec> integers = model();
    integers[2].dtype = DType::int32;
    expect_error(ErrorCode::unsupported, "'layers.0.bias' is int32",
                 [&] { GradientReducer(integers, backend, sharded(ShardLevel::gradients)); });
    GradientReducer plain(model(), backend, {}, options());
    expect_error(ErrorCode::invalid_argument, "shard_pieces: the plan is not sharded",
                 [&] { plain.shard_pieces(0); });
    expect_error(ErrorCode::invalid_argument, "parameter_values: the plan is not sharded",
                 [&] { plain.parameter_values(0); });
    GradientReducer reducer(model(), backend, sharded(ShardLevel::gradients), options());
    expect_error(ErrorCode::invalid_argument, "wait_gathered: no step in progress",
                 [&] { reducer.wait_gathered(0); });
    reducer.begin();
    expect_error(ErrorCode::invalid_argument, "was not updated in this step",
                 [&] { reducer.wait_gathered(0); });
    expect_error(ErrorCode::invalid_argument, "update group #99 does not exist",
                 [&] { reducer.shard_pieces(99); });
    std::vector<std::vector<float>> grads;
    for (std::size_t p = 0; p < reducer.num_parameters(); ++p) {
      grads.emplace_back(reducer.parameter(p).count, 1.0f);
      reducer.ready(p, Buffer::of(std::span(grads.back())));
    }
    for (std::size_t k = 0; k < reducer.num_update_groups(); ++k) {
      reducer.wait_update(k);
      reducer.updated(k);
    }
    for (std::size_t k = 0; k < reducer.num_update_groups(); ++k) reducer.wait_gathered(k);
    reducer.finish();
  });
  expect_error(ErrorCode::invalid_argument, "unknown shard level 'zero3'",
               [] { parse_shard_level("zero3"); });
  EXPECT_EQ(parse_shard_level("gradients"), ShardLevel::gradients);
}

// A rank that never applies its update: its peers' all-gathers cannot complete, and their wait
// ends at the deadline with an error naming the all-gather, not a hang.
TEST(ShardedReducer, APeerThatNeverUpdatesIsATimeoutNamingTheAllGather) {
  std::atomic<int> named{0};
  std::string seen = "(nothing thrown on rank 0)";
  LocalWorld::run(2, [&](Backend& backend) {
    GradientReducer reducer(model(), backend, sharded(ShardLevel::gradients), options(1.0));
    std::vector<std::vector<float>> grads;
    reducer.begin();
    for (std::size_t p = 0; p < reducer.num_parameters(); ++p) {
      grads.emplace_back(reducer.parameter(p).count, 1.0f);
      reducer.ready(p, Buffer::of(std::span(grads.back())));
    }
    try {
      for (std::size_t k = 0; k < reducer.num_update_groups(); ++k) {
        reducer.wait_update(k);
        if (backend.rank() == 0) reducer.updated(k);
      }
      if (backend.rank() == 0)
        for (std::size_t k = 0; k < reducer.num_update_groups(); ++k) reducer.wait_gathered(k);
      reducer.finish();
    } catch (const Error& e) {
      if (backend.rank() == 0) seen = e.what();
      // Rank 0's own deadline (timeout), or rank 1's reported first (peer_failed, naming the
      // update rank 1 never signalled): either way the all-gather is named.
      static const std::regex gather("'bucket[0-9]+\\.allgather'");
      if (backend.rank() == 0 &&
          (e.code() == ErrorCode::timeout || e.code() == ErrorCode::peer_failed) &&
          std::regex_search(e.message(), gather) &&
          (e.code() == ErrorCode::timeout ||
           e.message().find("'bucket0.update' on rank 1") != std::string::npos))
        ++named;
    }
    try {
      if (reducer.in_step()) reducer.finish();
    } catch (const Error&) {
    }
  });
  EXPECT_EQ(named.load(), 1) << seen;
}

}  // namespace
}  // namespace loom
