// DataParallelStep on a model that is not the example's MLP: an elementwise chain
// x_{k+1} = w_k * x_k + b_k described as a StepModel, trained on local ranks (1, 2, 3) with odd
// sizes, in every mode, against one process computing the whole batch; node names, model-owned
// gradients, registration order, planning (rebuild, issue order, automatic) and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "loom/data_parallel_step.hpp"
#include "loom/error.hpp"
#include "loom/local.hpp"

namespace loom {
namespace {

Buffer view(std::vector<float>& v) {
  return Buffer::of(std::span(v));
}

struct Shape {
  int layers = 4;
  int features = 7;
  int batch = 3;  ///< samples per rank
};

// Sample `global`'s input and target (the whole data set is world x batch samples).
float input_of(int global, int i) {
  return std::sin(0.3f * float(global) + 0.7f * float(i));
}
float target_of(int global, int i) {
  return std::cos(0.2f * float(global) - 0.5f * float(i));
}

// The chain on one rank: samples [rank * batch, (rank + 1) * batch). Loss: 0.5 / batch x the
// squared error, so the ranks' average gradient is the whole batch's mean gradient.
struct Chain {
  Chain(Shape s, int rank, float lr, bool own_gradients) : shape(s), lr(lr) {
    const std::size_t n = static_cast<std::size_t>(s.features);
    const std::size_t bn = n * static_cast<std::size_t>(s.batch);
    for (int k = 0; k < s.layers; ++k) {
      w.emplace_back(n);
      b.emplace_back(n, 0.0f);
      for (std::size_t i = 0; i < n; ++i) w[k][i] = 1.0f + 0.01f * float(i + k);
      if (own_gradients) {
        gw.emplace_back(n, 0.0f);
        gb.emplace_back(n, 0.0f);
      }
    }
    x.assign(s.layers + 1, std::vector<float>(bn));
    g.assign(s.layers + 1, std::vector<float>(bn));
    t.resize(bn);
    for (int j = 0; j < s.batch; ++j)
      for (std::size_t i = 0; i < n; ++i) {
        x[0][j * n + i] = input_of(rank * s.batch + j, int(i));
        t[j * n + i] = target_of(rank * s.batch + j, int(i));
      }
  }

  StepModel model(const std::string& update_name = "update") {
    StepModel m;
    m.update_name = update_name;
    const std::size_t n = static_cast<std::size_t>(shape.features);
    const std::size_t bn = n * static_cast<std::size_t>(shape.batch);
    for (int k = 0; k < shape.layers; ++k) {
      StepLayer layer;
      layer.parameters = {{"chain" + std::to_string(k) + ".w", view(w[k]), {}},
                          {"chain" + std::to_string(k) + ".b", view(b[k]), {}}};
      if (!gw.empty()) {
        layer.parameters[0].gradient = view(gw[k]);
        layer.parameters[1].gradient = view(gb[k]);
      }
      layer.forward = [this, k, n, bn] {
        return StepWork{[this, k, n, bn] {
                          for (std::size_t e = 0; e < bn; ++e)
                            x[k + 1][e] = w[k][e % n] * x[k][e] + b[k][e % n];
                        },
                        {},
                        {view(x[k]), view(w[k]), view(b[k])},
                        {view(x[k + 1])}};
      };
      layer.parameter_gradients = [this, k, n, bn](std::span<const Buffer> grads) {
        const Buffer dw = grads[0], db = grads[1];
        return StepWork{[this, k, n, bn, dw, db] {
                          float* pw = dw.as<float>();
                          float* pb = db.as<float>();
                          for (std::size_t i = 0; i < n; ++i) pw[i] = pb[i] = 0;
                          for (std::size_t e = 0; e < bn; ++e) {
                            pw[e % n] += g[k + 1][e] * x[k][e];
                            pb[e % n] += g[k + 1][e];
                          }
                        },
                        {},
                        {view(x[k]), view(g[k + 1])},
                        {dw, db}};
      };
      if (k > 0)
        layer.input_gradient = [this, k, n, bn] {
          return StepWork{[this, k, n, bn] {
                            for (std::size_t e = 0; e < bn; ++e)
                              g[k][e] = g[k + 1][e] * w[k][e % n];
                          },
                          {},
                          {view(g[k + 1]), view(w[k])},
                          {view(g[k])}};
        };
      m.layers.push_back(std::move(layer));
    }
    m.loss = [this, bn] {
      return StepWork{[this, bn] {
                        const int last = shape.layers;
                        double sum = 0;
                        for (std::size_t e = 0; e < bn; ++e) {
                          const float d = x[last][e] - t[e];
                          g[last][e] = d / float(shape.batch);
                          sum += 0.5 * d * d / shape.batch;
                        }
                        loss = float(sum);
                      },
                      {},
                      {view(x[shape.layers])},
                      {view(g[shape.layers])}};
    };
    m.update = [this](std::span<const ParameterSlice> slices) {
      std::vector<ParameterSlice> mine(slices.begin(), slices.end());
      ++updates_built;
      return StepWork{[mine, lr = lr] {
                        for (const ParameterSlice& s : mine)
                          for (std::size_t i = 0; i < s.gradient.count(); ++i)
                            s.values.as<float>()[i] -= lr * s.gradient.as<float>()[i];
                      },
                      {},
                      {},
                      {}};
    };
    return m;
  }

  std::vector<float> parameters() const {
    std::vector<float> out;
    for (int k = 0; k < shape.layers; ++k) {
      out.insert(out.end(), w[k].begin(), w[k].end());
      out.insert(out.end(), b[k].begin(), b[k].end());
    }
    return out;
  }

  Shape shape;
  float lr;
  std::vector<std::vector<float>> w, b, gw, gb, x, g;
  std::vector<float> t;
  float loss = 0;
  int updates_built = 0;
};

// One process, the whole batch (world x batch samples), `steps` steps of SGD, in double.
std::vector<float> reference(Shape s, int world, int steps, float lr) {
  const std::size_t n = static_cast<std::size_t>(s.features);
  const int samples = world * s.batch;
  std::vector<std::vector<double>> w(s.layers, std::vector<double>(n)),
      b(s.layers, std::vector<double>(n, 0.0));
  for (int k = 0; k < s.layers; ++k)
    for (std::size_t i = 0; i < n; ++i) w[k][i] = double(1.0f + 0.01f * float(i + k));
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<double>> gw(s.layers, std::vector<double>(n, 0.0)),
        gb(s.layers, std::vector<double>(n, 0.0));
    for (int j = 0; j < samples; ++j)
      for (std::size_t i = 0; i < n; ++i) {
        std::vector<double> x(s.layers + 1);
        x[0] = input_of(j, int(i));
        for (int k = 0; k < s.layers; ++k) x[k + 1] = w[k][i] * x[k] + b[k][i];
        double grad = (x[s.layers] - double(target_of(j, int(i)))) / samples;
        for (int k = s.layers - 1; k >= 0; --k) {
          gw[k][i] += grad * x[k];
          gb[k][i] += grad;
          grad *= w[k][i];
        }
      }
    for (int k = 0; k < s.layers; ++k)
      for (std::size_t i = 0; i < n; ++i) {
        w[k][i] -= lr * gw[k][i];
        b[k][i] -= lr * gb[k][i];
      }
  }
  std::vector<float> out;
  for (int k = 0; k < s.layers; ++k) {
    for (double v : w[k]) out.push_back(float(v));
    for (double v : b[k]) out.push_back(float(v));
  }
  return out;
}

ExecutorOptions executor_options(bool profile = false) {
  ExecutorOptions o;
  o.timeout = std::chrono::seconds(30);
  o.profile = profile;
  return o;
}

DataParallelOptions step_options(OverlapMode mode, std::size_t bucket_cap_bytes = 64) {
  DataParallelOptions o;
  o.mode = mode;
  o.bucketing.bucket_cap_bytes = bucket_cap_bytes;
  o.bucketing.first_bucket_bytes = bucket_cap_bytes;
  o.executor = executor_options();
  return o;
}

constexpr float kLr = 0.05f;

// Every rank's parameters after `steps` runs of a step made by `make` on each rank.
template <class Make>
std::vector<std::vector<float>> train(int world, int steps, Make make) {
  std::vector<std::vector<float>> out(world);
  LocalWorld::run(world, [&](Backend& backend) {
    Chain chain(Shape{}, backend.rank(), kLr, false);
    auto step = make(backend, chain);
    for (int s = 0; s < steps; ++s) step->run();
    out[backend.rank()] = chain.parameters();
  });
  return out;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::abs(got[i] - want[i]) > 1e-5f * std::max(1.0f, std::abs(want[i])) && wrong++ < 5)
      ADD_FAILURE() << what << ": parameter " << i << " is " << got[i] << ", one process gives "
                    << want[i];
}

class EveryMode : public ::testing::TestWithParam<int> {};

TEST_P(EveryMode, TrainsTheChainAsOneProcessDoesWithTheSameBitsOnEveryRank) {
  const int world = GetParam();
  constexpr int steps = 6;
  const std::vector<float> want = reference(Shape{}, world, steps, kLr);
  std::vector<std::vector<float>> first;
  for (OverlapMode mode : {OverlapMode::sequential, OverlapMode::ddp, OverlapMode::loom}) {
    const auto ranks = train(world, steps, [&](Backend& backend, Chain& chain) {
      return std::make_unique<DataParallelStep>(backend, chain.model(), step_options(mode));
    });
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(ranks[r], ranks[0]) << to_string(mode) << ": rank " << r << " differs";
      expect_close(ranks[r], want, std::string(to_string(mode)) + " rank " + std::to_string(r));
    }
    // Same buckets, same reductions: the modes differ only in when things run.
    if (first.empty())
      first = ranks;
    else
      EXPECT_EQ(ranks[0], first[0]) << to_string(mode) << " gives other bits than sequential";
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, EveryMode, ::testing::Values(1, 2, 3));

TEST(DataParallelStep, NamesNodesAfterLayersAndTheUpdateAndPipelinesTheNextForward) {
  LocalWorld::run(2, [&](Backend& backend) {
    Chain chain(Shape{}, backend.rank(), kLr, false);
    DataParallelStep step(backend, chain.model("adam"), step_options(OverlapMode::loom));
    const Graph& g = step.graph();
    for (const char* name : {"backward3.weights", "backward1.input", "bucket0.allreduce",
                             "bucket0.adam", "forward0.next", "forward3.next", "loss.next"})
      EXPECT_TRUE(g.find(name).valid()) << name;
    // loom mode: the step's own forward is the prologue's; the first layer has no input
    // gradient.
    EXPECT_FALSE(g.find("forward0").valid());
    EXPECT_FALSE(g.find("backward0.input").valid());
    // 64-byte caps on 28-byte parameters: several buckets, one update each.
    EXPECT_GT(step.bucketer().buckets().size(), 1u);
    EXPECT_EQ(static_cast<std::size_t>(chain.updates_built), step.bucketer().buckets().size());
    EXPECT_EQ(step.num_parameters(), 8u);
    EXPECT_EQ(step.parameter(3).name, "chain1.b");
    EXPECT_EQ(step.layer_of(3), 1u);
    step.run();
    EXPECT_GT(chain.loss, 0.0f);  // the prologue's forward and the pipelined one ran
  });
}

TEST(DataParallelStep, ModelOwnedGradientsArePackedAndGiveTheSameBitsAsViews) {
  for (OverlapMode mode : {OverlapMode::ddp, OverlapMode::loom}) {
    const auto views = train(2, 4, [&](Backend& backend, Chain& chain) {
      return std::make_unique<DataParallelStep>(backend, chain.model(), step_options(mode));
    });
    std::vector<std::vector<float>> packed(2);
    LocalWorld::run(2, [&](Backend& backend) {
      Chain chain(Shape{}, backend.rank(), kLr, /*own_gradients=*/true);
      DataParallelStep step(backend, chain.model(), step_options(mode));
      EXPECT_FALSE(step.bucketer().gradients_are_views());
      EXPECT_TRUE(step.graph().find("bucket0.pack").valid());
      for (int s = 0; s < 4; ++s) step.run();
      packed[backend.rank()] = chain.parameters();
    });
    EXPECT_EQ(packed[0], views[0]) << to_string(mode);
    EXPECT_EQ(packed[1], views[1]) << to_string(mode);
  }
}

TEST(DataParallelStep, ReverseRegistrationBucketsTheOtherWayAndTrainsTheSame) {
  const std::vector<float> want = reference(Shape{}, 3, 5, kLr);
  std::vector<std::size_t> first_bucket_forward, first_bucket_reverse;
  for (bool reverse : {false, true}) {
    const auto ranks = train(3, 5, [&](Backend& backend, Chain& chain) {
      StepModel m = chain.model();
      if (reverse)
        for (std::size_t k = 4; k-- > 0;)
          m.registration.insert(m.registration.end(), {{k, 0}, {k, 1}});
      auto step = std::make_unique<DataParallelStep>(backend, std::move(m),
                                                     step_options(OverlapMode::ddp, 100));
      if (backend.rank() == 0) {
        std::vector<std::size_t> layers;
        for (const BucketPiece& p : step->bucketer().buckets()[0].pieces)
          layers.push_back(step->layer_of(p.gradient));
        (reverse ? first_bucket_reverse : first_bucket_forward) = layers;
      }
      return step;
    });
    for (int r = 0; r < 3; ++r) expect_close(ranks[r], want, "rank " + std::to_string(r));
  }
  // DDP fills buckets from reverse registration: the first bucket holds the last layer's
  // gradients with forward registration and the first layer's with reverse.
  ASSERT_FALSE(first_bucket_forward.empty());
  ASSERT_FALSE(first_bucket_reverse.empty());
  EXPECT_EQ(first_bucket_forward.front(), 3u);
  EXPECT_EQ(first_bucket_reverse.front(), 0u);
}

TEST(DataParallelStep, RebuildAndPlannedIssueOrdersKeepTheNumerics) {
  const std::vector<float> want = reference(Shape{}, 3, 6, kLr);
  std::vector<std::vector<float>> ranks(3);
  std::vector<std::vector<std::size_t>> orders(3);
  LocalWorld::run(3, [&](Backend& backend) {
    Chain chain(Shape{}, backend.rank(), kLr, false);
    DataParallelOptions o = step_options(OverlapMode::loom);
    o.executor.profile = true;
    DataParallelStep step(backend, chain.model(), o);
    step.run();
    step.rebuild_buckets();
    EXPECT_TRUE(step.issue_order().empty());
    step.run();
    step.schedule_from_last_run();  // the ready order
    step.run();
    step.schedule_from_last_run();  // the tail lowest layer first
    const std::size_t n = step.bucketer().buckets().size();
    std::vector<std::size_t> sorted = step.issue_order();
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::size_t> all(n);
    std::iota(all.begin(), all.end(), std::size_t{0});
    EXPECT_EQ(sorted, all) << "the issue order is not a permutation of the buckets";
    for (int s = 0; s < 3; ++s) step.run();
    ranks[backend.rank()] = chain.parameters();
    orders[backend.rank()] = step.issue_order();
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(orders[r], orders[0]) << "rank " << r << " plans another issue order";
    EXPECT_EQ(ranks[r], ranks[0]) << "rank " << r;
    expect_close(ranks[r], want, "rank " + std::to_string(r));
  }
}

TEST(DataParallelStep, AutomaticPlanDecidesTheSamePlanOnEveryRankAndKeepsTheNumerics) {
  PlanSearch search;
  search.caps_bytes = {32, 64, 1024};
  search.first_bucket_bytes = {32};
  search.max_in_flight = 1;
  search.profile_runs = 1;
  search.shortlist = 2;
  search.trial_runs = 2;
  const int steps = search.runs_to_decide() + 2;
  EXPECT_EQ(search.runs_to_decide(), 1 + 2 * 2);
  const std::vector<float> want = reference(Shape{}, 3, steps, kLr);
  std::vector<std::vector<float>> ranks(3);
  std::vector<std::string> plans(3);
  std::mutex mutex;
  LocalWorld::run(3, [&](Backend& backend) {
    Chain chain(Shape{}, backend.rank(), kLr, false);
    DataParallelOptions o = step_options(OverlapMode::loom);
    o.automatic_plan = search;
    DataParallelStep step(backend, chain.model(), o);
    for (int s = 0; s < search.runs_to_decide(); ++s) {
      EXPECT_EQ(step.plans_tried().size(), 0u) << "decided before run " << s;
      step.run();
    }
    ASSERT_NE(step.plan(), nullptr);
    ASSERT_EQ(step.plans_tried().size(), 2u);
    // The first plan timed is the configured one as it ran (ready order, no limit), the
    // second a planned one.
    const TimedPlan& configured = step.plans_tried().front();
    EXPECT_EQ(configured.plan.bucket_cap_bytes, o.bucketing.bucket_cap_bytes);
    EXPECT_EQ(configured.plan.first_bucket_bytes, o.bucketing.first_bucket_bytes);
    EXPECT_EQ(configured.plan.collectives_in_flight, 0u);
    EXPECT_TRUE(configured.plan.issue_order.empty()) << describe(configured);
    EXPECT_EQ(step.plans_tried()[1].plan.issue_order.size(), step.plans_tried()[1].buckets);
    for (const TimedPlan& p : step.plans_tried()) {
      EXPECT_GT(p.predicted_step_s, 0) << describe(p);
      EXPECT_GT(p.measured_step_s, 0) << describe(p);
    }
    // The plan running is the configured one unless the other measured faster by more than
    // plan_switch_gain.
    const double first = step.plans_tried()[0].measured_step_s;
    const double other = step.plans_tried()[1].measured_step_s;
    const std::size_t kept = other < first * (1.0 - plan_switch_gain) ? 1 : 0;
    EXPECT_EQ(describe(*step.plan()), describe(step.plans_tried()[kept]));
    EXPECT_EQ(step.bucketer().buckets().size(), step.plan()->buckets);
    for (int s = search.runs_to_decide(); s < steps; ++s) step.run();
    std::lock_guard lock(mutex);
    ranks[backend.rank()] = chain.parameters();
    plans[backend.rank()] = describe(*step.plan());
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(plans[r], plans[0]) << "rank " << r;
    EXPECT_EQ(ranks[r], ranks[0]) << "rank " << r;
    expect_close(ranks[r], want, "rank " + std::to_string(r));
  }
}

// Each broken model: the named error, before anything communicates.
TEST(DataParallelStep, AnIncompleteModelIsANamedError) {
  struct Case {
    const char* what;
    std::function<void(StepModel&)> breaks;
    DataParallelOptions options;
  };
  const DataParallelOptions loom_mode = step_options(OverlapMode::loom);
  DataParallelOptions ddp_auto = step_options(OverlapMode::ddp);
  ddp_auto.automatic_plan = PlanSearch{};
  DataParallelOptions bad_search = loom_mode;
  bad_search.automatic_plan = PlanSearch{};
  bad_search.automatic_plan->caps_bytes = {0};
  const std::vector<Case> cases = {
      {"the model has no layers", [](StepModel& m) { m.layers.clear(); }, loom_mode},
      {"layer 2 has no forward", [](StepModel& m) { m.layers[2].forward = nullptr; }, loom_mode},
      {"layer 1 has no input_gradient", [](StepModel& m) { m.layers[1].input_gradient = nullptr; },
       loom_mode},
      {"layer 0 has no parameters", [](StepModel& m) { m.layers[0].parameters.clear(); },
       loom_mode},
      {"parameter 'chain3.w' (layer 3) has no values",
       [](StepModel& m) { m.layers[3].parameters[0].values = Buffer(); }, loom_mode},
      {"the model has no update", [](StepModel& m) { m.update = nullptr; }, loom_mode},
      {"registration names parameter 1 of layer 0 twice",
       [](StepModel& m) {
         m.registration = {{0, 1}, {0, 1}};
       },
       loom_mode},
      {"registration names parameter 5 of layer 1, which does not exist",
       [](StepModel& m) {
         m.registration = {{1, 5}};
       },
       loom_mode},
      {"registration names 2 of the 8 parameters",
       [](StepModel& m) {
         m.registration = {{0, 0}, {0, 1}};
       },
       loom_mode},
      {"this step's mode is ddp", [](StepModel&) {}, ddp_auto},
      {"caps must be > 0", [](StepModel&) {}, bad_search},
  };
  LocalWorld::run(1, [&](Backend& backend) {
    for (const Case& c : cases) {
      Chain chain(Shape{}, 0, kLr, false);
      StepModel m = chain.model();
      c.breaks(m);
      try {
        DataParallelStep step(backend, std::move(m), c.options);
        ADD_FAILURE() << "no error for: " << c.what;
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << c.what;
        EXPECT_NE(std::string(e.what()).find(c.what), std::string::npos)
            << "expected '" << c.what << "' in: " << e.what();
      }
    }
    // A node the model forgot to give a body for is named when the graph is built.
    Chain chain(Shape{}, 0, kLr, false);
    StepModel m = chain.model();
    m.layers[1].forward = [] { return StepWork{}; };
    try {
      DataParallelStep step(backend, std::move(m), loom_mode);
      ADD_FAILURE() << "no error for a node without a body";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("node 'forward1' has no cpu body"), std::string::npos)
          << e.what();
    }
    // Planning asks for a profiled run.
    DataParallelStep step(backend, chain.model(), loom_mode);
    step.run();
    try {
      step.plan_automatically();
      ADD_FAILURE() << "planned without a profiled run";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("needs a profiled run"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace loom
