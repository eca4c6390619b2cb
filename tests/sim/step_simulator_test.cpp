// Tests of sim/step_simulator and sim/network_model: small graphs whose schedule is computed by
// hand, rank counts 1, 2, 3, 5 (the cost formulas' non-power-of-two folds included).
#include "loom/step_simulator.hpp"

#include <gtest/gtest.h>

#include "expect_error.hpp"
#include "loom/error.hpp"

namespace loom {
namespace {

using test::expect_error;

constexpr double ms = 1e-3;

// alpha, beta, gamma as given, no native fits: the formulas alone.
NetworkModel model(double alpha_s, double beta_s_per_byte, double gamma_s_per_byte = 0) {
  TuningParameters t;
  t.cost = {alpha_s, beta_s_per_byte, gamma_s_per_byte};
  return NetworkModel(t);
}

std::size_t add_compute(StepProfile& p, const std::string& name, double seconds, int priority = 0) {
  p.nodes.push_back(
      {.name = name, .kind = NodeKind::compute, .priority = priority, .duration_s = seconds});
  return p.nodes.size() - 1;
}

std::size_t add_allreduce(StepProfile& p, const std::string& name, std::size_t bytes) {
  p.nodes.push_back(
      {.name = name, .kind = NodeKind::collective, .op = Collective::allreduce, .bytes = bytes});
  return p.nodes.size() - 1;
}

TEST(StepSimulator, ChainRunsOneAfterAnother) {
  StepProfile p;
  auto a = add_compute(p, "a", 1 * ms), b = add_compute(p, "b", 2 * ms),
       c = add_compute(p, "c", 3 * ms);
  p.edges = {{a, b}, {b, c}};
  const Prediction r = simulate(p, model(0, 1e-9), {.ranks = 2, .workers = 4});
  EXPECT_NEAR(r.step_s, 6 * ms, 1e-12);
  EXPECT_NEAR(r.compute_s, 6 * ms, 1e-12);
  EXPECT_EQ(r.comm_s, 0);
  EXPECT_NEAR(r.critical_path_s, 6 * ms, 1e-12);
  EXPECT_NEAR(r.nodes[c].start_s, 3 * ms, 1e-12);
}

TEST(StepSimulator, WorkersBoundIndependentCompute) {
  StepProfile p;
  add_compute(p, "short", 3 * ms);
  add_compute(p, "long", 5 * ms, 1);
  EXPECT_NEAR(simulate(p, model(0, 0), {.workers = 2}).step_s, 5 * ms, 1e-12);
  const Prediction one = simulate(p, model(0, 0), {.workers = 1});
  EXPECT_NEAR(one.step_s, 8 * ms, 1e-12);
  // The higher priority runs first on the one worker.
  EXPECT_NEAR(one.nodes[1].start_s, 0, 1e-12);
  EXPECT_NEAR(one.nodes[0].start_s, 5 * ms, 1e-12);
}

TEST(StepSimulator, TwoCollectivesShareTheWire) {
  // 2 ranks, alpha 0, beta 1 ns/B, gamma 0: a 1 MB allreduce costs n beta = 1 ms alone
  // (ring: 2 (p-1)/p n beta).
  StepProfile p;
  auto c1 = add_allreduce(p, "c1", 1'000'000), c2 = add_allreduce(p, "c2", 1'000'000);
  const NetworkModel net = model(0, 1e-9);
  const Prediction shared = simulate(p, net, {.ranks = 2});
  EXPECT_NEAR(shared.nodes[c1].end_s, 2 * ms, 1e-12);
  EXPECT_NEAR(shared.nodes[c2].end_s, 2 * ms, 1e-12);
  EXPECT_NEAR(shared.comm_s, 2 * ms, 1e-12);
  EXPECT_NEAR(shared.critical_path_s, 1 * ms, 1e-12);
  // One in flight: the first has the wire to itself.
  const Prediction one = simulate(p, net, {.ranks = 2, .collectives_in_flight = 1});
  EXPECT_NEAR(one.nodes[c1].end_s, 1 * ms, 1e-12);
  EXPECT_NEAR(one.nodes[c2].start_s, 1 * ms, 1e-12);
  EXPECT_NEAR(one.nodes[c2].end_s, 2 * ms, 1e-12);
  // Unequal sizes: c3 (0.5 ms alone) ends at 1 ms sharing, c1 then runs alone: 1.5 ms.
  StepProfile q;
  auto big = add_allreduce(q, "big", 1'000'000), small = add_allreduce(q, "small", 500'000);
  const Prediction unequal = simulate(q, net, {.ranks = 2});
  EXPECT_NEAR(unequal.nodes[small].end_s, 1 * ms, 1e-12);
  EXPECT_NEAR(unequal.nodes[big].end_s, 1.5 * ms, 1e-12);
}

TEST(StepSimulator, OneInFlightHandsTheWireToWhatIsNeededFirst) {
  // c1 -> use (1 ms); c2 unrelated. Shared: c1 ends at 2 ms, step 3 ms. One in flight: c1 at
  // 1 ms, use ends at 2 ms with c2: step 2 ms. The reverse order with one in flight: 3 ms.
  StepProfile p;
  auto c1 = add_allreduce(p, "c1", 1'000'000), c2 = add_allreduce(p, "c2", 1'000'000);
  auto use = add_compute(p, "use", 1 * ms);
  p.edges = {{c1, use}};
  const NetworkModel net = model(0, 1e-9);
  const Prediction shared = simulate(p, net, {.ranks = 2});
  EXPECT_NEAR(shared.step_s, 3 * ms, 1e-12);
  EXPECT_NEAR(shared.exposed_s, 2 * ms, 1e-12);
  const Prediction one = simulate(p, net, {.ranks = 2, .collectives_in_flight = 1});
  EXPECT_NEAR(one.step_s, 2 * ms, 1e-12);
  EXPECT_NEAR(one.hidden_s, 1 * ms, 1e-12);
  EXPECT_NEAR(one.exposed_s, 1 * ms, 1e-12);
  const Prediction reversed =
      simulate(p, net, {.ranks = 2, .collectives_in_flight = 1, .issue_order = {c2, c1}});
  EXPECT_NEAR(reversed.step_s, 3 * ms, 1e-12);
  // The search finds 2 ms from the reversed, unlimited start.
  const Schedule best = best_schedule(p, net, {.ranks = 2, .issue_order = {c2, c1}});
  EXPECT_NEAR(best.prediction.step_s, 2 * ms, 1e-12);
  EXPECT_EQ(best.options.issue_order.front(), c1);
  EXPECT_GE(best.options.collectives_in_flight, 1u);
}

TEST(StepSimulator, ComputeHidesACollectiveBesideIt) {
  // a (1 ms) -> c (2 ms alone) -> b (1 ms), and d (4 ms) beside them on a second worker.
  StepProfile p;
  auto a = add_compute(p, "a", 1 * ms), c = add_allreduce(p, "c", 2'000'000),
       b = add_compute(p, "b", 1 * ms);
  add_compute(p, "d", 4 * ms);
  p.edges = {{a, c}, {c, b}};
  const Prediction r = simulate(p, model(0, 1e-9), {.ranks = 2, .workers = 2});
  EXPECT_NEAR(r.step_s, 4 * ms, 1e-12);
  EXPECT_NEAR(r.comm_s, 2 * ms, 1e-12);
  EXPECT_NEAR(r.hidden_s, 2 * ms, 1e-12);
  EXPECT_NEAR(r.exposed_s, 0, 1e-12);
  EXPECT_NEAR(r.critical_path_s, 4 * ms, 1e-12);
  // One worker: d first (lowest id after a? no: a, then c's wait, d takes the worker) — a
  // runs 0-1, d 1-5, c on the wire 1-3, b 5-6.
  const Prediction one = simulate(p, model(0, 1e-9), {.ranks = 2, .workers = 1});
  EXPECT_NEAR(one.step_s, 6 * ms, 1e-12);
  EXPECT_NEAR(one.exposed_s, 0, 1e-12);
}

TEST(StepSimulator, ComputeAndTheWireShareOneCore) {
  // A 2 ms compute node and a 1 ms collective side by side on one core; the transport needs a
  // whole core while on the wire: both run at half speed until the collective ends at 2 ms
  // (1 ms of compute done), then compute alone: 3 ms. Half a core for the transport: rate
  // 1 / 1.5 until the collective ends at 1.5 ms (1 ms of compute done), then 1 ms alone.
  StepProfile p;
  auto f = add_compute(p, "f", 2 * ms);
  auto c = add_allreduce(p, "c", 1'000'000);
  const NetworkModel net = model(0, 1e-9);
  const Prediction full = simulate(p, net, {.ranks = 2, .cores = 1, .comm_cpu = 1});
  EXPECT_NEAR(full.nodes[c].end_s, 2 * ms, 1e-12);
  EXPECT_NEAR(full.nodes[f].end_s, 3 * ms, 1e-12);
  const Prediction half = simulate(p, net, {.ranks = 2, .cores = 1, .comm_cpu = 0.5});
  EXPECT_NEAR(half.nodes[c].end_s, 1.5 * ms, 1e-12);
  EXPECT_NEAR(half.step_s, 2.5 * ms, 1e-12);
  // Two cores: no contention.
  EXPECT_NEAR(simulate(p, net, {.ranks = 2, .cores = 2, .comm_cpu = 1}).step_s, 2 * ms, 1e-12);
  expect_error(ErrorCode::invalid_argument, "simulate: comm_cpu must be >= 0",
               [&] { simulate(p, net, {.ranks = 2, .comm_cpu = -1}); });
}

TEST(StepSimulator, IssueOrderAgainstTheEdgesIsRefused) {
  StepProfile p;
  auto c1 = add_allreduce(p, "c1", 1000), x = add_compute(p, "x", 1 * ms),
       c2 = add_allreduce(p, "c2", 1000);
  p.edges = {{c1, x}, {x, c2}};
  expect_error(ErrorCode::invalid_argument,
               "cannot complete with this issue order ('c2' is next to issue but waits on a node",
               [&] {
                 simulate(p, model(0, 1e-9), {.ranks = 2, .issue_order = {c2, c1}});
               });
  expect_error(ErrorCode::invalid_argument, "simulate: the issue order lacks 'c2'",
               [&] { simulate(p, model(0, 1e-9), {.ranks = 2, .issue_order = {c1}}); });
  expect_error(ErrorCode::invalid_argument,
               "simulate: issue order entry 1 (node 'x') is not a communication node", [&] {
                 simulate(p, model(0, 1e-9), {.ranks = 2, .issue_order = {c1, x, c2}});
               });
  expect_error(ErrorCode::invalid_argument,
               "simulate: issue order entry 2 (node 'c1') repeats an earlier entry", [&] {
                 simulate(p, model(0, 1e-9), {.ranks = 2, .issue_order = {c1, c2, c1}});
               });
  expect_error(ErrorCode::invalid_argument,
               "simulate: issue order entry 1 (node 7) is out of range: the step has 3 nodes", [&] {
                 simulate(p, model(0, 1e-9), {.ranks = 2, .issue_order = {c1, 7}});
               });
  EXPECT_EQ(default_issue_order(p), (std::vector<std::size_t>{c1, c2}));
}

TEST(NetworkModel, CostsAtRankCountsThatAreNotPowersOfTwo) {
  const NetworkModel net = model(10e-6, 1e-9);
  // 3 ranks, 3 MB: ring 2(p-1) C alpha + 2 (p-1)/p n beta, its 1 MB blocks sent as C = 8
  // chunks of 125 kB (ring_allreduce.cpp) = 320 us + 4 ms; recursive doubling and Rabenseifner
  // fold (3 n beta and more), binomial tree 4 (alpha + n beta).
  const CollectiveCost three = net.collective(Collective::allreduce, 3'000'000, 3);
  EXPECT_EQ(three.algorithm, Algorithm::ring);
  EXPECT_NEAR(three.seconds, 4.32e-3, 1e-12);
  // 5 ranks, 1 MB: 200 kB blocks in 4 chunks of 64 KiB (the smallest chunk): 320 us + 1.6 ms.
  EXPECT_NEAR(net.collective(Collective::allreduce, 1'000'000, 5).seconds, 1.92e-3, 1e-12);
  // 2 ranks, 8 bytes: recursive doubling's alpha + n beta beats ring's 2 alpha.
  const CollectiveCost tiny = net.collective(Collective::allreduce, 8, 2);
  EXPECT_EQ(tiny.algorithm, Algorithm::recursive_doubling);
  EXPECT_NEAR(tiny.seconds, 10e-6 + 8e-9, 1e-15);
  EXPECT_EQ(net.collective(Collective::allreduce, 1'000'000, 1).seconds, 0);
  EXPECT_NEAR(net.point_to_point(1000), 11e-6, 1e-15);
}

TEST(NetworkModel, FromALinkAndFittedToAProfile) {
  const NetworkModel link = NetworkModel::from_link(2e9, 20e-6);
  EXPECT_NEAR(link.tuning().cost.beta_s_per_byte, 4e-9, 1e-20);
  EXPECT_NEAR(link.tuning().cost.alpha_s, 20e-6, 1e-15);
  // One 1 MB allreduce at 2 ranks measured at 2 ms: the fitted wire gives it 2 ms.
  StepProfile p;
  p.ranks = 2;
  p.measured_comm_s = 2 * ms;
  add_allreduce(p, "c", 1'000'000);
  const NetworkModel fit = NetworkModel::fitted(p, 0);
  EXPECT_NEAR(fit.collective(Collective::allreduce, 1'000'000, 2).seconds, 2 * ms, 1e-8);
  // A step that computed 7 of its 10 ms spent 3 ms on the wire, whatever rank 0's own
  // intervals say; one that computed 9 ms keeps the intervals' 2 ms.
  p.measured_step_s = 10 * ms;
  p.measured_compute_s = 7 * ms;
  EXPECT_NEAR(NetworkModel::fitted(p, 0).collective(Collective::allreduce, 1'000'000, 2).seconds,
              3 * ms, 1e-8);
  p.measured_compute_s = 9 * ms;
  EXPECT_NEAR(NetworkModel::fitted(p, 0).collective(Collective::allreduce, 1'000'000, 2).seconds,
              2 * ms, 1e-8);
  p.measured_comm_s = 0;
  expect_error(ErrorCode::invalid_argument, "fitting the wire needs the profile's measured_comm_s",
               [&] { NetworkModel::fitted(p, 0); });
}

TEST(NetworkModel, ParsesRatesAndDurations) {
  EXPECT_DOUBLE_EQ(parse_link_rate("2gbit"), 2e9);
  EXPECT_DOUBLE_EQ(parse_link_rate("100Gbit"), 100e9);
  EXPECT_DOUBLE_EQ(parse_link_rate("500mbit"), 500e6);
  EXPECT_DOUBLE_EQ(parse_link_rate("1gbps"), 8e9);
  EXPECT_DOUBLE_EQ(parse_duration("20us"), 20e-6);
  EXPECT_DOUBLE_EQ(parse_duration("1.5ms"), 1.5e-3);
  EXPECT_DOUBLE_EQ(parse_duration("0"), 0);
  expect_error(ErrorCode::invalid_argument, "bad link rate 'fast'",
               [] { parse_link_rate("fast"); });
  expect_error(ErrorCode::invalid_argument, "bad link rate '2gbits': unknown unit 'gbits'",
               [] { parse_link_rate("2gbits"); });
  expect_error(ErrorCode::invalid_argument, "link rate '0gbit' is 0",
               [] { parse_link_rate("0gbit"); });
  // Named, but not why (negative).
  expect_error(ErrorCode::invalid_argument, "bad duration '-1us'", [] { parse_duration("-1us"); });
}

}  // namespace
}  // namespace loom
