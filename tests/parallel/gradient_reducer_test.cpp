// GradientReducer on local ranks, without any autograd: gradients handed over from other threads
// in a random order, averaged values checked per update group, unused parameters, usage counts,
// partitioned gradients, compression, replanning from the observed order, and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
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

ExecutorOptions options(double timeout_s = 20, bool profile = false) {
  ExecutorOptions o;
  o.timeout = std::chrono::duration<double>(timeout_s);
  o.profile = profile;
  return o;
}

// A small "model": 6 parameters of various sizes in 3 modules.
std::vector<ParameterSpec> model() {
  return {{"embed.weight", "embed", 300},    {"layers.0.weight", "layers.0", 1000},
          {"layers.0.bias", "layers.0", 10}, {"layers.1.weight", "layers.1", 2000},
          {"layers.1.bias", "layers.1", 20}, {"head.weight", "head", 77}};
}

// Rank r's gradient of parameter p in step s, element i.
float local_gradient(int r, std::size_t p, int s, std::size_t i) {
  return float(r + 1) * 0.25f + float(p) + 0.001f * float(i % 97) + float(s);
}

float expected_average(int world, std::size_t p, int s, std::size_t i) {
  double sum = 0;
  for (int r = 0; r < world; ++r) sum += local_gradient(r, p, s, i) * (1.0 / world);
  return float(sum);
}

struct Case {
  int world;
  ReducerPlan plan;
  float tolerance;
};

class Reducer : public ::testing::TestWithParam<int> {};

void train_steps(const Case& c) {
  std::atomic<int> wrong{0}, checked{0};
  LocalWorld::run(c.world, [&](Backend& backend) {
    GradientReducer reducer(model(), backend, c.plan, options());
    const std::size_t n = reducer.num_parameters();
    std::vector<std::vector<float>> grads(n);
    for (std::size_t p = 0; p < n; ++p) grads[p].resize(reducer.parameter(p).count);
    std::mt19937 rng(11 + backend.rank());
    for (int step = 0; step < 8; ++step) {
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
      std::vector<char> seen(reducer.num_update_groups(), 0);
      auto check = [&](std::size_t k) {
        seen[k] = 1;
        for (std::size_t p : reducer.update_group(k)) {
          const Buffer g = reducer.gradient(p);
          const float* v = g.as<float>();
          for (std::size_t i = 0; i < g.count(); ++i) {
            const float want = expected_average(c.world, p, step, i);
            if (std::fabs(v[i] - want) > c.tolerance * std::max(1.0f, std::fabs(want))) ++wrong;
            ++checked;
          }
        }
        reducer.updated(k);
      };
      // Poll while the gradients come in, then wait for the rest in order.
      while (std::find(seen.begin(), seen.end(), 0) != seen.end()) {
        const auto landed = reducer.poll();
        for (std::size_t k : landed) check(k);
        if (landed.empty()) std::this_thread::yield();
        if (std::count(seen.begin(), seen.end(), 1) >= 1) break;
      }
      for (std::size_t k = 0; k < seen.size(); ++k)
        if (!seen[k]) {
          reducer.wait_update(k);
          check(k);
        }
      autograd.join();
      reducer.finish();
    }
  });
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(checked.load(), 0);
}

TEST(GradientReducer, AveragesOnTwoRanksWithSmallBuckets) {
  ReducerPlan plan;
  plan.bucket_cap_bytes = 4096;
  plan.first_bucket_bytes = 1024;
  train_steps({2, plan, 1e-6f});
}

TEST(GradientReducer, AveragesOnThreeRanksPartitionedAndOneInFlight) {
  ReducerPlan plan;
  plan.bucket_cap_bytes = 2048;
  plan.first_bucket_bytes = 512;
  plan.partition_large = true;
  plan.collectives_in_flight = 1;
  train_steps({3, plan, 1e-6f});
}

TEST(GradientReducer, AveragesCompressedToFloat16) {
  ReducerPlan plan;
  plan.bucket_cap_bytes = 4096;
  plan.compression = Compression::float16;
  train_steps({2, plan, 2e-3f});
}

TEST(GradientReducer, AveragesWithoutExternalUpdatesAndWithAPlannedOrder) {
  ReducerPlan plan;
  plan.bucket_cap_bytes = 4096;
  plan.first_bucket_bytes = 1024;
  plan.external_updates = false;
  {
    // The bucket count for this plan, to give a reversed issue order.
    auto backend = make_local_backend();
    GradientReducer probe(model(), *backend, plan, options());
    plan.issue_order.resize(probe.buckets().size());
    std::iota(plan.issue_order.rbegin(), plan.issue_order.rend(), 0);
  }
  train_steps({3, plan, 1e-6f});
}

TEST(GradientReducer, AveragesOnThreeRanksWithForwardPriorityPartitioned) {
  ReducerPlan plan;
  plan.bucket_cap_bytes = 2048;
  plan.first_bucket_bytes = 512;
  plan.partition_large = true;
  plan.collectives_in_flight = 1;
  plan.priority = IssuePriority::forward;
  plan.wire_ratio = 3;
  train_steps({3, plan, 1e-6f});
}

// Four parameters of 400 bytes, one bucket each, ready in reverse registration order at 1/4,
// 1/2, 3/4 and 1 of backward. With the wire taking twice the backward (1/2 a bucket): bucket0
// (layer 3) at 1/4; at 3/4 bucket1 (layer 2) and bucket2 (layer 1) wait, layer 1 goes first;
// at 5/4 bucket3 (layer 0, needed first) overtakes bucket1.
std::vector<ParameterSpec> four_layers() {
  return {{"l0.weight", "l0", 100},
          {"l1.weight", "l1", 100},
          {"l2.weight", "l2", 100},
          {"l3.weight", "l3", 100}};
}

ReducerPlan one_per_bucket(std::size_t in_flight, IssuePriority priority, double wire_ratio) {
  ReducerPlan plan;
  plan.bucket_cap_bytes = 400;
  plan.first_bucket_bytes = 400;
  plan.collectives_in_flight = in_flight;
  plan.priority = priority;
  plan.wire_ratio = wire_ratio;
  return plan;
}

TEST(GradientReducer, ForwardPriorityIssuesTheNextForwardsBucketsFirstOnEveryRank) {
  std::mutex mutex;
  std::vector<std::vector<std::string>> issued;
  std::atomic<int> wrong{0};
  LocalWorld::run(3, [&](Backend& backend) {
    GradientReducer reducer(four_layers(), backend, one_per_bucket(1, IssuePriority::forward, 2.0),
                            options());
    const std::vector<std::size_t> expected = {0, 2, 3, 1};
    wrong += reducer.issue_order() != expected;
    for (std::size_t b = 0; b < 4; ++b)  // bucket b holds layer 3 - b
      wrong += reducer.buckets()[b].pieces.at(0).gradient != 3 - b;
    // Update groups follow the issue order.
    for (std::size_t k = 0; k < 4; ++k)
      wrong += reducer.update_group(k) != std::vector<std::size_t>{3 - expected[k]};
    wrong += describe(reducer.plan()).find("forward priority") == std::string::npos;
    std::lock_guard lock(mutex);
    issued.push_back(reducer.executor().issue_order());
  });
  EXPECT_EQ(wrong.load(), 0);
  ASSERT_EQ(issued.size(), 3u);
  const std::vector<std::string> expected = {"bucket0.allreduce", "bucket2.allreduce",
                                             "bucket3.allreduce", "bucket1.allreduce"};
  for (const auto& order : issued) EXPECT_EQ(order, expected);
}

TEST(GradientReducer, ForwardPriorityKeepsTheReadyOrderWhereTheWireKeepsUpOrIsUnlimited) {
  auto backend = make_local_backend();
  const std::vector<std::size_t> ready = {0, 1, 2, 3};
  GradientReducer keeps_up(four_layers(), *backend, one_per_bucket(1, IssuePriority::forward, 1.0),
                           options());
  EXPECT_EQ(keeps_up.issue_order(), ready);
  GradientReducer unlimited(four_layers(), *backend, one_per_bucket(0, IssuePriority::forward, 2.0),
                            options());
  EXPECT_EQ(unlimited.issue_order(), ready);
  GradientReducer by_ready(four_layers(), *backend, one_per_bucket(1, IssuePriority::ready, 2.0),
                           options());
  EXPECT_EQ(by_ready.issue_order(), ready);
  // A slower wire: everything after the first bucket waits, and goes in forward order.
  GradientReducer slow(four_layers(), *backend, one_per_bucket(1, IssuePriority::forward, 8.0),
                       options());
  EXPECT_EQ(slow.issue_order(), (std::vector<std::size_t>{0, 3, 2, 1}));
  // The forward order is the plan's: here layer 3 is used first, so the ready order stays.
  ReducerPlan reversed = one_per_bucket(1, IssuePriority::forward, 8.0);
  reversed.forward_order = {3, 2, 1, 0};
  GradientReducer other(four_layers(), *backend, reversed, options());
  EXPECT_EQ(other.issue_order(), ready);
  ReducerPlan bad = one_per_bucket(1, IssuePriority::forward, 0.0);
  expect_error(ErrorCode::invalid_argument, "wire_ratio must be > 0 (got 0",
               [&] { GradientReducer(four_layers(), *backend, bad, options()); });
  bad.wire_ratio = 1;
  bad.forward_order = {0, 1, 2};
  expect_error(ErrorCode::invalid_argument, "forward_order has 3 entries for 4 parameters",
               [&] { GradientReducer(four_layers(), *backend, bad, options()); });
}

// A large gradient partitioned: its later pieces do not hold back the small bucket the next
// forward needs first.
TEST(GradientReducer, ForwardPriorityWithPartitionPutsTheFirstLayerAheadOfALargeGradient) {
  auto backend = make_local_backend();
  std::vector<ParameterSpec> specs = {{"l0.weight", "l0", 100}, {"l1.weight", "l1", 1000}};
  ReducerPlan plan = one_per_bucket(1, IssuePriority::forward, 4.0);
  plan.partition_large = true;
  GradientReducer reducer(specs, *backend, plan, options());
  // l1 in 10 pieces (buckets 0..9), l0 in bucket 10: issued right after the first piece.
  ASSERT_EQ(reducer.buckets().size(), 11u);
  EXPECT_EQ(reducer.issue_order()[0], 0u);
  EXPECT_EQ(reducer.issue_order()[1], 10u);
}

TEST(GradientReducer, UpdateGroupsCoverEveryParameterOnce) {
  auto backend = make_local_backend();
  ReducerPlan plan;
  plan.bucket_cap_bytes = 1024;
  plan.first_bucket_bytes = 256;
  plan.partition_large = true;
  GradientReducer reducer(model(), *backend, plan, options());
  std::vector<int> count(reducer.num_parameters(), 0);
  for (std::size_t k = 0; k < reducer.num_update_groups(); ++k)
    for (std::size_t p : reducer.update_group(k)) {
      ++count[p];
      EXPECT_EQ(reducer.update_group_of(p), k);
    }
  for (int c : count) EXPECT_EQ(c, 1);
  EXPECT_GT(reducer.buckets().size(), reducer.num_parameters());  // partitioned
}

// Parameter 5 is used on rank 0 only, parameter 0 on no rank: each rank hands its unused ones
// over with mark_unused(); the usage counts tell which were unused everywhere.
TEST(GradientReducer, UnusedParametersAreZeroAndCountedAcrossRanks) {
  std::atomic<int> wrong{0};
  LocalWorld::run(2, [&](Backend& backend) {
    ReducerPlan plan;
    plan.bucket_cap_bytes = 4096;
    plan.track_usage = true;
    GradientReducer reducer(model(), backend, plan, options());
    const std::size_t n = reducer.num_parameters();
    std::vector<std::vector<float>> grads(n);
    for (std::size_t p = 0; p < n; ++p) grads[p].assign(reducer.parameter(p).count, 1.0f);
    for (int step = 0; step < 3; ++step) {
      reducer.begin();
      for (std::size_t p = n; p-- > 0;) {
        const bool used = p != 0 && (p != 5 || backend.rank() == 0);
        if (used)
          reducer.ready(p, Buffer::of(std::span(grads[p])));
        else
          reducer.mark_unused(p);
      }
      EXPECT_TRUE(reducer.poll().empty());  // every update waits for the usage counts
      reducer.backward_done();
      for (std::size_t k = 0; k < reducer.num_update_groups(); ++k) {
        reducer.wait_update(k);
        reducer.updated(k);
      }
      wrong += !reducer.globally_unused(0);
      wrong += reducer.globally_unused(5);
      wrong += reducer.globally_unused(3);
      const float* head = reducer.gradient(5).as<float>();
      wrong += head[0] != 0.5f;  // (1 + 0) / 2
      const float* embed = reducer.gradient(0).as<float>();
      wrong += embed[0] != 0.0f;
      reducer.finish();
    }
  });
  EXPECT_EQ(wrong.load(), 0);
}

// A parameter unused on this rank in this step whose gradient the rank still holds (accumulated
// under no_sync) is handed over with used = false: that gradient is its share, as DDP sends it,
// and it counts as unused here: unused on every rank, it is globally unused.
TEST(GradientReducer, AHeldGradientOfAnUnusedParameterIsItsShareButNotAUse) {
  std::atomic<int> wrong{0};
  LocalWorld::run(3, [&](Backend& backend) {
    ReducerPlan plan;
    plan.bucket_cap_bytes = 4096;
    plan.track_usage = true;
    GradientReducer reducer(model(), backend, plan, options());
    const std::size_t n = reducer.num_parameters();
    std::vector<std::vector<float>> grads(n);
    for (std::size_t p = 0; p < n; ++p)
      grads[p].assign(reducer.parameter(p).count, static_cast<float>(backend.rank() + 1));
    reducer.begin();
    for (std::size_t p = n; p-- > 0;) {
      if (p == 0)  // held on every rank, used on none
        reducer.ready(p, Buffer::of(std::span(grads[p])), /*used=*/false);
      else if (p == 5 && backend.rank() != 0)  // used on rank 0, held elsewhere
        reducer.ready(p, Buffer::of(std::span(grads[p])), /*used=*/false);
      else
        reducer.ready(p, Buffer::of(std::span(grads[p])));
    }
    reducer.backward_done();
    for (std::size_t k = 0; k < reducer.num_update_groups(); ++k) {
      reducer.wait_update(k);
      reducer.updated(k);
    }
    wrong += !reducer.globally_unused(0);
    wrong += reducer.globally_unused(5);
    wrong += reducer.gradient(5).as<float>()[0] != 2.0f;  // (1 + 2 + 3) / 3: every share
    wrong += reducer.gradient(0).as<float>()[0] != 2.0f;
    reducer.finish();
  });
  EXPECT_EQ(wrong.load(), 0);
}

TEST(GradientReducer, AMissingGradientIsATimeoutNamingIt) {
  auto backend = make_local_backend();
  GradientReducer reducer(model(), *backend, {}, options(0.3));
  std::vector<float> g(77, 1.0f);
  reducer.begin();
  reducer.ready(5, Buffer::of(std::span(g)));
  try {
    reducer.finish();
    FAIL() << "finish() did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::timeout);
    EXPECT_NE(e.message().find("'grad.layers.1.bias'"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(reducer.in_step());
}

TEST(GradientReducer, BadHandOversAreNamedErrors) {
  auto backend = make_local_backend();
  GradientReducer reducer(model(), *backend, {}, options(5));
  std::vector<float> right(77, 1.0f), wrong_size(76, 1.0f);
  auto message_of = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      return e.message();
    }
    return std::string("no error");
  };
  EXPECT_NE(message_of([&] {
              reducer.ready(5, Buffer::of(std::span(right)));
            }).find("no step in progress"),
            std::string::npos);
  reducer.begin();
  EXPECT_NE(message_of([&] { reducer.ready(5, Buffer::of(std::span(wrong_size))); })
                .find("'head.weight' (#5, module 'head') on rank 0 of 1 is declared "
                      "float32[77] but its gradient is float32[76]"),
            std::string::npos);
  reducer.ready(5, Buffer::of(std::span(right)));
  EXPECT_NE(message_of([&] {
              reducer.ready(5, Buffer::of(std::span(right)));
            }).find("was already handed over in this step"),
            std::string::npos);
  EXPECT_NE(message_of([&] { reducer.begin(); }).find("not finished"), std::string::npos);
  for (std::size_t p = 0; p < 5; ++p) reducer.mark_unused(p);
  for (std::size_t k = 0; k < reducer.num_update_groups(); ++k) {
    reducer.wait_update(k);
    reducer.updated(k);
  }
  reducer.finish();
  expect_error(ErrorCode::invalid_argument, "parameter 'a' has no elements", [&] {
    GradientReducer({{"a", "", 0}}, *backend);
  });
  expect_error(ErrorCode::invalid_argument, "parameters #0 and #1 are both named 'a'", [&] {
    GradientReducer({{"a", "", 1}, {"a", "", 2}}, *backend);
  });
  // The one descriptor's fields the Bucketer reads and the reducer does not take.
  std::vector<float> own(3);
  expect_error(
      ErrorCode::invalid_argument,
      "GradientReducer: parameter 'a' has storage: the reducer owns the gradients' memory", [&] {
        GradientReducer({{"a", "", 3, DType::float32, Device::cpu(), Buffer::of(std::span(own))}},
                        *backend);
      });
  expect_error(ErrorCode::unsupported,
               "GradientReducer: parameter 'a' is on cuda:0, which the local backend cannot move",
               [&] {
                 GradientReducer({{"a", "", 3, DType::float32, Device::cuda(0)}}, *backend);
               });
  ReducerPlan sharded;
  sharded.shard = ShardLevel::optimizer;
  expect_error(
      ErrorCode::unsupported,
      "GradientReducer: parameter 'a' is on cuda:0; shard 'optimizer' keeps the "
      "parameters in host memory",
      [&] {
        GradientReducer({{"a", "", 3, DType::float32, Device::cuda(0)}}, *backend, sharded);
      });
}

TEST(GradientReducer, ReplansFromTheObservedOrderAndExplainsBuckets) {
  std::atomic<int> wrong{0};
  LocalWorld::run(2, [&](Backend& backend) {
    ReducerPlan plan;
    plan.bucket_cap_bytes = 4096;
    plan.first_bucket_bytes = 1024;
    GradientReducer reducer(model(), backend, plan, options(20, true));
    const std::size_t n = reducer.num_parameters();
    std::vector<std::vector<float>> grads(n);
    for (std::size_t p = 0; p < n; ++p) grads[p].assign(reducer.parameter(p).count, 2.0f);
    auto step = [&](const std::vector<std::size_t>& order) {
      reducer.begin();
      for (std::size_t p : order) reducer.ready(p, Buffer::of(std::span(grads[p])));
      for (std::size_t k = 0; k < reducer.num_update_groups(); ++k) {
        reducer.wait_update(k);
        for (std::size_t p : reducer.update_group(k))
          wrong += reducer.gradient(p).as<float>()[0] != 2.0f;
        reducer.updated(k);
      }
      reducer.finish();
    };
    const std::vector<std::size_t> registration = {0, 1, 2, 3, 4, 5};
    step(registration);
    wrong += reducer.observed_ready_order() != registration;
    plan.ready_order = reducer.agreed(reducer.observed_ready_order());
    reducer.replan(plan);
    step(registration);
    const std::string report = reducer.explain();
    if (report.find("bucket0 (issue #0") == std::string::npos) ++wrong;
    if (report.find("embed") == std::string::npos) ++wrong;
    if (report.find("bucket0.allreduce") == std::string::npos) ++wrong;
    std::ostringstream dot;
    reducer.executor().dump_dot(dot);
    if (dot.str().find("grad.layers.1.weight") == std::string::npos) ++wrong;
  });
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace loom
