// TrainStep (examples/train_step) on local ranks: the loss decreases; after N steps every
// rank's weights are bit-identical, equal across overlap modes and bucket layouts, and match
// one process training on the whole batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "loom/cuda_device.hpp"
#include "loom/error.hpp"
#include "loom/local.hpp"
#include "train_step.hpp"

namespace loom::examples {
namespace {

using test::expect_error;

constexpr int steps = 6;

TrainConfig small_model() {
  TrainConfig c;
  c.shape = {.input = 12, .width = 40, .output = 5, .depth = 4, .batch = 7, .seed = 11};
  c.learning_rate = 0.1f;
  // Small caps so the step has several buckets (and split gradients when asked).
  c.bucketing.bucket_cap_bytes = 2048;
  c.bucketing.first_bucket_bytes = 512;
  return c;
}

struct Result {
  std::vector<std::vector<float>> parameters;  // per rank
  std::vector<float> losses;                   // rank 0, per step
  std::size_t buckets = 0;
};

Result train(int ranks, const TrainConfig& config, int rebuild_after = -1) {
  Result result;
  result.parameters.resize(ranks);
  std::mutex mutex;
  LocalWorld::run(ranks, [&](Backend& backend) {
    TrainConfig c = config;
    c.executor.profile = rebuild_after >= 0;
    TrainStep step(backend, c);
    for (int s = 0; s < steps; ++s) {
      step.run();
      if (backend.rank() == 0) result.losses.push_back(step.loss());
      if (s == rebuild_after) step.rebuild_buckets();
    }
    std::lock_guard lock(mutex);
    result.parameters[backend.rank()] = step.parameters();
    if (backend.rank() == 0) result.buckets = step.bucketer().buckets().size();
  });
  return result;
}

// The whole data set (batch x ranks samples) in one process.
std::vector<float> single_process(const TrainConfig& config, int ranks) {
  TrainConfig c = config;
  c.shape.batch *= ranks;
  return train(1, c).parameters[0];
}

void expect_bit_identical(const Result& r) {
  for (std::size_t k = 1; k < r.parameters.size(); ++k) {
    ASSERT_EQ(r.parameters[k].size(), r.parameters[0].size());
    EXPECT_EQ(std::memcmp(r.parameters[k].data(), r.parameters[0].data(),
                          r.parameters[0].size() * sizeof(float)),
              0)
        << "rank " << k << " differs from rank 0";
  }
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  int far = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::fabs(got[i] - want[i]) > 1e-5f + 1e-4f * std::fabs(want[i])) ++far;
  EXPECT_EQ(far, 0) << far << " of " << got.size() << " parameters differ";
}

TEST(TrainStep, LossDecreasesEveryStep) {
  const Result r = train(2, small_model());
  ASSERT_EQ(r.losses.size(), static_cast<std::size_t>(steps));
  for (int s = 1; s < steps; ++s) EXPECT_LT(r.losses[s], r.losses[s - 1]) << "step " << s;
  EXPECT_LT(r.losses.back(), 0.9f * r.losses.front());
}

struct Case {
  int ranks;
  OverlapMode mode;
  bool views;
  bool split;
  Registration registration;
};

class TrainStepRanks : public testing::TestWithParam<Case> {};

TEST_P(TrainStepRanks, IdenticalOnEveryRankAndLikeOneProcess) {
  const Case& c = GetParam();
  TrainConfig config = small_model();
  config.mode = c.mode;
  config.gradient_views = c.views;
  config.bucketing.partition_large = c.split;
  config.registration = c.registration;
  const Result r = train(c.ranks, config);
  EXPECT_GT(r.buckets, 2u);
  expect_bit_identical(r);
  expect_close(r.parameters[0], single_process(config, c.ranks));
  // Scheduling changes when things run, never the arithmetic: loom's mode and the sequential
  // one give the same bits.
  TrainConfig sequential = config;
  sequential.mode = OverlapMode::sequential;
  const Result s = train(c.ranks, sequential);
  EXPECT_EQ(std::memcmp(s.parameters[0].data(), r.parameters[0].data(),
                        r.parameters[0].size() * sizeof(float)),
            0);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, TrainStepRanks,
    testing::Values(Case{2, OverlapMode::loom, true, false, Registration::forward},
                    Case{3, OverlapMode::loom, true, true, Registration::reverse},
                    Case{2, OverlapMode::ddp, false, false, Registration::reverse},
                    Case{3, OverlapMode::ddp, true, false, Registration::forward},
                    Case{3, OverlapMode::loom, false, true, Registration::forward}),
    [](const testing::TestParamInfo<Case>& info) {
      const Case& c = info.param;
      return std::string(to_string(c.mode)) + (c.views ? "_views" : "_packed") +
             (c.split ? "_split" : "") + "_" + std::string(to_string(c.registration)) + "_" +
             std::to_string(c.ranks) + "ranks";
    });

// Parameters registered last layer first: DDP's bucket 0 then holds layer 0's gradients,
// which backward produces last. ddp issues bucket 0 first anyway (its in-order gate); loom
// issues first the bucket holding the last layer, which backward produces first.
TEST(TrainStep, DdpIssuesInBucketOrderLoomInReadyOrder) {
  auto backend = make_local_backend();
  TrainConfig config = small_model();
  config.registration = Registration::reverse;
  for (OverlapMode mode : {OverlapMode::ddp, OverlapMode::loom}) {
    config.mode = mode;
    TrainStep step(*backend, config);
    const auto order = step.executor().issue_order();
    const auto& buckets = step.bucketer().buckets();
    ASSERT_GT(buckets.size(), 2u);
    ASSERT_EQ(order.size(), buckets.size());
    // Registration is layer3.weight, layer3.bias, ..., layer0.bias: gradient index i belongs
    // to layer 3 - i / 2.
    auto layers_of = [&](const std::string& node) {
      const std::size_t b = std::stoul(node.substr(6, node.find('.') - 6));
      std::set<int> layers;
      for (const auto& piece : buckets[b].pieces)
        layers.insert(3 - static_cast<int>(piece.gradient) / 2);
      return layers;
    };
    if (mode == OverlapMode::ddp) {
      EXPECT_EQ(order.front(), "bucket0.allreduce");
      EXPECT_TRUE(layers_of(order.front()).count(0)) << "DDP's bucket 0 holds layer 0";
    } else {
      EXPECT_TRUE(layers_of(order.front()).count(3)) << order.front() << " should hold layer 3";
      EXPECT_TRUE(layers_of(order.back()).count(0)) << order.back() << " should hold layer 0";
    }
    step.run();
  }
}

// loom's planned issue order: a permutation of the buckets that the executor follows, equal on
// every rank, and like any schedule it leaves the arithmetic alone.
TEST(TrainStep, ScheduledIssueOrderIsFollowedAndKeepsResultsExact) {
  TrainConfig config = small_model();
  config.executor.profile = true;
  const Result plain = train(3, config);
  std::mutex mutex;
  std::vector<std::vector<std::size_t>> plans(3);
  std::vector<std::vector<float>> parameters(3);
  LocalWorld::run(3, [&](Backend& backend) {
    TrainStep step(backend, config);
    for (int s = 0; s < steps; ++s) {
      step.run();
      if (s == 0) {
        EXPECT_TRUE(step.issue_order().empty());
        step.schedule_from_last_run();
        const auto& plan = step.issue_order();
        ASSERT_EQ(plan.size(), step.bucketer().buckets().size());
        const auto order = step.executor().issue_order();
        ASSERT_EQ(order.size(), plan.size());
        for (std::size_t k = 0; k < plan.size(); ++k)
          EXPECT_EQ(order[k], "bucket" + std::to_string(plan[k]) + ".allreduce");
      }
    }
    std::lock_guard lock(mutex);
    plans[backend.rank()] = step.issue_order();
    parameters[backend.rank()] = step.parameters();
  });
  std::vector<std::size_t> sorted = plans[0];
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t b = 0; b < sorted.size(); ++b) EXPECT_EQ(sorted[b], b);
  EXPECT_EQ(plans[1], plans[0]);
  EXPECT_EQ(plans[2], plans[0]);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(std::memcmp(parameters[r].data(), plain.parameters[0].data(),
                          parameters[r].size() * sizeof(float)),
              0)
        << "rank " << r;
}

// The MLP's kernels against plain double-precision loops, on odd sizes (vector tails) with
// values that put ReLU's inputs on both sides of zero: forward (bias, ReLU), the bias and
// weight gradients and the input gradient through ReLU's derivative.
TEST(Mlp, KernelsEqualPlainLoops) {
  const MlpShape shape{.input = 13, .width = 37, .output = 5, .depth = 3, .batch = 11, .seed = 7};
  Mlp mlp(shape, 0, 1);
  for (Layer& l : mlp.layers())  // biases start at zero: give them values to add
    for (int j = 0; j < l.out; ++j) l.bias[j] = 0.01f * static_cast<float>(j % 7 - 3);
  for (int k = 0; k < shape.depth; ++k) mlp.forward(k);
  mlp.loss_and_output_gradient();
  for (int k = shape.depth - 1; k >= 1; --k) mlp.input_gradient(k);
  const auto& layers = mlp.layers();
  int negative = 0, positive = 0;
  for (int k = 0; k < shape.depth; ++k) {
    const Layer& l = layers[k];
    const std::vector<float>& x = mlp.input_of(k);
    for (int n = 0; n < shape.batch; ++n)
      for (int j = 0; j < l.out; ++j) {
        double z = l.bias[j];
        for (int i = 0; i < l.in; ++i) z += double(x[n * l.in + i]) * l.weight[i * l.out + j];
        const std::size_t at = static_cast<std::size_t>(n) * l.out + j;
        EXPECT_NEAR(l.z[at], z, 1e-4 * (1 + std::fabs(z))) << "layer " << k << " z[" << at << "]";
        if (!l.a.empty()) EXPECT_EQ(l.a[at], l.z[at] > 0 ? l.z[at] : 0.0f) << "layer " << k;
        (l.z[at] > 0 ? positive : negative)++;
      }
    std::vector<float> grad_w(static_cast<std::size_t>(l.in) * l.out), grad_b(l.out);
    mlp.weight_gradient(k, grad_w.data(), grad_b.data());
    for (int j = 0; j < l.out; ++j) {
      double b = 0;
      for (int n = 0; n < shape.batch; ++n) b += l.grad_z[n * l.out + j];
      EXPECT_NEAR(grad_b[j], b, 1e-5 * (1 + std::fabs(b))) << "layer " << k << " db[" << j << "]";
      for (int i = 0; i < l.in; ++i) {
        double w = 0;
        for (int n = 0; n < shape.batch; ++n)
          w += double(x[n * l.in + i]) * l.grad_z[n * l.out + j];
        EXPECT_NEAR(grad_w[i * l.out + j], w, 1e-5 * (1 + std::fabs(w))) << "layer " << k;
      }
    }
    if (k == 0) continue;
    // G_{k-1} = (G_k W_k^T) * relu'(Z_{k-1})
    const Layer& below = layers[k - 1];
    for (int n = 0; n < shape.batch; ++n)
      for (int i = 0; i < l.in; ++i) {
        double g = 0;
        for (int j = 0; j < l.out; ++j)
          g += double(l.grad_z[n * l.out + j]) * l.weight[i * l.out + j];
        const std::size_t at = static_cast<std::size_t>(n) * l.in + i;
        if (below.z[at] <= 0) g = 0;
        EXPECT_NEAR(below.grad_z[at], g, 1e-5 * (1 + std::fabs(g))) << "layer " << k - 1;
      }
  }
  EXPECT_GT(negative, 20);  // both sides of ReLU were exercised
  EXPECT_GT(positive, 20);
}

TEST(TrainStep, SchedulingNeedsAProfiledRun) {
  auto backend = make_local_backend();
  TrainStep step(*backend, small_model());
  step.run();
  try {
    step.schedule_from_last_run();
    ADD_FAILURE() << "schedule_from_last_run planned without a profiled run";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << e.what();
    EXPECT_NE(e.message().find("needs a profiled run first"), std::string::npos) << e.what();
  }
}

TEST(TrainStep, RebuildKeepsRanksIdenticalAndResultsExact) {
  TrainConfig config = small_model();
  config.registration = Registration::reverse;
  const Result plain = train(3, config);
  const Result rebuilt = train(3, config, /*rebuild_after=*/1);
  expect_bit_identical(rebuilt);
  expect_close(rebuilt.parameters[0], plain.parameters[0]);
}

// A small search on the small model: three caps (1 to 14 buckets), in flight 0..1, two plans
// timed for two runs each.
PlanSearch small_search() {
  PlanSearch search;
  search.caps_bytes = {512, 2048, 1 << 20};
  search.first_bucket_bytes = {512};
  search.max_in_flight = 1;
  search.profile_runs = 1;
  search.shortlist = 2;
  search.trial_runs = 2;
  return search;
}

// The automatic plan: predicted from a profiled run, its shortlist (the configured plan first)
// timed, the configured plan kept unless another was faster by more than plan_switch_gain;
// rank 0's choice on every rank (3 ranks: not a power of two), and, like any schedule or
// bucketing, it leaves the arithmetic alone.
TEST(TrainStepPlan, AutomaticPlanIsTheFastestTimedAndTheSameOnEveryRank) {
  TrainConfig config = small_model();
  const Result plain = train(3, config);
  config.automatic_plan = small_search();
  const int decide = config.automatic_plan->runs_to_decide();
  ASSERT_EQ(decide, 1 + 2 * 2);
  ASSERT_GT(steps, decide);  // the last steps run the final plan
  std::mutex mutex;
  std::vector<TimedPlan> chosen(3);
  std::vector<std::vector<TimedPlan>> tried(3);
  std::vector<std::vector<std::string>> issued(3);
  std::vector<std::vector<float>> parameters(3);
  LocalWorld::run(3, [&](Backend& backend) {
    TrainStep step(backend, config);
    for (int s = 0; s < steps; ++s) {
      step.run();
      if (s + 1 < decide) EXPECT_TRUE(step.plans_tried().empty()) << "step " << s;
    }
    ASSERT_NE(step.plan(), nullptr);
    std::lock_guard lock(mutex);
    chosen[backend.rank()] = *step.plan();
    tried[backend.rank()] = step.plans_tried();
    issued[backend.rank()] = step.executor().issue_order();
    parameters[backend.rank()] = step.parameters();
    EXPECT_EQ(step.bucketer().buckets().size(), step.plan()->buckets);
    EXPECT_EQ(step.bucketer().options().bucket_cap_bytes, step.plan()->plan.bucket_cap_bytes);
    // Profiling was only for the search: the decided plan runs as the user configured it.
    EXPECT_TRUE(step.executor().last_run().empty()) << "the decided plan still profiles";
  });
  ASSERT_EQ(tried[0].size(), 2u);
  // The shortlist holds the configured plan as it ran (ready order, no limit), then the best
  // predicted other plan, in its planned order.
  EXPECT_EQ(tried[0][0].plan.bucket_cap_bytes, config.bucketing.bucket_cap_bytes);
  EXPECT_EQ(tried[0][0].plan.collectives_in_flight, 0u);
  EXPECT_TRUE(tried[0][0].plan.issue_order.empty()) << describe(tried[0][0]);
  for (const TimedPlan& p : tried[0]) {
    EXPECT_GT(p.predicted_step_s, 0) << describe(p);
    EXPECT_GT(p.measured_step_s, 0) << describe(p);
    if (&p == &tried[0][0]) continue;
    std::vector<std::size_t> sorted = p.plan.issue_order;
    std::sort(sorted.begin(), sorted.end());
    ASSERT_EQ(sorted.size(), p.buckets) << describe(p);
    for (std::size_t b = 0; b < sorted.size(); ++b) EXPECT_EQ(sorted[b], b) << describe(p);
  }
  const std::size_t kept =
      tried[0][1].measured_step_s < tried[0][0].measured_step_s * (1.0 - plan_switch_gain) ? 1 : 0;
  EXPECT_EQ(describe(chosen[0]), describe(tried[0][kept]));
  EXPECT_EQ(chosen[0].measured_step_s, tried[0][kept].measured_step_s);
  for (int r = 1; r < 3; ++r) {
    EXPECT_EQ(describe(chosen[r]), describe(chosen[0])) << "rank " << r;
    EXPECT_EQ(chosen[r].plan.issue_order, chosen[0].plan.issue_order) << "rank " << r;
    EXPECT_EQ(issued[r], issued[0]) << "rank " << r;
    ASSERT_EQ(tried[r].size(), tried[0].size());
    for (std::size_t k = 0; k < tried[0].size(); ++k)  // rank 0's measurements everywhere
      EXPECT_EQ(tried[r][k].measured_step_s, tried[0][k].measured_step_s) << "rank " << r;
    EXPECT_EQ(std::memcmp(parameters[r].data(), parameters[0].data(),
                          parameters[0].size() * sizeof(float)),
              0)
        << "rank " << r << " differs from rank 0";
  }
  // The executor issues the plan's order (the configured plan: every bucket, in ready order).
  ASSERT_EQ(issued[0].size(), chosen[0].buckets);
  for (std::size_t k = 0; k < chosen[0].plan.issue_order.size(); ++k)
    EXPECT_EQ(issued[0][k],
              "bucket" + std::to_string(chosen[0].plan.issue_order[k]) + ".allreduce");
  expect_close(parameters[0], plain.parameters[0]);
}

// plan_automatically() alone: the best predicted plan, untimed, at 2 ranks.
TEST(TrainStepPlan, PlanAutomaticallyRunsTheBestPredictedPlan) {
  TrainConfig config = small_model();
  config.executor.profile = true;
  const Result plain = train(2, config);
  std::mutex mutex;
  std::vector<std::string> plans(2);
  std::vector<std::vector<float>> parameters(2);
  LocalWorld::run(2, [&](Backend& backend) {
    TrainStep step(backend, config);
    EXPECT_EQ(step.plan(), nullptr);
    for (int s = 0; s < steps; ++s) {
      step.run();
      if (s == 1) {
        const TimedPlan& plan = step.plan_automatically(small_search());
        EXPECT_GT(plan.predicted_step_s, 0);
        EXPECT_EQ(plan.measured_step_s, 0);  // not timed
        EXPECT_EQ(step.bucketer().buckets().size(), plan.buckets);
        EXPECT_EQ(step.issue_order(), plan.plan.issue_order);
      }
    }
    std::lock_guard lock(mutex);
    plans[backend.rank()] = describe(*step.plan());
    parameters[backend.rank()] = step.parameters();
  });
  EXPECT_EQ(plans[1], plans[0]);
  EXPECT_EQ(
      std::memcmp(parameters[1].data(), parameters[0].data(), parameters[0].size() * sizeof(float)),
      0);
  expect_close(parameters[0], plain.parameters[0]);
}

// After an automatic plan, schedule_from_last_run() plans an issue order for one collective
// on the wire at a time, whatever in-flight limit the automatic plan had chosen.
TEST(TrainStepPlan, ScheduleAfterThePlanRunsOneCollectiveAtATime) {
  TrainConfig config = small_model();
  config.executor.profile = true;
  PlanSearch search = small_search();
  search.max_in_flight = 0;         // only unlimited plans: the schedule must change the limit
  search.caps_bytes = {512, 2048};  // several buckets whatever is chosen
  search.shortlist = 1;
  config.automatic_plan = search;
  std::mutex mutex;
  std::vector<std::vector<std::string>> issued(2);
  LocalWorld::run(2, [&](Backend& backend) {
    TrainStep step(backend, config);
    // The plan is decided after runs_to_decide() runs; one more runs it.
    for (int s = 0; s <= config.automatic_plan->runs_to_decide(); ++s) step.run();
    ASSERT_NE(step.plan(), nullptr);
    EXPECT_EQ(step.plan()->plan.collectives_in_flight, 0u);
    EXPECT_FALSE(step.executor().last_run().empty()) << "profiling asked for, then dropped";
    step.schedule_from_last_run();
    EXPECT_EQ(step.plan()->plan.collectives_in_flight, 1u);
    EXPECT_EQ(step.plan()->plan.issue_order, step.issue_order());
    step.run();
    // One collective at a time: each allreduce is issued after the previous one completed.
    std::vector<NodeTiming> collectives;
    for (const NodeTiming& t : step.executor().last_run())
      if (t.issue_index >= 0) collectives.push_back(t);
    std::sort(collectives.begin(), collectives.end(), [](const NodeTiming& a, const NodeTiming& b) {
      return a.issue_index < b.issue_index;
    });
    ASSERT_GT(collectives.size(), 1u);
    for (std::size_t k = 1; k < collectives.size(); ++k)
      EXPECT_GE(collectives[k].start_ns, collectives[k - 1].end_ns) << collectives[k].name;
    std::lock_guard lock(mutex);
    issued[backend.rank()] = step.executor().issue_order();
  });
  EXPECT_EQ(issued[1], issued[0]);
}

TEST(TrainStepPlan, BadUseIsANamedError) {
  auto backend = make_local_backend();
  for (OverlapMode mode : {OverlapMode::ddp, OverlapMode::sequential}) {
    TrainConfig config = small_model();
    config.mode = mode;
    config.automatic_plan = small_search();
    try {
      TrainStep step(*backend, config);
      FAIL() << "automatic_plan accepted in " << to_string(mode) << " mode";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("mode is " + std::string(to_string(mode))),
                std::string::npos)
          << e.what();
    }
  }
  {
    TrainConfig config = small_model();
    config.mode = OverlapMode::ddp;
    config.executor.profile = true;
    TrainStep step(*backend, config);
    step.run();
    try {
      step.plan_automatically(small_search());
      FAIL() << "ddp mode planned";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("runs ddp mode"), std::string::npos) << e.what();
    }
  }
  {
    TrainStep step(*backend, small_model());  // not profiled
    step.run();
    try {
      step.plan_automatically(small_search());
      FAIL() << "planned without a profile";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("needs a profiled run"), std::string::npos) << e.what();
    }
  }
  {
    TrainConfig config = small_model();
    config.executor.profile = true;
    TrainStep step(*backend, config);
    step.run();
    PlanSearch search = small_search();
    search.caps_bytes = {0};
    try {
      step.plan_automatically(search);
      FAIL() << "a zero cap planned";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("bucket caps must be > 0"), std::string::npos)
          << e.what();
    }
  }
}

TEST(TrainStep, CompressedGradientsStillTrain) {
  for (Compression compression : {Compression::float16, Compression::bfloat16}) {
    TrainConfig config = small_model();
    config.bucketing.compression = compression;
    const Result r = train(3, config);
    expect_bit_identical(r);
    EXPECT_LT(r.losses.back(), 0.9f * r.losses.front()) << to_string(compression);
    // Close to full precision, within what 16-bit gradients allow.
    const auto exact = train(3, small_model()).parameters[0];
    double worst = 0;
    for (std::size_t i = 0; i < exact.size(); ++i)
      worst = std::max(worst, static_cast<double>(std::fabs(r.parameters[0][i] - exact[i])));
    EXPECT_LT(worst, 1e-2) << to_string(compression);
  }
}

// The compiled step's graph as its DOT lists it: node names in id order (":priority" when not
// 0) and the edges in the order they were added, as "from>to" by name.
struct GraphListing {
  std::vector<std::string> nodes, edges;
};

GraphListing listing_of(const Executor& executor) {
  std::ostringstream dot;
  executor.dump_dot(dot);
  const std::regex node(R"(^  n\d+ \[.*label="([^\\"]*)\\n.*?(?:\\npriority (-?\d+))?"[\],])");
  const std::regex edge(R"(^  n(\d+) -> n(\d+))");
  GraphListing out;
  std::vector<std::string> names;
  std::istringstream lines(dot.str());
  std::smatch m;
  for (std::string line; std::getline(lines, line);) {
    if (std::regex_search(line, m, edge)) {
      out.edges.push_back(names.at(std::stoul(m[1])) + ">" + names.at(std::stoul(m[2])));
    } else if (std::regex_search(line, m, node)) {
      names.push_back(m[1]);
      out.nodes.push_back(m[1].str() + (m[2].matched ? ":" + m[2].str() : ""));
    }
  }
  return out;
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : " ") + item;
  return out;
}

// FNV-1a of the edge list: the edges are too many to spell out, their order matters (it is
// the order the flow graph connects them in).
std::uint64_t fingerprint(const std::vector<std::string>& items) {
  std::uint64_t h = 14695981039346656037ull;
  for (const std::string& item : items)
    for (const char c : item + "\n") h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

struct GraphCase {
  OverlapMode mode;
  bool views;
  Compression compression;
  std::string nodes;  // joined(listing.nodes)
  std::size_t edges;
  std::uint64_t edge_fingerprint;
};

class TrainStepGraph : public testing::TestWithParam<GraphCase> {};

// The step's graph for a 3-layer model whose first bucket holds layers 2 and 1: the nodes, their
// priorities and edges that TrainStep::compile produced when these lines were written.
TEST_P(TrainStepGraph, KeepsItsNodesPrioritiesAndEdges) {
  const GraphCase& c = GetParam();
  TrainConfig config;
  config.shape = {.input = 6, .width = 16, .output = 2, .depth = 3, .batch = 5, .seed = 3};
  config.bucketing.bucket_cap_bytes = 256;
  config.bucketing.first_bucket_bytes = 512;
  config.bucketing.compression = c.compression;
  config.mode = c.mode;
  config.gradient_views = c.views;
  auto backend = make_local_backend();
  TrainStep step(*backend, config);
  const GraphListing listing = listing_of(step.executor());
  EXPECT_EQ(joined(listing.nodes), c.nodes);
  EXPECT_EQ(listing.edges.size(), c.edges);
  EXPECT_EQ(fingerprint(listing.edges), c.edge_fingerprint) << joined(listing.edges);
  step.run();
}

INSTANTIATE_TEST_SUITE_P(
    Modes, TrainStepGraph,
    testing::Values(
        GraphCase{OverlapMode::sequential, true, Compression::none,
                  "forward0 forward1 forward2 loss backward2.weights:1 backward2.input "
                  "backward1.weights:1 backward1.input backward0.weights:1 bucket0.allreduce:2 "
                  "bucket1.allreduce:1 backward.done pack.done allreduce.done bucket0.sgd:2 "
                  "bucket1.sgd:2",
                  27, 0x2095ca21872de653ull},
        GraphCase{
            OverlapMode::sequential, false, Compression::float16,
            "forward0 forward1 forward2 loss backward2.weights:1 backward2.input "
            "backward1.weights:1 backward1.input backward0.weights:1 bucket0.pack bucket0.unpack "
            "bucket0.allreduce:2 bucket1.pack bucket1.unpack bucket1.allreduce:1 backward.done "
            "pack.done allreduce.done bucket0.sgd:2 bucket1.sgd:2",
            37, 0x831e6edfa7eb962cull},
        GraphCase{OverlapMode::ddp, true, Compression::none,
                  "forward0 forward1 forward2 loss backward2.weights:1 backward2.input "
                  "backward1.weights:1 backward1.input backward0.weights:1 bucket0.allreduce:2 "
                  "bucket1.allreduce:1 bucket0.sgd:2 bucket1.sgd:2",
                  15, 0xd7bb8c7fe1774a87ull},
        GraphCase{OverlapMode::ddp, false, Compression::none,
                  "forward0 forward1 forward2 loss backward2.weights:1 backward2.input "
                  "backward1.weights:1 backward1.input backward0.weights:1 bucket0.pack "
                  "bucket0.unpack bucket0.allreduce:2 bucket1.pack bucket1.unpack "
                  "bucket1.allreduce:1 bucket0.sgd:2 bucket1.sgd:2",
                  19, 0x5e27c7d5369db4e7ull},
        GraphCase{OverlapMode::loom, true, Compression::none,
                  "backward2.weights:1 backward2.input backward1.weights:1 backward1.input "
                  "backward0.weights:1 bucket0.allreduce:2 bucket1.allreduce:1 bucket0.sgd:2 "
                  "bucket1.sgd:2 forward0.next forward1.next forward2.next loss.next",
                  20, 0x3a04837eb4d3ab46ull},
        GraphCase{OverlapMode::loom, false, Compression::bfloat16,
                  "backward2.weights:1 backward2.input backward1.weights:1 backward1.input "
                  "backward0.weights:1 bucket0.pack bucket0.unpack bucket0.allreduce:2 "
                  "bucket1.pack bucket1.unpack bucket1.allreduce:1 bucket0.sgd:2 bucket1.sgd:2 "
                  "forward0.next forward1.next forward2.next loss.next",
                  24, 0xc68c10bd586cb538ull}),
    [](const testing::TestParamInfo<GraphCase>& info) {
      const GraphCase& c = info.param;
      return std::string(to_string(c.mode)) + (c.views ? "_views_" : "_packed_") +
             std::string(to_string(c.compression));
    });

TEST(TrainStep, BadInputIsAnError) {
  auto backend = make_local_backend();
  TrainConfig config = small_model();
  config.shape.depth = 0;
  try {
    TrainStep step(*backend, config);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(e.message().find("depth 0"), std::string::npos) << e.message();
  }
  expect_error(ErrorCode::invalid_argument, "unknown mode 'fastest'",
               [] { parse_overlap_mode("fastest"); });
  expect_error(ErrorCode::invalid_argument, "unknown registration order 'sideways'",
               [] { parse_registration("sideways"); });
  config = small_model();
  TrainStep step(*backend, config);
  step.run();
  try {
    step.rebuild_buckets();  // profiling is off: nothing to rebuild from
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(e.message().find("profiled run"), std::string::npos) << e.message();
  }
}

// The model on a GPU (cuBLAS on the executor's streams, gradients copied into the pinned
// host buckets, reduced by the CPU backend): the same training as on the CPU.
TEST(TrainStepCuda, MatchesTheCpuStepAndIsIdenticalOnEveryRank) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "GPU test skipped: " << cuda::unavailable_reason();
  for (const OverlapMode mode : {OverlapMode::sequential, OverlapMode::ddp, OverlapMode::loom}) {
    SCOPED_TRACE(std::string(to_string(mode)));
    TrainConfig config = small_model();
    config.mode = mode;
    const Result cpu = train(3, config);
    config.device = Device::cuda(0);
    const Result gpu = train(3, config);
    expect_bit_identical(gpu);
    expect_close(gpu.parameters[0], cpu.parameters[0]);
    ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
    for (std::size_t s = 0; s < cpu.losses.size(); ++s)
      EXPECT_NEAR(gpu.losses[s], cpu.losses[s], 1e-4f * std::fabs(cpu.losses[s])) << "step " << s;
  }
}

TEST(TrainStepCuda, WithoutADeviceSaysSo) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a CUDA device is visible";
  TrainConfig config = small_model();
  config.device = Device::cuda(0);
  LocalWorld::run(1, [&](Backend& backend) {
    try {
      TrainStep step(backend, config);
      ADD_FAILURE() << "a TrainStep on cuda:0 was built without a device";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::unavailable) << e.what();
      EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace loom::examples
