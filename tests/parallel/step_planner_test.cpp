// The step planner on a synthetic step (no model at all): a backward chain producing four
// gradients, the Bucketer's chains and an update per bucket, with profiled runs made up by the
// test; the shortlist, the round-robin trials, rank 0's plans on every rank, and what the planner
// stands on (Graph::topological_order, NodeTiming::task, Backend::agree_on_root).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "loom/error.hpp"
#include "loom/local.hpp"
#include "loom/step_planner.hpp"

namespace loom {
namespace {

using test::expect_error;

constexpr std::size_t kGradients = 4;
constexpr std::size_t kCount = 65536;  // 256 KiB of float32 each

std::unique_ptr<Bucketer> make_bucketer(const BucketerOptions& options) {
  std::vector<ParameterSpec> specs;
  for (std::size_t i = 0; i < kGradients; ++i)
    specs.push_back({"g" + std::to_string(i), "", kCount});
  return std::make_unique<Bucketer>(std::move(specs), options);
}

// backward3 -> backward2 -> backward1 -> backward0 (backward i produces g_i), the buckets, and
// "bucket<b>.update" after each.
PlanGraph build(const Bucketer& bucketer, std::span<const std::size_t> order) {
  PlanGraph g;
  std::vector<Task> producers(kGradients);
  Task previous;
  for (std::size_t i = kGradients; i-- > 0;) {
    producers[i] = g.graph.compute("backward" + std::to_string(i), [] {});
    if (previous.valid()) previous.precede(producers[i]);
    previous = producers[i];
  }
  AttachOptions attach;
  attach.issue_order.assign(order.begin(), order.end());
  g.buckets = bucketer.attach(g.graph, producers, 2, attach);
  for (std::size_t b = 0; b < g.buckets.size(); ++b) {
    g.updates.push_back(g.graph.compute("bucket" + std::to_string(b) + ".update", [] {}));
    g.buckets[b].done().precede(g.updates.back());
  }
  return g;
}

// A run of `g` as a profiler would record it: backward nodes 5 ms each, one after another; each
// allreduce issued when its bucket is ready and on a wire of 20 ms per MiB, one at a time;
// each update 0.1 ms per MiB after its allreduce.
std::vector<NodeTiming> made_up_run(const PlanGraph& g, const Bucketer& bucketer) {
  constexpr std::int64_t ms = 1'000'000;
  std::vector<NodeTiming> run(g.graph.size());
  std::vector<std::int64_t> produced(kGradients);
  for (std::size_t i = kGradients; i-- > 0;) {
    const std::int64_t start = std::int64_t(kGradients - 1 - i) * 5 * ms;
    const Task t = g.graph.find("backward" + std::to_string(i));
    run[t.id()] = {t.name(), t.kind(), start, start + 5 * ms};
    produced[i] = start + 5 * ms;
  }
  std::int64_t wire_free = 0;
  for (std::size_t b = 0; b < g.buckets.size(); ++b) {
    std::int64_t ready = 0;
    for (const BucketPiece& p : bucketer.buckets()[b].pieces)
      ready = std::max(ready, produced[p.gradient]);
    const double mib = double(bucketer.buckets()[b].bytes()) / double(1 << 20);
    const std::int64_t start = std::max(ready, wire_free);
    const std::int64_t end = start + std::int64_t(20 * ms * mib);
    wire_free = end;
    const Task r = g.buckets[b].reduce;
    run[r.id()] = {r.name(), r.kind(), start, end};
    run[r.id()].bytes = bucketer.buckets()[b].bytes();
    const Task u = g.updates[b];
    run[u.id()] = {u.name(), u.kind(), end, end + std::int64_t(0.1 * ms * mib) + 1000};
  }
  for (std::size_t id = 0; id < run.size(); ++id) run[id].task = id;
  return run;
}

TEST(StepPlanner, RanksEveryCandidateAndPrefersBucketsThatOverlapBackward) {
  // Running: one bucket for everything (cap 25 MiB): its 20 ms allreduce waits for the whole
  // 20 ms backward. Buckets of one gradient each hide three quarters of it.
  BucketerOptions running_options;
  running_options.bucket_cap_bytes = std::size_t{25} << 20;
  running_options.first_bucket_bytes = std::size_t{25} << 20;
  const auto running_bucketer = make_bucketer(running_options);
  ASSERT_EQ(running_bucketer->buckets().size(), 1u);
  const PlanGraph running = build(*running_bucketer, {});
  const std::vector<std::vector<NodeTiming>> runs{made_up_run(running, *running_bucketer),
                                                  made_up_run(running, *running_bucketer)};
  PlanSearch search;
  search.caps_bytes = {std::size_t{256} << 10, std::size_t{512} << 10, std::size_t{25} << 20};
  search.first_bucket_bytes = {std::size_t{256} << 10};
  search.max_in_flight = 1;
  search.latency_s = 0;
  PlanInputs inputs;
  inputs.running = &running;
  inputs.bucketer = running_bucketer.get();
  inputs.runs = runs;
  inputs.ranks = 2;
  inputs.workers = 1;
  const std::vector<TimedPlan> plans = search_plans(search, inputs, make_bucketer, build);
  // Candidates (PlanSearch::bucketings, shared with the GradientReducer's search): the running
  // (25 MiB, 25 MiB), then cap x first (<= cap); partitioned only where a gradient exceeds the
  // cap, which none of these does.
  std::set<std::tuple<std::size_t, std::size_t, bool>> bucketings;
  for (const TimedPlan& p : plans) {
    bucketings.insert({p.plan.bucket_cap_bytes, p.plan.first_bucket_bytes, p.plan.partition_large});
    std::vector<std::size_t> order = p.plan.issue_order;
    std::sort(order.begin(), order.end());
    std::vector<std::size_t> all(p.buckets);
    std::iota(all.begin(), all.end(), std::size_t{0});
    if (&p == &plans.front())  // the running plan runs in ready order, as configured
      EXPECT_TRUE(order.empty()) << describe(p);
    else
      EXPECT_EQ(order, all) << describe(p) << ": not a permutation of its buckets";
    EXPECT_LE(p.plan.collectives_in_flight, 1u);
    EXPECT_GT(p.predicted_step_s, 0);
  }
  // cap x first (<= cap): 256K {256K}, 512K {512K, 256K}, 25M {25M, 256K}.
  EXPECT_EQ(bucketings.size(), 5u);
  for (const auto& [cap, first, partition] : bucketings) EXPECT_FALSE(partition) << cap;
  // The running plan as it runs first, then every bucketing at in flight 0 and 1.
  EXPECT_EQ(plans.size(), 1 + bucketings.size() * 2);
  EXPECT_EQ(plans.front().buckets, 1u);
  EXPECT_EQ(plans.front().plan.bucket_cap_bytes, running_options.bucket_cap_bytes);
  EXPECT_EQ(plans.front().plan.collectives_in_flight, 0u);
  EXPECT_NEAR(plans.front().predicted_step_s, 0.040, 0.004) << describe(plans.front());
  EXPECT_TRUE(
      std::is_sorted(plans.begin() + 1, plans.end(), [](const TimedPlan& a, const TimedPlan& b) {
        return a.predicted_step_s < b.predicted_step_s;
      }));
  // The running plan is predicted as measured (~20 ms backward + 20 ms wire); the best hides
  // the wire behind backward: ~20 ms + the last 5 ms bucket.
  const auto one_bucket = std::find_if(plans.begin(), plans.end(), [](const TimedPlan& p) {
    return p.buckets == 1 && p.plan.collectives_in_flight == 0;
  });
  ASSERT_NE(one_bucket, plans.end());
  EXPECT_NEAR(one_bucket->predicted_step_s, 0.040, 0.004) << describe(*one_bucket);
  EXPECT_GE(plans[1].buckets, 4u) << describe(plans[1]);
  EXPECT_NEAR(plans[1].predicted_step_s, 0.025, 0.004) << describe(plans[1]);

  // The shortlist: the running plan, then the best of each in-flight limit.
  const std::vector<TimedPlan> shortlist = shortlist_plans(plans, 3);
  ASSERT_EQ(shortlist.size(), 3u);
  EXPECT_EQ(describe(shortlist[0]), describe(plans[0]));
  EXPECT_EQ(describe(shortlist[1]), describe(plans[1]));
  EXPECT_NE(shortlist[1].plan.collectives_in_flight, shortlist[2].plan.collectives_in_flight);

  // A running issue order naming a bucket the running step lacks is a named error.
  const std::vector<std::size_t> bad_order{0, 3};
  PlanInputs bad_inputs = inputs;
  bad_inputs.issue_order = bad_order;
  expect_error(ErrorCode::invalid_argument, "running issue order names bucket 3 of 1",
               [&] { search_plans(search, bad_inputs, make_bucketer, build); });

  // A search without a profiled run, or with a bad field, is a named error.
  PlanInputs no_runs = inputs;
  no_runs.runs = {};
  expect_error(ErrorCode::invalid_argument, "search_plans needs a profiled run",
               [&] { search_plans(search, no_runs, make_bucketer, build); });
  PlanSearch bad = search;
  bad.trial_runs = 1;
  expect_error(ErrorCode::invalid_argument, "trial_runs >= 2",
               [&] { search_plans(bad, inputs, make_bucketer, build); });
}

TimedPlan plan_with(std::size_t cap, std::size_t in_flight) {
  TimedPlan p;
  p.plan.bucket_cap_bytes = cap;
  p.plan.first_bucket_bytes = cap;
  p.plan.collectives_in_flight = in_flight;
  return p;
}

TEST(StepPlanner, TheRunningPlanStaysUnlessAnotherBeatsItByMoreThanTheSwitchGain) {
  // The first time is the running plan's.
  const std::vector<double> close{0.100, 0.098, 0.099};  // 2% faster: noise
  EXPECT_EQ(PlanTrials::keep_or_switch(close), 0u);
  const std::vector<double> faster{0.100, 0.099, 0.095};  // 5% faster
  EXPECT_EQ(PlanTrials::keep_or_switch(faster), 2u);
  const std::vector<double> slower{0.100, 0.120};
  EXPECT_EQ(PlanTrials::keep_or_switch(slower), 0u);
  const std::vector<double> just{0.100, 0.100 * (1.0 - plan_switch_gain)};  // not more than
  EXPECT_EQ(PlanTrials::keep_or_switch(just), 0u);
  expect_error(ErrorCode::invalid_argument, "keep_or_switch of no plans",
               [] { PlanTrials::keep_or_switch({}); });

  // shortlist_plans keeps the running plan first and does not time it twice.
  std::vector<TimedPlan> ranked{plan_with(1 << 20, 0), plan_with(1 << 20, 0),
                                plan_with(256 << 10, 0), plan_with(256 << 10, 1)};
  const std::vector<TimedPlan> shortlist = shortlist_plans(ranked, 3);
  ASSERT_EQ(shortlist.size(), 3u);
  EXPECT_EQ(shortlist[0].plan.bucket_cap_bytes, std::size_t{1} << 20);
  EXPECT_EQ(shortlist[1].plan.bucket_cap_bytes, std::size_t{256} << 10);
  EXPECT_EQ(shortlist[1].plan.collectives_in_flight, 0u);
  EXPECT_EQ(shortlist[2].plan.collectives_in_flight, 1u);
  EXPECT_EQ(shortlist_plans(ranked, 1).size(), 1u);
  EXPECT_TRUE(shortlist_plans({}, 3).empty());
}

TEST(StepPlanner, TrialsRunRoundRobinAndDecideOnSameRoundRatiosAfterTheFirstRound) {
  PlanTrials trials(3, 4);
  EXPECT_EQ(trials.plans(), 3u);
  // Round 1 is not counted (plan 2 looks fastest there). Over rounds 2-4 the host slows down
  // 2x and back; plan 1 runs 0.8x plan 0's step in every round, plan 2 1.1x.
  const double times[4][3] = {
      {0.9, 0.9, 0.1}, {0.5, 0.4, 0.55}, {1.0, 0.8, 1.1}, {0.6, 0.48, 0.66}};
  for (int round = 0; round < 4; ++round)
    for (std::size_t k = 0; k < 3; ++k) {
      EXPECT_FALSE(trials.done());
      EXPECT_EQ(trials.current(), k);
      EXPECT_EQ(trials.record(times[round][k]), (k + 1) % 3);
    }
  EXPECT_TRUE(trials.done());
  const std::vector<double> steps = trials.steps_s();
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_DOUBLE_EQ(steps[0], 0.6);        // plan 0's median over rounds 2-4
  EXPECT_DOUBLE_EQ(steps[1], 0.6 * 0.8);  // its same-round ratio, 0.8 in every round
  EXPECT_DOUBLE_EQ(steps[2], 0.6 * 1.1);
  EXPECT_EQ(PlanTrials::fastest(steps), 1u);
  expect_error(ErrorCode::invalid_argument, "every plan already ran its rounds",
               [&] { trials.record(0.1); });
  expect_error(ErrorCode::invalid_argument, "PlanTrials: an empty shortlist",
               [] { PlanTrials(0, 3); });
  expect_error(ErrorCode::invalid_argument, "at least 2 rounds (the first is not counted), got 1",
               [] { PlanTrials(1, 1); });
  expect_error(ErrorCode::invalid_argument, "steps_s before every plan ran its rounds",
               [] { (void)PlanTrials(1, 2).steps_s(); });
  expect_error(ErrorCode::invalid_argument, "PlanTrials::fastest of no plans",
               [] { (void)PlanTrials::fastest({}); });
  PlanTrials bad(2, 2);
  expect_error(ErrorCode::invalid_argument, "plan 0's run took -1", [&] { bad.record(-1.0); });
  expect_error(ErrorCode::invalid_argument, "a time is finite and not negative",
               [&] { bad.record(std::nan("")); });
  EXPECT_EQ(bad.current(), 0u);  // a refused time is not recorded
}

TEST(StepPlanner, TheHostsDriftBetweenRoundsDoesNotDecideTheTrials) {
  // Plan 1 runs 0.9x plan 0's step in two counted rounds of three, 1.1x in the third; the host
  // was 2x slower in the second round. Each plan's raw median (plan 0 0.6 s, plan 1 0.66 s)
  // would keep plan 0; the same-round ratios (0.9, 0.9, 1.1) give plan 1 0.9x.
  PlanTrials trials(2, 4);
  const double times[4][2] = {{1, 1}, {0.5, 0.45}, {1.0, 0.9}, {0.6, 0.66}};
  for (const auto& round : times)
    for (double t : round) trials.record(t);
  const std::vector<double> steps = trials.steps_s();
  EXPECT_DOUBLE_EQ(steps[0], 0.6);
  EXPECT_DOUBLE_EQ(steps[1], 0.6 * 0.9);
  EXPECT_EQ(PlanTrials::fastest(steps), 1u);

  // Two rounds: one counted, each plan's ratio in it is its step.
  PlanTrials two(2, 2);
  for (double t : {1.0, 1.0, 0.4, 0.3}) two.record(t);
  EXPECT_DOUBLE_EQ(two.steps_s()[0], 0.4);
  EXPECT_DOUBLE_EQ(two.steps_s()[1], 0.4 * (0.3 / 0.4));

  // A first plan timed at 0 s (a clock too coarse for the step) cannot divide: that round
  // counts as a tie, and the other rounds still decide.
  PlanTrials coarse(2, 4);
  for (double t : {1.0, 1.0, 0.0, 0.5, 0.2, 0.1, 0.2, 0.1}) coarse.record(t);
  const std::vector<double> got = coarse.steps_s();
  EXPECT_DOUBLE_EQ(got[0], 0.2);
  EXPECT_DOUBLE_EQ(got[1], 0.2 * 0.5);  // ratios 1 (the tie), 0.5, 0.5
  EXPECT_EQ(PlanTrials::fastest(got), 1u);
}

TEST(StepPlanner, EveryRankGetsRankZerosPlans) {
  std::vector<std::vector<TimedPlan>> got(3);
  LocalWorld::run(3, [&](Backend& backend) {
    // Every rank searched something different; rank 0's count.
    std::vector<TimedPlan> mine;
    for (int i = 0; i <= backend.rank(); ++i) {
      TimedPlan p = plan_with(std::size_t(1000 * (backend.rank() + 1) + i), std::size_t(i));
      p.buckets = 3;
      p.plan.issue_order = {2, 0, 1};
      p.predicted_step_s = 0.125 + backend.rank();
      p.measured_step_s = 1.0 / 3.0;
      mine.push_back(p);
    }
    got[backend.rank()] = agree_on_plans(backend, mine, std::chrono::seconds(20));
    // Rank 0 with nothing (its search failed): nothing on every rank.
    const auto none = agree_on_plans(backend, backend.rank() == 0 ? std::vector<TimedPlan>{} : mine,
                                     std::chrono::seconds(20));
    EXPECT_TRUE(none.empty()) << "rank " << backend.rank();
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(got[r].size(), 1u) << "rank " << r;
    const TimedPlan& p = got[r][0];
    EXPECT_EQ(p.plan.bucket_cap_bytes, 1000u);
    EXPECT_EQ(p.plan.issue_order, (std::vector<std::size_t>{2, 0, 1}));
    EXPECT_EQ(p.buckets, 3u);
    EXPECT_DOUBLE_EQ(p.predicted_step_s, 0.125);
    EXPECT_DOUBLE_EQ(p.measured_step_s, 1.0 / 3.0);  // bit-exact through the wire
  }
}

TEST(StepPlanner, AgreeOnRootNamesRanksWithAnotherLength) {
  std::vector<std::string> errors(3);
  LocalWorld::run(3, [&](Backend& backend) {
    const std::vector<std::int64_t> same = {7, 8, 9};
    const auto root = backend.agree_on_root(
        "test", backend.rank() == 0 ? same : std::vector<std::int64_t>{0, 0, 0},
        std::chrono::seconds(20),
        [&] { return "agreeing on rank " + std::to_string(backend.rank()); }, true);
    EXPECT_EQ(root, same) << "rank " << backend.rank();
    // Rank 2 holds 5 values, the others 3.
    const std::vector<std::int64_t> mine(backend.rank() == 2 ? 5 : 3, backend.rank());
    try {
      backend.agree_on_root(
          "test", mine, std::chrono::seconds(20),
          [&] { return "agreeing on rank " + std::to_string(backend.rank()); }, true);
      errors[backend.rank()] = "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::mismatch);
      errors[backend.rank()] = e.what();
    }
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(errors[r].find("agreeing on rank " + std::to_string(r) +
                             ": ranks hold between 3 and 5 values"),
              std::string::npos)
        << errors[r];
}

TEST(PlanSearch, BucketingsAreTheOneEnumerationEveryPlannerSearches) {
  constexpr std::size_t K = 1024, M = 1024 * 1024;
  PlanSearch search;
  search.caps_bytes = {1 * M, 4 * M};
  search.first_bucket_bytes = {256 * K, 2 * M};
  ReducerPlan base;
  base.collectives_in_flight = 2;
  base.issue_order = {1, 0};
  using Shape = std::tuple<std::size_t, std::size_t, bool>;
  auto shapes = [&](std::size_t largest) {
    std::vector<Shape> out;
    for (const ReducerPlan& p : search.bucketings(base, largest)) {
      EXPECT_EQ(p.collectives_in_flight, 2u);  // the rest of the base is kept
      EXPECT_TRUE(p.issue_order.empty());
      out.emplace_back(p.bucket_cap_bytes, p.first_bucket_bytes, p.partition_large);
    }
    return out;
  };
  // A 3 MiB gradient exceeds the 1 MiB cap only: partitioning is tried there alone.
  EXPECT_EQ(shapes(3 * M), (std::vector<Shape>{{M, M, false},
                                               {M, M, true},
                                               {M, 256 * K, false},
                                               {M, 256 * K, true},
                                               {4 * M, 4 * M, false},
                                               {4 * M, 256 * K, false},
                                               {4 * M, 2 * M, false}}));
  search.try_partition = false;
  EXPECT_EQ(shapes(3 * M).size(), 5u);
  search.caps_bytes.push_back(0);
  test::expect_error(ErrorCode::invalid_argument, "PlanSearch::bucketings: a bucket cap of 0 bytes",
                     [&] { shapes(M); });
}

TEST(PlanSearch, APlanCrossesTheWireInOneEncoding) {
  ReducerPlan plan;
  plan.bucket_cap_bytes = 3 << 20;
  plan.first_bucket_bytes = 1 << 18;
  plan.partition_large = true;
  plan.collectives_in_flight = 2;
  plan.priority = IssuePriority::forward;
  plan.wire_ratio = 0.37;
  plan.shard = ShardLevel::gradients;
  plan.issue_order = {2, 0, 1};
  std::vector<std::int64_t> wire;
  encode_plan(plan, wire);
  wire.push_back(42);
  ReducerPlan base;
  base.compression = Compression::bfloat16;  // not on the wire: the receiver's own
  base.ready_order = {1, 2, 0};
  PlanReader read(wire, "test");
  const ReducerPlan back = read.plan(base);
  EXPECT_TRUE(same_plan(back, plan)) << describe(back);
  EXPECT_EQ(back.wire_ratio, 0.37);
  EXPECT_EQ(back.shard, ShardLevel::gradients);
  EXPECT_EQ(back.compression, Compression::bfloat16);
  EXPECT_EQ(back.ready_order, base.ready_order);
  EXPECT_EQ(read.next(), 42);
  EXPECT_TRUE(read.done());
  test::expect_error(ErrorCode::mismatch, "test: rank 0's plans end after 12 values",
                     [&] { read.next(); });
  std::vector<std::int64_t> bad_shard = wire;
  bad_shard[6] = 7;
  test::expect_error(ErrorCode::mismatch, "shard: rank 0 sent shard level #7", [&] {
    PlanReader r(bad_shard, "shard");
    r.plan({});
  });
  std::vector<std::int64_t> cut(wire.begin(), wire.begin() + 9);  // the order's length, 1 entry
  test::expect_error(ErrorCode::mismatch, "cut: rank 0 sent an issue order of 3 buckets", [&] {
    PlanReader r(cut, "cut");
    r.plan({});
  });
  wire[4] = 7;
  test::expect_error(ErrorCode::mismatch, "bad: rank 0 sent priority #7", [&] {
    PlanReader r(wire, "bad");
    r.plan({});
  });
}

TEST(StepPlanner, TimingsCarryTaskIdsAndTheGraphSaysItsScheduleOrder) {
  Graph g;
  Task a = g.compute("a", [] {});
  Task low = g.compute("low", [] {}, {.priority = 0});
  Task high = g.compute("high", [] {}, {.priority = 5});
  a.precede(low);
  a.precede(high);
  // Among nodes ready together, higher priority first, then insertion order.
  EXPECT_EQ(g.topological_order(), (std::vector<std::size_t>{0, 2, 1}));
  Graph cyclic;
  Task x = cyclic.compute("x", [] {});
  Task y = cyclic.compute("y", [] {});
  x.precede(y);
  y.precede(x);
  expect_error(ErrorCode::graph_invalid, "cycle: 'x' -> 'y' -> 'x'",
               [&] { (void)cyclic.topological_order(); });

  LocalWorld::run(1, [&](Backend& backend) {
    ExecutorOptions o;
    o.profile = true;
    auto executor = Executor::compile(g, backend, o);
    EXPECT_GE(executor->workers(), 1);
    executor->run();
    const auto run = executor->last_run();
    ASSERT_EQ(run.size(), 3u);
    for (std::size_t i = 0; i < run.size(); ++i) {
      EXPECT_EQ(run[i].task, i);
      EXPECT_EQ(run[i].name, g.task(i).name());
    }
  });
}

}  // namespace
}  // namespace loom
