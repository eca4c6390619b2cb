// The reducer's step predicted from profiled steps: measurements of synthetic records checked
// against values worked out by hand (the client's compute clock, the update cost fit, the fitted
// wire), predictions of a hand-simulated step (wire-bound and compute-bound), the ranking, the
// automatic plan agreed from rank 0 on local ranks, and the named errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loom/error.hpp"
#include "loom/gradient_reducer.hpp"
#include "loom/local.hpp"
#include "loom/network_model.hpp"
#include "loom/reducer_prediction.hpp"
#include "loom/step_planner.hpp"

namespace loom {
namespace {

ExecutorOptions options(bool profile = false) {
  ExecutorOptions o;
  o.timeout = std::chrono::duration<double>(20);
  o.profile = profile;
  return o;
}

// Two parameters; registration order a, b; backward produces b first.
std::vector<ParameterSpec> two_parameters() {
  return {{"fc.weight", "fc", 1000}, {"out.weight", "out", 1000}};
}

ReducerPlan one_bucket() {
  ReducerPlan plan;
  plan.bucket_cap_bytes = std::size_t{1} << 20;
  plan.first_bucket_bytes = std::size_t{1} << 20;
  plan.ready_order = {1, 0};
  return plan;
}

NodeTiming timing(std::string name, NodeKind kind, double start_s, double end_s) {
  NodeTiming t;
  t.name = std::move(name);
  t.kind = kind;
  t.start_ns = static_cast<std::int64_t>(std::llround(start_s * 1e9));
  t.end_ns = static_cast<std::int64_t>(std::llround(end_s * 1e9));
  return t;
}

// One step of the one-bucket reducer, in seconds since begin(): out.weight handed over at 10 ms,
// fc.weight at 20 ms, the allreduce from 20 to 50 ms; the next forward enters the model at 26 ms
// and "fc" at 29 ms, whose pre-hook waits for the update until 50 ms and applies it until 54;
// the forward returns at 60 ms, the next step begins at 63.
ReducerStepRecord one_bucket_step() {
  ReducerStepRecord r;
  r.run = {timing("grad.out.weight", NodeKind::external, 0, 0.010),
           timing("grad.fc.weight", NodeKind::external, 0, 0.020),
           timing("bucket0.allreduce", NodeKind::collective, 0.020, 0.050),
           timing("bucket0.update", NodeKind::external, 0.050, 0.054)};
  ClientTimeline& t = r.client;
  t.waits = {{0.029, 0.050}};
  t.updates = {{0, {0.050, 0.054}}};
  t.forward = {{"", {}, 0.026, 0.026}, {"fc", {0}, 0.029, 0.054}};
  t.forward_end_s = 0.060;
  t.end_s = 0.063;
  return r;
}

TEST(PlanPrediction, MeasuresOnTheClientsComputeClock) {
  std::mutex mutex;
  ReducerMeasurements m;
  double modelled_wire = 0;
  LocalWorld::run(2, [&](Backend& backend) {
    GradientReducer reducer(two_parameters(), backend, one_bucket(), options());
    const std::vector<ReducerStepRecord> steps{one_bucket_step()};
    const ReducerMeasurements mine = measure_reducer_steps(reducer, steps, 0);
    if (backend.rank() != 0) return;
    std::lock_guard lock(mutex);
    m = mine;
    const NetworkModel wire = NetworkModel::from_link(m.link_bits_per_s, 0);
    modelled_wire = wire.collective(Collective::allreduce, 2000 * 4, 2).seconds;
  });
  ASSERT_EQ(m.ready_s.size(), 2u);
  EXPECT_EQ(m.ranks, 2);
  EXPECT_EQ(m.steps, 1u);
  EXPECT_NEAR(m.ready_s[1], 0.010, 1e-9);
  EXPECT_NEAR(m.ready_s[0], 0.020, 1e-9);
  EXPECT_NEAR(m.after_backward_s, 0.006, 1e-9);
  ASSERT_EQ(m.forward.size(), 2u);
  EXPECT_EQ(m.forward[1].module, "fc");
  EXPECT_EQ(m.forward[1].parameters, std::vector<std::size_t>{0});
  EXPECT_NEAR(m.forward[0].duration_s, 0.003, 1e-9);
  // 29 -> 60 ms less the wait and the update (29 -> 54): 6 ms of the module's own compute.
  EXPECT_NEAR(m.forward[1].duration_s, 0.006, 1e-9);
  EXPECT_NEAR(m.after_forward_s, 0.003, 1e-9);
  EXPECT_NEAR(m.step_s, 0.063, 1e-9);
  EXPECT_NEAR(m.wait_s, 0.021, 1e-9);
  EXPECT_NEAR(m.update_s, 0.004, 1e-9);
  EXPECT_NEAR(m.comm_s, 0.030, 1e-9);
  // One sample: no fit has two points, so the update costs its mean.
  EXPECT_NEAR(m.update.at(2, 2000), 0.004, 1e-9);
  // The wire is fitted so that the bucket's allreduce takes the 30 ms measured.
  EXPECT_GT(m.link_bits_per_s, 0);
  EXPECT_NEAR(modelled_wire, 0.030, 0.030 * 1e-4);
}

TEST(PlanPrediction, FitsTheUpdateCostPerTensorAndElement) {
  std::mutex mutex;
  LinearCost cost;
  LocalWorld::run(2, [&](Backend& backend) {
    ReducerPlan plan;
    plan.bucket_cap_bytes = 1024;  // one parameter per bucket: three update groups
    plan.first_bucket_bytes = 1024;
    std::vector<ParameterSpec> params{{"a", "m", 100}, {"b", "m", 300}, {"c", "m", 900}};
    GradientReducer reducer(params, backend, plan, options());
    ASSERT_EQ(reducer.num_update_groups(), 3u);
    ReducerStepRecord r;
    for (const ParameterSpec& p : params)
      r.run.push_back(timing("grad." + p.name, NodeKind::external, 0, 0.001));
    // Each group costs 0.5 ms + 2 us per element: 0.7, 1.1 and 2.3 ms.
    double at = 0.002;
    for (std::size_t k = 0; k < 3; ++k) {
      double elements = 0;
      for (std::size_t p : reducer.update_group(k))
        elements += static_cast<double>(reducer.parameter(p).count);
      const double d = 0.0005 + 2e-6 * elements;
      r.client.updates.push_back({k, {at, at + d}});
      at += d;
    }
    r.client.forward = {{"", {}, at, at}};
    r.client.forward_end_s = at + 0.001;
    r.client.end_s = at + 0.002;
    const std::vector<ReducerStepRecord> steps{r};
    const ReducerMeasurements m = measure_reducer_steps(reducer, steps);
    if (backend.rank() != 0) return;
    std::lock_guard lock(mutex);
    cost = m.update;
  });
  EXPECT_NEAR(cost.at(1, 100), 0.0007, 1e-9);
  EXPECT_NEAR(cost.at(1, 900), 0.0023, 1e-9);
  EXPECT_NEAR(cost.at(1, 5000), 0.0005 + 2e-6 * 5000, 1e-8);
}

// The hand-made measurements of one_bucket_step(): backward 10 + 10 ms, 5 ms after it, a
// forward of 3 ms (needs nothing) and 4 ms (needs fc.weight's update), 2 ms after it, each
// update 1 ms.
ReducerMeasurements hand_measurements(double link_bits_per_s) {
  ReducerMeasurements m;
  m.ranks = 2;
  m.steps = 1;
  m.ready_s = {0.020, 0.010};
  m.after_backward_s = 0.005;
  m.forward = {{"", {}, 0.003}, {"fc", {0}, 0.004}};
  m.after_forward_s = 0.002;
  m.update.a = 0.001;
  m.link_bits_per_s = link_bits_per_s;
  m.latency_s = 0;
  m.step_s = 0.050;
  return m;
}

TEST(PlanPrediction, SimulatesAWireBoundAndAComputeBoundStep) {
  std::mutex mutex;
  std::vector<PlanPrediction> got;
  std::vector<double> wire;
  LocalWorld::run(2, [&](Backend& backend) {
    GradientReducer reducer(two_parameters(), backend, one_bucket(), options());
    for (double link : {2e6, 200e6}) {
      const ReducerMeasurements m = hand_measurements(link);
      const PlanPrediction p = predict_reducer_step(reducer, m, reducer.plan());
      if (backend.rank() != 0) continue;
      std::lock_guard lock(mutex);
      got.push_back(p);
      wire.push_back(
          NetworkModel::from_link(link, 0).collective(Collective::allreduce, 8000, 2).seconds);
    }
  });
  ASSERT_EQ(got.size(), 2u);
  // Slow wire: the allreduce starts at 20 ms, the update follows it, then the forward's second
  // part and the 2 ms after it: 20 + wire + 1 + 4 + 2.
  ASSERT_GT(wire[0], 0.010);
  EXPECT_NEAR(got[0].step_s, 0.020 + wire[0] + 0.007, 1e-9);
  EXPECT_NEAR(got[0].wire_s, wire[0], 1e-12);
  EXPECT_NEAR(got[0].wait_s, got[0].step_s - 0.035, 1e-9);
  EXPECT_NEAR(got[0].exposed_s, wire[0] - 0.008, 1e-9);  // 20 -> 28 ms hidden
  EXPECT_NEAR(got[0].backward_s, 0.020, 1e-12);
  EXPECT_NEAR(got[0].forward_s, 0.007, 1e-12);
  EXPECT_NEAR(got[0].other_s, 0.007, 1e-12);
  EXPECT_NEAR(got[0].update_s, 0.001, 1e-12);
  EXPECT_EQ(got[0].buckets, 1u);
  EXPECT_NEAR(got[0].measured_step_s, 0.050, 1e-12);
  // Fast wire: the update waits for the 5 ms after backward and the forward's first part
  // (which outranks it), then runs before the part that needs it: no waiting, 35 ms.
  ASSERT_LT(wire[1], 0.005);
  EXPECT_NEAR(got[1].step_s, 0.035, 1e-9);
  EXPECT_NEAR(got[1].wait_s, 0, 1e-9);
  EXPECT_NEAR(got[1].exposed_s, 0, 1e-9);
}

TEST(PlanPrediction, PredictsTheMeasuredStepOfItsOwnRecords) {
  // The records' own step replayed: backward to 20 ms, the allreduce on the fitted wire to 50,
  // the 6 ms after backward and the model's 3 ms meanwhile, the update to 54, the part of the
  // forward that needs it to 60 and the rest to 63: as measured.
  std::mutex mutex;
  PlanPrediction p;
  LocalWorld::run(2, [&](Backend& backend) {
    GradientReducer reducer(two_parameters(), backend, one_bucket(), options());
    // The second step's period is 10x: something else ran before the next step; left out.
    ReducerStepRecord interrupted = one_bucket_step();
    interrupted.client.end_s = 0.630;
    const std::vector<ReducerStepRecord> steps{one_bucket_step(), interrupted, one_bucket_step()};
    const ReducerMeasurements m = measure_reducer_steps(reducer, steps, 0);
    EXPECT_EQ(m.steps, 2u);
    const PlanPrediction mine = predict_reducer_step(reducer, m, reducer.plan());
    if (backend.rank() != 0) return;
    std::lock_guard lock(mutex);
    p = mine;
  });
  EXPECT_NEAR(p.step_s, 0.063, 1e-6);
  EXPECT_NEAR(p.measured_step_s, 0.063, 1e-9);
  EXPECT_NEAR(p.wait_s, 0.021, 1e-6);
  EXPECT_NEAR(p.wire_s, 0.030, 1e-6);
  EXPECT_EQ(p.profile.workers, 1);
  EXPECT_EQ(p.profile.ranks, 2);
}

// Twelve layers of 64 KiB in one 64 MiB bucket, handed over in reverse 5 ms apart, a wire
// measured at 100 ms for all of them.
std::vector<ParameterSpec> twelve_layers() {
  std::vector<ParameterSpec> params;
  for (int l = 0; l < 12; ++l)
    params.push_back(
        {"layers." + std::to_string(l) + ".weight", "layers." + std::to_string(l), 16384});
  return params;
}

// Every gradient in one bucket: a 64 MiB cap and first bucket.
ReducerPlan one_64_mib_bucket() {
  ReducerPlan plan;
  plan.bucket_cap_bytes = std::size_t{64} << 20;
  plan.first_bucket_bytes = std::size_t{64} << 20;
  return plan;
}

ReducerStepRecord twelve_layer_step(const std::vector<ParameterSpec>& params) {
  ReducerStepRecord r;
  for (int l = 0; l < 12; ++l)
    r.run.push_back(timing("grad." + params[l].name, NodeKind::external, 0,
                           0.005 * static_cast<double>(12 - l)));
  r.run.push_back(timing("bucket0.allreduce", NodeKind::collective, 0.060, 0.160));
  r.client.updates = {{0, {0.160, 0.162}}};
  r.client.waits = {{0.062, 0.160}};
  for (int l = 0; l < 12; ++l)
    r.client.forward.push_back(
        {params[l].module, {static_cast<std::size_t>(l)}, 0.162 + 0.002 * l, 0.162 + 0.002 * l});
  r.client.forward_end_s = 0.186;
  r.client.end_s = 0.190;
  return r;
}

TEST(PlanPrediction, RanksPlansAndAgreesOnRankZerosChoice) {
  std::mutex mutex;
  std::vector<ReducerPlan> plans;
  std::vector<PlanDecision> decided;
  std::vector<double> ranked_first;
  std::vector<double> ranked_current;
  std::vector<std::size_t> ranked_count;
  LocalWorld::run(2, [&](Backend& backend) {
    // Twelve layers of 64 KiB, handed over in reverse 5 ms apart, and a wire measured at 100 ms
    // for all of them: the one-bucket plan exposes the whole allreduce; smaller buckets start
    // it during the backward.
    const std::vector<ParameterSpec> params = twelve_layers();
    GradientReducer reducer(params, backend, one_64_mib_bucket(), options());
    std::vector<ReducerStepRecord> steps{twelve_layer_step(params)};
    if (backend.rank() != 0) steps.clear();  // rank 0 decides: the others need no records
    PlanSearch search = PlanSearch::for_gradient_reducer();
    search.caps_bytes = {std::size_t{128} << 10, std::size_t{256} << 10, std::size_t{1} << 20};
    search.first_bucket_bytes = {std::size_t{64} << 10};
    std::vector<PlanPrediction> ranked;
    if (backend.rank() == 0)
      ranked = rank_plans(reducer, measure_reducer_steps(reducer, steps), search);
    const PlanDecision chosen = choose_reducer_plan(reducer, steps, search);
    std::lock_guard lock(mutex);
    plans.push_back(reducer.plan());
    decided.push_back(chosen);
    if (backend.rank() == 0) {
      ranked_first.push_back(ranked.front().step_s);
      ranked_count.push_back(ranked.size());
      for (const PlanPrediction& p : ranked)
        if (p.plan.bucket_cap_bytes == (std::size_t{64} << 20) &&
            p.plan.collectives_in_flight == 0 && !p.plan.partition_large &&
            p.plan.first_bucket_bytes == p.plan.bucket_cap_bytes)
          ranked_current.push_back(p.step_s);
    }
  });
  ASSERT_EQ(plans.size(), 2u);
  ASSERT_EQ(ranked_first.size(), 1u);
  EXPECT_EQ(describe(plans[0]), describe(plans[1]));
  EXPECT_EQ(plans[0].priority, plans[1].priority);
  EXPECT_EQ(plans[0].wire_ratio, plans[1].wire_ratio);
  EXPECT_NE(plans[0].bucket_cap_bytes, std::size_t{64} << 20);  // a smaller cap won
  for (const PlanDecision& a : decided) {
    EXPECT_EQ(a.candidates, ranked_count[0]);
    EXPECT_DOUBLE_EQ(a.predicted_step_s, ranked_first[0]);
    EXPECT_NEAR(a.measured_step_s, 0.190, 1e-9);
    EXPECT_LT(a.predicted_step_s, a.current_predicted_step_s);
    EXPECT_TRUE(a.changed);
  }
  ASSERT_FALSE(ranked_current.empty());
  EXPECT_DOUBLE_EQ(decided[0].current_predicted_step_s, ranked_current[0]);
}

// A plan's memory per rank, worked out by hand for 2 x 1000 float32 parameters on 2 ranks in
// one bucket, Adam's 8 bytes of state per element.
TEST(PlanMemory, ParametersBucketsShardsAndStateByShardLevel) {
  LocalWorld::run(2, [&](Backend& backend) {
    GradientReducer reducer(two_parameters(), backend, one_bucket(), options());
    PlanSearch search;
    search.state_bytes_per_element = 8;
    search.activation_bytes = 1000;
    ReducerPlan plan = one_bucket();
    const PlanMemory none = plan_memory(reducer, plan, search);
    EXPECT_EQ(none.parameters, 8000u);  // the model's own memory
    EXPECT_EQ(none.gradients, 8192u);   // the pool's size class of the 8000-byte arena
    EXPECT_EQ(none.shards, 0u);
    EXPECT_EQ(none.optimizer_state, 16000u);
    EXPECT_EQ(none.activations, 1000u);
    EXPECT_EQ(none.total(), 8000u + 8192 + 16000 + 1000);
    plan.shard = ShardLevel::optimizer;
    const PlanMemory zero1 = plan_memory(reducer, plan, search);
    EXPECT_EQ(zero1.parameters, 8192u);  // loom's memory, whole pages
    EXPECT_EQ(zero1.gradients, 8192u);
    EXPECT_EQ(zero1.shards, 4096u);           // the shard (4000 bytes)
    EXPECT_EQ(zero1.optimizer_state, 8000u);  // half the elements
    plan.shard = ShardLevel::gradients;
    const PlanMemory zero2 = plan_memory(reducer, plan, search);
    EXPECT_EQ(zero2.gradients, 8192u);  // every bucket resident (not simulated)
    EXPECT_EQ(zero2.shards, 4096u);     // one shard: the average's, then the all-gather's
    EXPECT_EQ(zero2.optimizer_state, 8000u);
    EXPECT_EQ(describe(zero2),
              "parameters 8 KiB + gradients 8 KiB + shards 4 KiB + optimizer state 8 KiB + "
              "activations 1000 B = 29 KiB");
  });
}

// Sharded plans are predicted with their own collectives (reduce-scatters, and all-gathers
// after the updates), and a budget keeps plans over it from being chosen.
TEST(PlanPrediction, ShardedPlansAreSimulatedAndABudgetFiltersThem) {
  std::mutex mutex;
  std::vector<ReducerPlan> chosen_plans;
  LocalWorld::run(2, [&](Backend& backend) {
    const std::vector<ParameterSpec> params = twelve_layers();
    GradientReducer reducer(params, backend, one_64_mib_bucket(), options());
    std::vector<ReducerStepRecord> steps{twelve_layer_step(params)};
    if (backend.rank() != 0) steps.clear();
    PlanSearch search = PlanSearch::for_gradient_reducer();
    search.caps_bytes = {std::size_t{256} << 10, std::size_t{1} << 20};
    search.first_bucket_bytes = {};
    search.shard_levels = {ShardLevel::none, ShardLevel::optimizer, ShardLevel::gradients};
    search.state_bytes_per_element = 8;
    if (backend.rank() == 0) {
      const ReducerMeasurements m = measure_reducer_steps(reducer, steps);
      for (ShardLevel level : {ShardLevel::optimizer, ShardLevel::gradients}) {
        ReducerPlan plan = one_64_mib_bucket();
        plan.shard = level;
        const PlanPrediction p = predict_reducer_step(reducer, m, plan, search);
        std::size_t gathers = 0, scatters = 0, allreduces = 0;
        for (const ProfiledNode& node : p.profile.nodes) {
          if (node.kind != NodeKind::collective) continue;
          gathers += node.op == Collective::allgather;
          scatters += node.op == Collective::reduce_scatter;
          allreduces += node.op == Collective::allreduce;
        }
        EXPECT_EQ(gathers, p.buckets);
        EXPECT_EQ(scatters, p.buckets);
        EXPECT_EQ(allreduces, 0u);
        EXPECT_GT(p.step_s, 0);
      }
      // Without a budget every level is ranked; with one below every unsharded plan, the
      // fitting (sharded) plans come first.
      const std::vector<PlanPrediction> all = rank_plans(reducer, m, search);
      std::size_t levels[3] = {0, 0, 0};
      for (const PlanPrediction& p : all) ++levels[static_cast<int>(p.plan.shard)];
      EXPECT_GT(levels[0], 0u);
      EXPECT_EQ(levels[1], levels[2]);
      std::size_t unsharded_least = SIZE_MAX;
      for (const PlanPrediction& p : all)
        if (p.plan.shard == ShardLevel::none)
          unsharded_least = std::min(unsharded_least, p.memory.total());
      search.memory_budget_bytes = unsharded_least - 1;
      const std::vector<PlanPrediction> budgeted = rank_plans(reducer, m, search);
      ASSERT_TRUE(budgeted.front().fits);
      bool over = false;
      for (const PlanPrediction& p : budgeted) {
        if (!p.fits) over = true;
        EXPECT_FALSE(over && p.fits) << "a fitting plan ranked after one over the budget";
        EXPECT_EQ(p.fits, p.memory.total() <= search.memory_budget_bytes);
        if (p.fits) EXPECT_NE(p.plan.shard, ShardLevel::none);
      }
    }
    // Every rank agrees on rank 0's choice, which fits.
    if (backend.rank() == 0) {
      const ReducerMeasurements m = measure_reducer_steps(reducer, steps);
      std::size_t least = SIZE_MAX;
      for (const PlanPrediction& p : rank_plans(reducer, m, search))
        if (p.plan.shard == ShardLevel::none) least = std::min(least, p.memory.total());
      search.memory_budget_bytes = least - 1;
    }
    std::vector<std::int64_t> budget{static_cast<std::int64_t>(search.memory_budget_bytes)};
    budget = backend.agree_on_root("test budget", budget, std::chrono::seconds(20),
                                   [] { return std::string("test"); });
    search.memory_budget_bytes = static_cast<std::size_t>(budget[0]);
    choose_reducer_plan(reducer, steps, search);
    std::lock_guard lock(mutex);
    chosen_plans.push_back(reducer.plan());
  });
  ASSERT_EQ(chosen_plans.size(), 2u);
  EXPECT_NE(chosen_plans[0].shard, ShardLevel::none);
  EXPECT_TRUE(same_plan(chosen_plans[0], chosen_plans[1]));
}

TEST(PlanPrediction, ShortlistIsTimedAndRankZerosStepsDecide) {
  // 3 ranks: rank 0 shortlists; each plan then "runs" (replanned to) in turn for 3 rounds, and
  // each rank records its own times: rank 0's say plan 1 is fastest, the others' that plan 0
  // is. Every rank must end on plan 1, with rank 0's steps.
  std::mutex mutex;
  std::vector<std::string> described, running, firsts;
  std::vector<PlanDecision> decided;
  std::vector<std::size_t> lengths;
  std::vector<ErrorCode> mismatches;
  std::string refused;
  LocalWorld::run(3, [&](Backend& backend) {
    const std::vector<ParameterSpec> params = twelve_layers();
    GradientReducer reducer(params, backend, one_64_mib_bucket(), options());
    std::vector<ReducerStepRecord> steps{twelve_layer_step(params)};
    if (backend.rank() != 0) steps.clear();
    PlanSearch search = PlanSearch::for_gradient_reducer();
    search.caps_bytes = {std::size_t{128} << 10, std::size_t{256} << 10, std::size_t{1} << 20};
    search.first_bucket_bytes = {std::size_t{64} << 10};
    const PlanShortlist list = shortlist_reducer_plans(reducer, steps, search, 3);
    const std::string first = describe(list.plans.front().plan);
    const std::string before = describe(reducer.plan());
    PlanTrials trials(list.plans.size(), 3);
    for (std::size_t run = 0; !trials.done(); ++run) {
      const std::size_t k = trials.current();
      // Rounds after the first: rank 0 times plan 1 at 0.1 s and the rest at 0.2 s; the others
      // time plan 0 fastest. The first round is not counted (its 0.01 s for plan 2 is noise).
      double t = 0.2;
      if (backend.rank() == 0 ? k == 1 : k == 0) t = 0.1;
      if (k == 2 && run < list.plans.size() && backend.rank() == 0) t = 0.01;
      const std::size_t next = trials.record(t);
      if (!trials.done()) reducer.replan(list.plans[next].plan);
    }
    const PlanDecision chosen = decide_reducer_plan(reducer, list, trials.steps_s());
    // A rank holding a shorter shortlist than rank 0's: mismatch, named on every rank.
    PlanShortlist shorter = list;
    if (backend.rank() == 2) shorter.plans.pop_back();
    std::vector<double> times(shorter.plans.size(), 0.1);
    ErrorCode code = ErrorCode::internal;
    try {
      decide_reducer_plan(reducer, shorter, times);
    } catch (const Error& e) {
      code = e.code();
    }
    std::string no_keep;
    try {
      shortlist_reducer_plans(reducer, steps, search, 0);
    } catch (const Error& e) {
      no_keep = e.what();
    }
    std::lock_guard lock(mutex);
    described.push_back(describe(reducer.plan()));
    running.push_back(before);
    firsts.push_back(first);
    decided.push_back(chosen);
    lengths.push_back(list.plans.size());
    mismatches.push_back(code);
    if (backend.rank() == 0) refused = no_keep;
  });
  ASSERT_EQ(decided.size(), 3u);
  ASSERT_EQ(lengths[0], 3u);  // the running plan and two predicted faster
  for (std::size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(lengths[r], lengths[0]);
    EXPECT_EQ(firsts[r], running[r]) << "the running plan is shortlisted first";
    const PlanDecision& a = decided[r];
    ASSERT_EQ(a.timed.size(), 3u);
    EXPECT_DOUBLE_EQ(a.timed[0].measured_step_s, 0.2);
    EXPECT_DOUBLE_EQ(a.timed[1].measured_step_s, 0.1);
    EXPECT_DOUBLE_EQ(a.timed[2].measured_step_s, 0.2);
    EXPECT_TRUE(a.changed);
    EXPECT_EQ(describe(a.plan), describe(a.timed[1].plan));
    EXPECT_EQ(described[r], describe(a.timed[1].plan));
    EXPECT_DOUBLE_EQ(a.predicted_step_s, a.timed[1].predicted_step_s);
    EXPECT_LT(a.timed[1].predicted_step_s, a.timed[0].predicted_step_s);
    EXPECT_LT(a.timed[2].predicted_step_s, a.timed[0].predicted_step_s);
    EXPECT_DOUBLE_EQ(a.current_predicted_step_s, a.timed[0].predicted_step_s);
    EXPECT_NEAR(a.measured_step_s, 0.190, 1e-9);
    EXPECT_EQ(mismatches[r], ErrorCode::mismatch) << "rank " << r;
  }
  EXPECT_NE(refused.find("keep must be at least 1"), std::string::npos) << refused;
}

TEST(PlanPrediction, APlanReplacesTheRunningOneOnlyForAGainAboveNoise) {
  // Two ranks, rank 0's times decide: 1% faster keeps the running plan (the trials cannot tell
  // it apart); 10% faster replaces it.
  std::mutex mutex;
  std::vector<PlanDecision> close, clear;
  std::vector<std::string> before, after;
  LocalWorld::run(2, [&](Backend& backend) {
    const std::vector<ParameterSpec> params = twelve_layers();
    GradientReducer reducer(params, backend, one_64_mib_bucket(), options());
    std::vector<ReducerStepRecord> steps{twelve_layer_step(params)};
    PlanSearch space = PlanSearch::for_gradient_reducer();
    space.caps_bytes = {std::size_t{128} << 10, std::size_t{256} << 10, std::size_t{1} << 20};
    space.first_bucket_bytes = {std::size_t{64} << 10};
    const PlanShortlist list = shortlist_reducer_plans(reducer, steps, space, 2);
    const std::string running = describe(reducer.plan());
    const PlanDecision a = decide_reducer_plan(reducer, list, std::vector<double>{0.100, 0.099});
    const std::string kept = describe(reducer.plan());
    const PlanDecision b = decide_reducer_plan(reducer, list, std::vector<double>{0.100, 0.090});
    std::lock_guard lock(mutex);
    close.push_back(a);
    clear.push_back(b);
    before.push_back(running);
    after.push_back(kept);
  });
  ASSERT_EQ(close.size(), 2u);
  for (std::size_t r = 0; r < 2; ++r) {
    ASSERT_EQ(close[r].timed.size(), 2u);
    EXPECT_FALSE(close[r].changed);
    EXPECT_EQ(after[r], before[r]) << "a 1% gain must not replace the running plan";
    EXPECT_TRUE(clear[r].changed);
    EXPECT_EQ(describe(clear[r].plan), describe(clear[r].timed[1].plan));
  }
}

TEST(PlanPrediction, NothingPredictedFasterShortlistsOnlyTheRunningPlan) {
  std::mutex mutex;
  std::vector<std::size_t> lengths;
  LocalWorld::run(2, [&](Backend& backend) {
    const std::vector<ParameterSpec> params = twelve_layers();
    GradientReducer reducer(params, backend, one_64_mib_bucket(), options());
    std::vector<ReducerStepRecord> steps{twelve_layer_step(params)};
    // Only the running plan's cap is searched, without partitioning or a collective limit.
    PlanSearch search = PlanSearch::for_gradient_reducer();
    search.caps_bytes = {std::size_t{64} << 20};
    search.first_bucket_bytes = {};
    search.max_in_flight = 0;
    search.shortlist_margin = 1.0;  // only plans predicted faster
    const PlanShortlist list = shortlist_reducer_plans(reducer, steps, search, 3);
    std::lock_guard lock(mutex);
    lengths.push_back(list.plans.size());
  });
  EXPECT_EQ(lengths, (std::vector<std::size_t>{1, 1}));
}

TEST(PlanPrediction, TheMarginShortlistsPlansPredictedSlightlySlowerAndNoFurther) {
  // With margin 1 only plans predicted faster than the running one (one 64 MiB bucket) are
  // timed; with a wide margin also those predicted slower, each within it. A margin below 1 is
  // refused.
  std::mutex mutex;
  std::vector<PlanShortlist> strict, loose;
  std::vector<std::string> refused;
  LocalWorld::run(2, [&](Backend& backend) {
    const std::vector<ParameterSpec> params = twelve_layers();
    GradientReducer reducer(params, backend, one_64_mib_bucket(), options());
    // Every gradient handed over within 12 us: no backward left to overlap, so more buckets
    // only add messages and the running single bucket is predicted fastest.
    ReducerStepRecord step = twelve_layer_step(params);
    for (int l = 0; l < 12; ++l) step.run[static_cast<std::size_t>(l)].end_ns = 1000 * (12 - l);
    std::vector<ReducerStepRecord> steps{step};
    PlanSearch search = PlanSearch::for_gradient_reducer();
    search.caps_bytes = {std::size_t{128} << 10, std::size_t{256} << 10, std::size_t{64} << 20};
    search.first_bucket_bytes = {};
    search.max_in_flight = 0;
    search.shortlist_margin = 1.0;
    PlanShortlist a = shortlist_reducer_plans(reducer, steps, search, 50);
    search.shortlist_margin = 100.0;
    PlanShortlist b = shortlist_reducer_plans(reducer, steps, search, 50);
    search.shortlist_margin = 0.9;
    std::string message;
    try {
      shortlist_reducer_plans(reducer, steps, search, 3);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::invalid_argument) message = e.what();
    }
    std::lock_guard lock(mutex);
    strict.push_back(std::move(a));
    loose.push_back(std::move(b));
    refused.push_back(message);
  });
  ASSERT_EQ(strict.size(), 2u);
  for (std::size_t r = 0; r < 2; ++r) {
    const double running = strict[r].plans.front().predicted_step_s;
    for (std::size_t k = 1; k < strict[r].plans.size(); ++k)
      EXPECT_LT(strict[r].plans[k].predicted_step_s, running);
    // A wide margin also times the plans predicted slower than the running one (each within
    // it), and every plan the strict margin timed.
    EXPECT_GT(loose[r].plans.size(), strict[r].plans.size());
    bool slower = false;
    for (const TimedPlan& t : loose[r].plans) {
      EXPECT_LE(t.predicted_step_s, 100.0 * running);
      slower = slower || t.predicted_step_s >= running;
    }
    EXPECT_TRUE(slower);
    for (const TimedPlan& t : strict[r].plans) {
      const bool timed =
          std::any_of(loose[r].plans.begin(), loose[r].plans.end(),
                      [&](const TimedPlan& u) { return describe(u.plan) == describe(t.plan); });
      EXPECT_TRUE(timed) << describe(t.plan);
    }
    EXPECT_EQ(describe(loose[r].plans.front().plan), describe(strict[r].plans.front().plan));
    EXPECT_NE(refused[r].find("shortlist_margin must be a finite factor >= 1"), std::string::npos)
        << refused[r];
  }
}

TEST(PlanPrediction, BadRecordsAreNamedErrors) {
  std::mutex mutex;
  std::vector<std::string> messages;
  LocalWorld::run(2, [&](Backend& backend) {
    GradientReducer reducer(two_parameters(), backend, one_bucket(), options());
    auto message = [&](std::vector<ReducerStepRecord> steps) {
      try {
        measure_reducer_steps(reducer, steps);
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
        return std::string(e.what());
      }
      return std::string("no error");
    };
    std::vector<std::string> mine;
    mine.push_back(message({}));
    ReducerStepRecord no_run = one_bucket_step();
    no_run.run.clear();
    mine.push_back(message({no_run}));
    ReducerStepRecord no_forward = one_bucket_step();
    no_forward.client.forward.clear();
    mine.push_back(message({no_forward}));
    ReducerStepRecord bad_group = one_bucket_step();
    bad_group.client.updates[0].first = 7;
    mine.push_back(message({bad_group}));
    ReducerStepRecord lost = one_bucket_step();
    lost.run.erase(lost.run.begin());
    mine.push_back(message({lost}));
    ReducerStepRecord short_times = one_bucket_step();
    short_times.handed_over_s = {0.01};
    mine.push_back(message({short_times}));
    // rank 1 fails to plan on rank 0's failure too
    std::string automatic = "no error";
    try {
      choose_reducer_plan(reducer, std::vector<ReducerStepRecord>{});
    } catch (const Error& e) {
      automatic = e.what();
    }
    mine.push_back(automatic);
    if (backend.rank() == 0) {
      std::lock_guard lock(mutex);
      messages = mine;
    } else if (automatic.find("rank 0 could not predict") == std::string::npos) {
      std::lock_guard lock(mutex);
      messages.push_back("rank 1: " + automatic);
    }
  });
  ASSERT_EQ(messages.size(), 7u) << (messages.empty() ? "" : messages.back());
  EXPECT_NE(messages[0].find("no profiled step"), std::string::npos) << messages[0];
  EXPECT_NE(messages[1].find("has no profiled run (profiling is off"), std::string::npos)
      << messages[1];
  EXPECT_NE(messages[2].find("has no forward"), std::string::npos) << messages[2];
  EXPECT_NE(messages[3].find("update group #7 of 1"), std::string::npos) << messages[3];
  EXPECT_NE(messages[4].find("the gradient of 'out.weight' has no time"), std::string::npos)
      << messages[4];
  EXPECT_NE(messages[5].find("has 1 hand-over times for 2 parameters"), std::string::npos)
      << messages[5];
  EXPECT_NE(messages[6].find("no profiled step"), std::string::npos) << messages[6];
}

TEST(PlanPrediction, MeasuresARealProfiledRun) {
  // A real run: gradients handed over in a fixed order by another thread, every update waited
  // for and applied; the measured ready order is the hand-over order, the step's parts add up.
  std::mutex mutex;
  ReducerMeasurements m;
  PlanPrediction p;
  LocalWorld::run(2, [&](Backend& backend) {
    ReducerPlan plan;
    plan.bucket_cap_bytes = 4096;
    plan.first_bucket_bytes = 1024;
    const std::vector<ParameterSpec> params{{"a", "x", 500}, {"b", "x", 700}, {"c", "y", 900}};
    GradientReducer reducer(params, backend, plan, options(true));
    std::vector<std::vector<float>> grads;
    for (const ParameterSpec& s : params) grads.emplace_back(s.count, 1.0f);
    std::vector<ReducerStepRecord> steps;
    using clock = std::chrono::steady_clock;
    auto since = [](clock::time_point t0) {
      return std::chrono::duration<double>(clock::now() - t0).count();
    };
    for (int s = 0; s < 4; ++s) {
      ReducerStepRecord r;
      const clock::time_point begun = clock::now();
      reducer.begin();
      for (std::size_t q : {2, 1, 0}) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        reducer.ready(q, Buffer::of(std::span(grads[q])));
      }
      for (std::size_t k = 0; k < reducer.num_update_groups(); ++k) {
        const double w = since(begun);
        reducer.wait_update(k);
        const double a = since(begun);
        r.client.waits.push_back({w, a});
        reducer.updated(k);
        r.client.updates.push_back({k, {a, since(begun)}});
      }
      r.client.forward = {{"", {0, 1, 2}, since(begun), since(begun)}};
      r.client.forward_end_s = since(begun);
      const double w = since(begun);
      reducer.finish();
      r.client.waits.push_back({w, since(begun)});
      r.run = reducer.executor().last_run();
      r.handed_over_s = reducer.handed_over_seconds();
      r.client.end_s = since(begun);
      steps.push_back(std::move(r));
    }
    const ReducerMeasurements mine = measure_reducer_steps(reducer, steps);
    const PlanPrediction predicted = predict_reducer_step(reducer, mine, reducer.plan());
    if (backend.rank() != 0) return;
    std::lock_guard lock(mutex);
    m = mine;
    p = predicted;
  });
  ASSERT_EQ(m.ready_s.size(), 3u);
  // At least the 3 of 4 periods up to the median are kept (the longer ones may be dropped as
  // interrupted on a loaded host).
  EXPECT_GE(m.steps, 3u);
  EXPECT_LE(m.steps, 4u);
  EXPECT_LT(m.ready_s[2], m.ready_s[1]);
  EXPECT_LT(m.ready_s[1], m.ready_s[0]);
  EXPECT_GE(m.ready_s[2], 0.002);  // each hand-over after a 2 ms sleep
  EXPECT_GE(m.ready_s[0] - m.ready_s[2], 0.004);
  EXPECT_GT(m.comm_s, 0);
  EXPECT_GT(m.link_bits_per_s, 0);
  EXPECT_GE(p.step_s, m.ready_s[0]);
  EXPECT_NEAR(p.backward_s, m.ready_s[0], 1e-12);
  EXPECT_NEAR(p.step_s, p.backward_s + p.forward_s + p.other_s + p.update_s + p.wait_s, 1e-9);
}

}  // namespace
}  // namespace loom
