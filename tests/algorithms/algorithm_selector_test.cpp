// AlgorithmSelector: the cost formulas against hand-computed values, measured tables,
// overrides from the environment, fallback when a candidate cannot run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "expect_error.hpp"
#include "loom/algorithm_selector.hpp"
#include "loom/error.hpp"
#include "loom/local.hpp"
#include "scoped_env.hpp"

namespace loom {
namespace {

using test::expect_error;

TuningParameters simple_model() {
  TuningParameters t;
  t.backend = "local";
  t.cost = {1e-6, 1e-9, 1e-9};  // alpha 1 us, beta = gamma = 1 ns/B
  return t;
}

CollectiveArgs allreduce_of(std::vector<float>& v) {
  return {Collective::allreduce, Buffer::of(std::span(v)), Buffer::of(std::span(v)), ReduceOp::sum,
          0};
}

TEST(AlgorithmSelector, FormulasMatchHandComputedValues) {
  const AlgorithmSelector s(simple_model());
  const double n = 1 << 20, a = 1e-6, g = 1e-9;
  // p = 4: ring 2(p-1) C a + 2(p-1)/p n b + (p-1)/p n g, C = 4 chunks of 64 KiB per 256 KiB
  // block (the implementation's chunking: about 8 per block, at least 64 KiB each).
  EXPECT_DOUBLE_EQ(s.predict(Algorithm::ring, Collective::allreduce, n, 4),
                   6 * 4 * a + 1.5 * n * g + 0.75 * n * g);
  EXPECT_DOUBLE_EQ(s.predict(Algorithm::ring, Collective::allreduce, 4096, 4),
                   6 * a + 1.5 * 4096 * g + 0.75 * 4096 * g);
  // rd: log p (a + n b + n g).
  EXPECT_DOUBLE_EQ(s.predict(Algorithm::recursive_doubling, Collective::allreduce, n, 4),
                   2 * (a + 2 * n * g));
  // Rabenseifner: 2 log p a + 2 (p-1)/p n b + (p-1)/p n g.
  EXPECT_DOUBLE_EQ(s.predict(Algorithm::rabenseifner, Collective::allreduce, n, 4),
                   4 * a + 1.5 * n * g + 0.75 * n * g);
  // p = 3 folds onto 2: rd pays 2(a + n b) + n g more than for p = 2.
  EXPECT_DOUBLE_EQ(s.predict(Algorithm::recursive_doubling, Collective::allreduce, n, 3),
                   (a + 2 * n * g) + 2 * (a + n * g) + n * g);
  EXPECT_DOUBLE_EQ(s.predict(Algorithm::binomial_tree, Collective::broadcast, n, 5),
                   3 * (a + n * g));
  EXPECT_EQ(s.predict(Algorithm::ring, Collective::allreduce, n, 1), 0);
}

TEST(AlgorithmSelector, ModelPrefersLatencyOptimalSmallAndBandwidthOptimalLarge) {
  TuningParameters t = simple_model();
  // A native fit far slower than loom's algorithms, so the model's choice is visible.
  t.native.push_back({Collective::allreduce, 4, 1.0, 0});
  const AlgorithmSelector s(t);
  LocalWorld world(4);
  std::vector<float> small(16), large(1 << 22);
  const auto a = s.choose(allreduce_of(small), world.backend(0));
  EXPECT_EQ(a.algorithm, Algorithm::recursive_doubling) << a.reason;
  EXPECT_EQ(a.reason, "model");
  // 16 MiB on 4 ranks: Rabenseifner and ring move the same bytes (2 (p-1)/p n beta) and reduce
  // the same (p-1)/p n gamma; they differ in latency alone. Rabenseifner pays 2 log2(4) = 4
  // alpha, ring 2 (p-1) = 6 steps of 8 chunks each (a 4 MiB block in 512 KiB chunks) = 48 alpha:
  // Rabenseifner wins by 44 us. rd (2 (alpha + n beta + n gamma), about 67 ms) and the binomial
  // tree (about 101 ms) move the whole vector per step; native's fit is 1 s.
  const auto b = s.choose(allreduce_of(large), world.backend(0));
  EXPECT_EQ(b.algorithm, Algorithm::rabenseifner) << b.reason;
  EXPECT_EQ(b.reason, "model");
  const double n = 16.0 * (1 << 20);
  EXPECT_DOUBLE_EQ(b.predicted_s, 4e-6 + 1.5 * n * 1e-9 + 0.75 * n * 1e-9);
  EXPECT_NEAR(s.predict(Algorithm::ring, Collective::allreduce, n, 4) - b.predicted_s, 44e-6,
              1e-12);
}

TEST(AlgorithmSelector, WithoutAFitNativeWinsTies) {
  const AlgorithmSelector s;  // defaults: no native fit
  LocalWorld world(4);
  std::vector<float> v(1000);
  EXPECT_EQ(s.choose(allreduce_of(v), world.backend(0)).algorithm, Algorithm::native);
  EXPECT_TRUE(s.using_defaults());
}

TEST(AlgorithmSelector, WithoutAFitALargeAllreduceGoesToABandwidthOptimalAlgorithm) {
  // Untuned, native allreduce is modelled as the latency-optimal forms (the whole buffer per
  // step), which is what Open MPI 4.1 measured like from 4 MiB up: a large allreduce must not
  // go to native by winning a tie with ring or Rabenseifner.
  const AlgorithmSelector s;
  for (int ranks : {2, 4}) {
    LocalWorld world(ranks);
    std::vector<float> large(std::size_t{8} << 20);  // 32 MiB
    const auto c = s.choose(allreduce_of(large), world.backend(0));
    // Rabenseifner: the same bytes as ring in far fewer messages (ring's chunks).
    EXPECT_EQ(c.algorithm, Algorithm::rabenseifner)
        << ranks << " ranks: " << to_string(c.algorithm) << " (" << c.reason << ")";
    const std::size_t bytes = large.size() * sizeof(float);
    EXPECT_DOUBLE_EQ(
        s.predict(Algorithm::native, Collective::allreduce, bytes, ranks),
        std::min(s.predict(Algorithm::recursive_doubling, Collective::allreduce, bytes, ranks),
                 s.predict(Algorithm::binomial_tree, Collective::allreduce, bytes, ranks)));
  }
}

// Untuned, a backend's native reduce-scatter is modelled as reducing and sending the whole buffer
// per step (Open MPI 4.1's measured 5x loom's ring at 67 MB on vader): a large one goes to a
// bandwidth-optimal algorithm.
TEST(AlgorithmSelector, WithoutAFitALargeReduceScatterLeavesNative) {
  const AlgorithmSelector s;
  for (int ranks : {2, 3, 4}) {
    LocalWorld world(ranks);
    std::vector<float> large(std::size_t{6} << 20), shard(large.size() / ranks);
    const CollectiveArgs big{Collective::reduce_scatter, Buffer::of(std::span(large)),
                             Buffer::of(std::span(shard)), ReduceOp::sum, 0};
    const auto c = s.choose(big, world.backend(0));
    EXPECT_TRUE(c.algorithm == Algorithm::ring || c.algorithm == Algorithm::recursive_halving)
        << ranks << " ranks: " << to_string(c.algorithm) << " (" << c.reason << ")";
    const std::size_t bytes = large.size() * sizeof(float);
    const CostParameters cost = default_tuning().cost;
    EXPECT_DOUBLE_EQ(
        s.predict(Algorithm::native, Collective::reduce_scatter, bytes, ranks),
        std::ceil(std::log2(ranks)) *
            (cost.alpha_s + double(bytes) * (cost.beta_s_per_byte + cost.gamma_s_per_byte)));
  }
}

// On two levels (2 nodes x 2 ranks, 2 x 3) the model picks hierarchical for large allreduces
// and, at 2 x 2, a latency-optimal one for small; on one node, or one rank per node, never. (At 2 +
// 1 + 3 its leader-based form, recursive doubling with the fold among 3 nodes, moves more over a
// node's link than the flat ring, and the model says so.)
// Hierarchical broadcast, allgather and reduce_scatter on two levels: a broadcast crosses each
// link once where the flat tree crosses it log2(p) times, so at 2 x 4 and 64 MiB the model takes
// it (3 crossings at 10 beta against 1 and 3 copies at beta inside the node); on one node it is
// infinite.
TEST(AlgorithmSelector, HierarchicalBroadcastAllgatherReduceScatterOnTwoLevels) {
  const AlgorithmSelector s(simple_model());
  const Topology two_by_four = Topology::blocks(8, 4);
  const std::size_t n = 64u << 20;
  EXPECT_LT(s.predict(Algorithm::hierarchical, Collective::broadcast, n, two_by_four),
            s.predict(Algorithm::binomial_tree, Collective::broadcast, n, two_by_four) / 2);
  for (Collective op : {Collective::allgather, Collective::reduce_scatter})
    EXPECT_TRUE(std::isfinite(s.predict(Algorithm::hierarchical, op, n, two_by_four)));
  for (Collective op : {Collective::broadcast, Collective::allgather, Collective::reduce_scatter})
    EXPECT_TRUE(std::isinf(s.predict(Algorithm::hierarchical, op, n, Topology::single_node(8))));
  std::vector<float> data(n / 4);
  LocalWorld world(two_by_four);
  const CollectiveArgs broadcast{Collective::broadcast, Buffer::of(std::span(data)),
                                 Buffer::of(std::span(data)), ReduceOp::sum, 0};
  EXPECT_EQ(s.choose(broadcast, world.backend(0)).algorithm, Algorithm::hierarchical);
}

// A measured inter-node level replaces the model's beta x inter_node_beta_factor: at 2 x 2 and
// 16 MiB, ring's flat messages all cross the link (2(p-1)/p n of them at the inter-node beta)
// and its alpha is the inter-node one; a link as fast as memory leaves hierarchical's
// shorter crossings less to save: its lead over the flat ring shrinks.
TEST(AlgorithmSelector, AMeasuredInterNodeLevelReplacesTheFactor) {
  const Topology two_by_two = Topology::blocks(4, 2);
  const std::size_t n = 16u << 20;
  TuningParameters slow = simple_model();
  slow.inter_node = CostParameters{1e-6, 10e-9, 0};  // as the factor would make it
  const AlgorithmSelector by_factor(simple_model()), measured_alike(slow);
  for (Algorithm a : {Algorithm::ring, Algorithm::hierarchical, Algorithm::recursive_doubling})
    EXPECT_DOUBLE_EQ(measured_alike.predict(a, Collective::allreduce, n, two_by_two),
                     by_factor.predict(a, Collective::allreduce, n, two_by_two))
        << to_string(a);
  TuningParameters fast = simple_model();
  fast.inter_node = CostParameters{1e-6, 1e-9, 0};  // the link as fast as memory
  const AlgorithmSelector flat_link(fast);
  // ring: 2(p-1) chunked steps of alpha, 2(p-1)/p n at the link's beta, (p-1)/p n of reduction
  const double ring_fast = flat_link.predict(Algorithm::ring, Collective::allreduce, n, two_by_two);
  EXPECT_DOUBLE_EQ(ring_fast, flat_link.predict(Algorithm::ring, Collective::allreduce, n, 4));
  const double lead_fast =
      ring_fast / flat_link.predict(Algorithm::hierarchical, Collective::allreduce, n, two_by_two);
  const double lead_slow =
      measured_alike.predict(Algorithm::ring, Collective::allreduce, n, two_by_two) /
      measured_alike.predict(Algorithm::hierarchical, Collective::allreduce, n, two_by_two);
  EXPECT_GT(lead_slow, 1.3);  // 1.5 n against about n across the slow link
  EXPECT_LT(lead_fast, lead_slow - 0.2);
  // The inter-node alpha counts per message that crosses: a 1 ms link alpha makes an 8 B
  // allreduce cost at least one crossing's alpha.
  TuningParameters far = simple_model();
  far.inter_node = CostParameters{1e-3, 10e-9, 0};
  EXPECT_GT(AlgorithmSelector(far).predict(Algorithm::recursive_doubling, Collective::allreduce, 8,
                                           two_by_two),
            1e-3);
}

// Hierarchical allreduce's model by hand (a = 1 us, b = g = 1 ns/B, the link 10 b), for a
// vector of n bytes in C pipelined chunks of c = n / C (hierarchical_chunks: one per MiB, at
// most 16) on N nodes of 2 ranks. A chunk's stages: the intra-node reduce-scatter (a + c/2 b),
// the inter-node ones, the allgather (a + c b); at step s chunk j is at stage s - j and a step
// costs its slowest stage; the reductions (the reduce-scatter's n/2 g and the inter-node ones)
// run between steps. On 3 nodes the inter-node phase is a ring of 4 steps (a + c/3 10 b, two
// of them reducing a block) once a block of the whole vector (n/2/3) holds 64 KiB; below,
// recursive doubling with the fold: fold, exchange, unfold (a + c 10 b each), each but the
// unfold reducing a shard. On 2 nodes, one exchange between an empty fold and unfold.
TEST(AlgorithmSelector, HierarchicalAllreducePipelinesAndRingsBetweenThreeNodesOrMore) {
  const AlgorithmSelector s(simple_model());
  const Topology three_by_two = Topology::blocks(6, 2);
  const double a = 1e-6, b = 1e-9, g = 1e-9, bi = 10e-9;
  auto model = [&](std::size_t bytes, const Topology& t) {
    return s.predict(Algorithm::hierarchical, Collective::allreduce, bytes, t);
  };
  const std::size_t big = 64u << 20, edge = 2 * 3 * (64u << 10);
  {  // 64 MiB on 3 x 2: 16 chunks, 6 stages, 21 steps: the scatter alone, 19 steps with a ring
     // step (the slowest), the gather alone.
    const double n = big, c = n / 16;
    const double by_hand = (a + c / 2 * b) + 19 * (a + c / 3 * bi) + (a + c / 2 * b) + (n / 2) * g +
                           2 * (n / 2 / 3) * g;
    EXPECT_NEAR(model(big, three_by_two), by_hand, 1e-9 * by_hand);
    // Unpipelined recursive doubling would carry the vector across 3 times (3 n 10 b).
    EXPECT_LT(by_hand, 3 * n * bi / 2);
  }
  {  // 384 KiB: one chunk, the ring (blocks of 64 KiB).
    const double n = edge;
    const double by_hand = (a + n / 2 * b) + 4 * (a + n / 3 * bi) + (a + n / 2 * b) + (n / 2) * g +
                           2 * (n / 2 / 3) * g;
    EXPECT_NEAR(model(edge, three_by_two), by_hand, 1e-9 * by_hand);
  }
  {  // 8 bytes less: recursive doubling.
    const double n = edge - 8;
    const double by_hand =
        (a + n / 2 * b) + 3 * (a + n * bi) + (a + n / 2 * b) + (n / 2) * g + 2 * (n / 2) * g;
    EXPECT_NEAR(model(edge - 8, three_by_two), by_hand, 1e-9 * by_hand);
  }
  {  // 64 MiB on 2 x 2: stages scatter, exchange, gather (no fold: 2 is a power of two); 18
     // steps: the scatter alone, 16 with an exchange, the gather alone.
    const double n = big, c = n / 16;
    const double by_hand =
        (a + c / 2 * b) + 16 * (a + c * bi) + (a + c / 2 * b) + (n / 2) * g + (n / 2) * g;
    EXPECT_NEAR(model(big, Topology::blocks(4, 2)), by_hand, 1e-9 * by_hand);
  }
}

TEST(AlgorithmSelector, HierarchicalOnlyOnSeveralNodesAndForLargeSizes) {
  for (const AlgorithmSelector& s : {AlgorithmSelector(simple_model()), AlgorithmSelector()}) {
    std::vector<float> large(16u << 20), small(8);
    for (const Topology& t : {Topology::blocks(4, 2), Topology::blocks(6, 3)}) {
      LocalWorld two_levels(t);
      EXPECT_EQ(s.choose(allreduce_of(large), two_levels.backend(0)).algorithm,
                Algorithm::hierarchical)
          << t.describe();
      // At 2 x 2 recursive doubling takes as few steps (2) as hierarchical (3 with its
      // intra-node ones): small sizes stay flat. (At 2 x 3 hierarchical's 3 steps beat the
      // fold's 4, and the model takes it for every size.)
      if (t.world_size() == 4)
        EXPECT_NE(s.choose(allreduce_of(small), two_levels.backend(0)).algorithm,
                  Algorithm::hierarchical);
      EXPECT_LT(s.predict(Algorithm::hierarchical, Collective::allreduce, 64u << 20, t),
                s.predict(Algorithm::ring, Collective::allreduce, 64u << 20, t));
    }
    for (const Topology& t : {Topology::single_node(4), Topology::node_per_rank(3)}) {
      LocalWorld flat(t);
      for (std::vector<float>* v : {&large, &small}) {
        const AlgorithmChoice c = s.choose(allreduce_of(*v), flat.backend(0));
        EXPECT_NE(c.algorithm, Algorithm::hierarchical) << t.describe();
        EXPECT_EQ(c.reason.find("hierarchical"), std::string::npos) << c.reason;
        EXPECT_DOUBLE_EQ(
            s.predict(Algorithm::ring, Collective::allreduce, v->size() * 4, t),
            s.predict(Algorithm::ring, Collective::allreduce, v->size() * 4, t.world_size()));
      }
    }
  }
}

TEST(AlgorithmSelector, MeasurementsBeatTheModelNearTheirSize) {
  TuningParameters t = simple_model();
  t.measured.push_back({Collective::allreduce, 4, 4096, Algorithm::native, 50e-6});
  t.measured.push_back({Collective::allreduce, 4, 4096, Algorithm::binomial_tree, 20e-6});
  t.measured.push_back({Collective::allreduce, 4, 4096, Algorithm::ring, 30e-6});
  const AlgorithmSelector s(t);
  LocalWorld world(4);
  std::vector<float> v(1024);  // 4096 bytes
  const auto c = s.choose(allreduce_of(v), world.backend(0));
  EXPECT_EQ(c.algorithm, Algorithm::binomial_tree);
  EXPECT_EQ(c.reason, "measured");
  EXPECT_DOUBLE_EQ(c.predicted_s, 20e-6);
  std::vector<float> far(1 << 20);  // 4 MiB: no measurement within a factor of two
  EXPECT_NE(s.choose(allreduce_of(far), world.backend(0)).reason, "measured");
  LocalWorld other(3);  // measured at 4 ranks only
  EXPECT_NE(s.choose(allreduce_of(v), other.backend(0)).reason, "measured");
}

TEST(AlgorithmSelector, BetweenMeasuredSizesTimesAreInterpolatedOnLogLogAxes) {
  TuningParameters t = simple_model();
  // native grows slowly, tree fast: at 8 KiB (between 4 and 16 KiB) the log-log line gives
  // native sqrt(50 * 60) = 54.8 us and tree sqrt(20 * 200) = 63.2 us, so native wins although
  // tree was the faster one at the nearer-by-linear-distance 4 KiB.
  t.measured.push_back({Collective::allreduce, 4, 4096, Algorithm::native, 50e-6});
  t.measured.push_back({Collective::allreduce, 4, 4096, Algorithm::binomial_tree, 20e-6});
  t.measured.push_back({Collective::allreduce, 4, 16384, Algorithm::native, 60e-6});
  t.measured.push_back({Collective::allreduce, 4, 16384, Algorithm::binomial_tree, 200e-6});
  // ring measured at 16 KiB only (say it could not run at 4 KiB): its nearest measurement.
  t.measured.push_back({Collective::allreduce, 4, 16384, Algorithm::ring, 56e-6});
  const AlgorithmSelector s(t);
  LocalWorld world(4);
  std::vector<float> v(2048);  // 8192 bytes
  const auto c = s.choose(allreduce_of(v), world.backend(0));
  EXPECT_EQ(c.algorithm, Algorithm::native) << c.reason;
  EXPECT_EQ(c.reason, "measured");
  EXPECT_NEAR(c.predicted_s, std::sqrt(50e-6 * 60e-6), 1e-12);
  // At 12 KiB tree is interpolated at 20 * 10^(log2(3) / 2) us, ring taken from 16 KiB (a
  // factor 4/3 away) beats native's 50 * 1.2^(log2(3) / 2) = 57.8 us.
  std::vector<float> w(3072);  // 12288 bytes
  const auto d = s.choose(allreduce_of(w), world.backend(0));
  EXPECT_EQ(d.algorithm, Algorithm::ring) << d.reason << " " << d.predicted_s;
  EXPECT_DOUBLE_EQ(d.predicted_s, 56e-6);
  // Past the table by more than a factor of two: no measurement applies, the model decides.
  std::vector<float> far(1 << 14);  // 64 KiB, four times the largest measured size
  EXPECT_EQ(s.choose(allreduce_of(far), world.backend(0)).reason, "model");
}

TEST(AlgorithmSelector, ALeadOverNativeInsideTheSpreadsKeepsNative) {
  TuningParameters t = simple_model();
  // 4 KiB: rd's median is 8% below native's, but 92 + 4 us still reaches native's 100 - 5 us.
  t.measured.push_back({Collective::allreduce, 2, 4096, Algorithm::native, 100e-6, 5e-6});
  t.measured.push_back(
      {Collective::allreduce, 2, 4096, Algorithm::recursive_doubling, 92e-6, 4e-6});
  // 16 KiB: rd's lead (88 + 4 < 95 us) is larger than the spreads.
  t.measured.push_back({Collective::allreduce, 2, 16384, Algorithm::native, 100e-6, 5e-6});
  t.measured.push_back(
      {Collective::allreduce, 2, 16384, Algorithm::recursive_doubling, 88e-6, 4e-6});
  const AlgorithmSelector s(t);
  LocalWorld world(2);
  std::vector<float> close(1024), clear(4096);
  const auto a = s.choose(allreduce_of(close), world.backend(0));
  EXPECT_EQ(a.algorithm, Algorithm::native) << a.reason;
  EXPECT_DOUBLE_EQ(a.predicted_s, 100e-6);
  const auto b = s.choose(allreduce_of(clear), world.backend(0));
  EXPECT_EQ(b.algorithm, Algorithm::recursive_doubling) << b.reason;
  EXPECT_EQ(b.reason, "measured");
  // Without spreads (an older file) the faster median wins as before, by more than 3%.
  TuningParameters bare = t;
  for (Measurement& m : bare.measured) m.spread_seconds = 0;
  EXPECT_EQ(AlgorithmSelector(bare).choose(allreduce_of(close), world.backend(0)).algorithm,
            Algorithm::recursive_doubling);
  // A lead of 3% or less over native is not taken, however tight the spreads (TCP at 32 KiB:
  // every candidate within 0.6% of the shaped wire): 97.5 + 0.1 us against native's 100 us.
  TuningParameters tie = simple_model();
  tie.measured.push_back({Collective::allreduce, 2, 32768, Algorithm::native, 100e-6, 0});
  tie.measured.push_back(
      {Collective::allreduce, 2, 32768, Algorithm::rabenseifner, 97.5e-6, 0.1e-6});
  std::vector<float> tied(8192);
  const auto c = AlgorithmSelector(tie).choose(allreduce_of(tied), world.backend(0));
  EXPECT_EQ(c.algorithm, Algorithm::native) << c.reason;
  EXPECT_DOUBLE_EQ(c.predicted_s, 100e-6);
  // 96.5 + 0.1 us: a lead above the margin is taken.
  tie.measured.back().seconds = 96.5e-6;
  EXPECT_EQ(AlgorithmSelector(tie).choose(allreduce_of(tied), world.backend(0)).algorithm,
            Algorithm::rabenseifner);
}

// Native's blocking call and its polled nonblocking one are timed apart (TimingForm): each
// call is chosen from its own form's table, lines without a form count for both, and a table
// timed in one form only serves both.
TEST(AlgorithmSelector, EachFormIsChosenFromItsOwnTable) {
  TuningParameters t = simple_model();
  // As measured over TCP at 2 ranks: MPI_Allreduce beats rd at 1 KiB, MPI_Iallreduce polled
  // to completion loses to it; at 1 MiB (no form: both tables) ring wins either way.
  t.measured.push_back(
      {Collective::allreduce, 2, 1024, Algorithm::native, 16e-6, 0, TimingForm::blocking});
  t.measured.push_back(
      {Collective::allreduce, 2, 1024, Algorithm::native, 29e-6, 0, TimingForm::asynchronous});
  for (TimingForm form : {TimingForm::blocking, TimingForm::asynchronous})
    t.measured.push_back(
        {Collective::allreduce, 2, 1024, Algorithm::recursive_doubling, 18e-6, 0, form});
  t.measured.push_back({Collective::allreduce, 2, 1 << 20, Algorithm::native, 10e-3});
  t.measured.push_back({Collective::allreduce, 2, 1 << 20, Algorithm::ring, 8e-3});
  const AlgorithmSelector s(t);
  LocalWorld world(2);
  std::vector<float> small(256), large(1 << 18);
  const auto blocking = s.choose(allreduce_of(small), world.backend(0), TimingForm::blocking);
  EXPECT_EQ(blocking.algorithm, Algorithm::native) << blocking.reason;
  EXPECT_DOUBLE_EQ(blocking.predicted_s, 16e-6);
  const auto polled = s.choose(allreduce_of(small), world.backend(0));  // asynchronous
  EXPECT_EQ(polled.algorithm, Algorithm::recursive_doubling) << polled.reason;
  EXPECT_EQ(polled.reason, "measured");
  for (TimingForm form : {TimingForm::blocking, TimingForm::asynchronous})
    EXPECT_EQ(s.choose(allreduce_of(large), world.backend(0), form).algorithm, Algorithm::ring);
  // A table of the blocking form only (loom-tune without --async) serves asynchronous calls.
  TuningParameters one = simple_model();
  for (const Measurement& m : t.measured)
    if (m.form == TimingForm::blocking) one.measured.push_back(m);
  const auto served = AlgorithmSelector(one).choose(allreduce_of(small), world.backend(0));
  EXPECT_EQ(served.algorithm, Algorithm::native) << served.reason;
  EXPECT_EQ(served.reason, "measured");
  try {
    s.choose(allreduce_of(small), world.backend(0), TimingForm::unknown);
    ADD_FAILURE() << "chose for an unknown form";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("blocking or asynchronous, not unknown"),
              std::string::npos)
        << e.what();
  }
}

TEST(AlgorithmSelector, OverridesWinAndFallBackWhenTheyCannotRun) {
  AlgorithmSelector s(simple_model());
  s.set_override(Collective::allreduce, parse_algorithm_ranges("ring:0-1K;tree:1K-max"));
  LocalWorld world(3);
  std::vector<float> two(2), many(1000);
  const auto big = s.choose(allreduce_of(many), world.backend(0));
  EXPECT_EQ(big.algorithm, Algorithm::binomial_tree);
  EXPECT_EQ(big.reason, "override");
  const auto tiny = s.choose(allreduce_of(two), world.backend(0));
  EXPECT_NE(tiny.algorithm, Algorithm::ring);
  EXPECT_NE(tiny.reason.find("LOOM_ALLREDUCE chose ring, which cannot run (count 2 < 3 ranks"),
            std::string::npos)
      << tiny.reason;
  expect_error(ErrorCode::invalid_argument, "rabenseifner does not implement allgather", [&] {
    s.set_override(Collective::allgather, parse_algorithm_ranges("rabenseifner:0-max"));
  });
}

TEST(AlgorithmSelector, ModelFallsBackPastACandidateThatCannotRun) {
  TuningParameters t = simple_model();
  t.native.push_back({Collective::allreduce, 5, 1.0, 0});  // make native unattractive
  t.cost.alpha_s = 0;
  t.cost.beta_s_per_byte = 0;
  const AlgorithmSelector s(t);
  LocalWorld world(5);
  std::vector<float> send(3), recv(3);
  const CollectiveArgs args{Collective::allreduce, Buffer::of(std::span(send)),
                            Buffer::of(std::span(recv)), ReduceOp::sum, 0};
  const auto c = s.choose(args, world.backend(0));
  // Reductions alone: ring reduces (p-1)/p n, Rabenseifner 3/4 n + the fold's n, rd and the
  // tree 3 n each; ring and Rabenseifner need an element per rank, and 3 < 5.
  EXPECT_EQ(c.algorithm, Algorithm::recursive_doubling);
  EXPECT_NE(c.reason.find("fallback: ring cannot run (count 3 < 5 ranks"), std::string::npos)
      << c.reason;
  EXPECT_NE(c.reason.find("fallback: rabenseifner cannot run"), std::string::npos) << c.reason;
}

TEST(AlgorithmSelector, EnvironmentOverridesAndTuningFile) {
  test::ScopedEnv no_tuning("LOOM_TUNING_FILE", nullptr);
  {
    test::ScopedEnv ranges("LOOM_ALLREDUCE", "rd:0-8K;rabenseifner:8K-1M;ring:1M-max");
    const auto s = AlgorithmSelector::from_environment();
    LocalWorld world(2);
    std::vector<float> v(4096);  // 16 KiB
    EXPECT_EQ(s.choose(allreduce_of(v), world.backend(0)).algorithm, Algorithm::rabenseifner);
    EXPECT_TRUE(s.using_defaults());
  }
  {
    test::ScopedEnv overlapping("LOOM_ALLREDUCE", "rd:0-8K;ring:4K-max");
    try {
      AlgorithmSelector::from_environment();
      ADD_FAILURE() << "overlapping ranges accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("LOOM_ALLREDUCE"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("overlap"), std::string::npos) << e.what();
    }
  }
  {
    test::ScopedEnv broadcast("LOOM_BROADCAST", "ring:0-max");
    expect_error(ErrorCode::invalid_argument, "LOOM_BROADCAST: ring does not implement broadcast",
                 [] { AlgorithmSelector::from_environment(); });
  }
  const std::string path = ::testing::TempDir() + "/selector_test.tuning";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(
        "loom-tuning 1\nbackend local\nalpha_us 3\nbeta_ns_per_byte 0.5\n"
        "gamma_ns_per_byte 0.25\n",
        f);
    std::fclose(f);
  }
  {
    test::ScopedEnv tuning("LOOM_TUNING_FILE", path.c_str());
    const auto tuned = AlgorithmSelector::from_environment();
    EXPECT_FALSE(tuned.using_defaults());
    EXPECT_DOUBLE_EQ(tuned.tuning().cost.alpha_s, 3e-6);
  }
  test::ScopedEnv missing("LOOM_TUNING_FILE", "/nonexistent/file");
  expect_error(ErrorCode::invalid_argument, "cannot read the tuning file '/nonexistent/file'",
               [] { AlgorithmSelector::from_environment(); });
}

}  // namespace
}  // namespace loom
