// Tests of sim/cluster_network and NetworkModel::two_level: each algorithm's traffic through a
// node's link and memory computed by hand from its messages, at 2 x 2, 3 x 1, round-robin and
// uneven placements, and a step simulated on two levels.
#include "loom/cluster_network.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "expect_error.hpp"
#include "loom/error.hpp"
#include "loom/step_simulator.hpp"

namespace loom {
namespace {

using test::expect_error;

constexpr double MiB = 1 << 20;
constexpr std::size_t size = 64 << 20;
constexpr double gbit = 1e9;  // 125 MB/s each way

// The rates of the emulated cluster at 1 Gbit/s, with a memory so fast it does not count.
ClusterNetwork link_only(int nodes, int ranks_per_node) {
  return ClusterNetwork::uniform(nodes, ranks_per_node, gbit, 1e18);
}

TEST(ClusterNetwork, HierarchicalAtTwoByTwoMovesTheLinkBound) {
  const ClusterNetwork c = link_only(2, 2);
  const ClusterCost h = cluster_cost(c, Algorithm::hierarchical, Collective::allreduce, size);
  // Each node's 2 shard owners send their 32 MiB shard across at once: 64 MiB each way, the
  // bound 2 (n-1)/n size at n = 2 nodes.
  EXPECT_DOUBLE_EQ(h.link_bytes, 64 * MiB);
  EXPECT_NEAR(h.seconds, 64 * MiB / 125e6, 1e-9);
  EXPECT_NEAR(allreduce_link_bound(c, size), 64 * MiB / 125e6, 1e-12);
  // 16 pipelined chunks of 4 MiB through 3 stages (reduce-scatter, one exchange, allgather; no
  // fold or unfold at a power of two of nodes): 16 + 2 steps.
  EXPECT_EQ(h.steps, 18);
  // In the node: 32 MiB each way in the reduce-scatter and in the allgather.
  EXPECT_DOUBLE_EQ(h.memory_bytes, 128 * MiB);
}

TEST(ClusterNetwork, FlatRingCrossesTheLinkOncePerNodeInBlocksAndLTimesRoundRobin) {
  // Blocks: 1 -> 2 and 3 -> 0 cross; 2 (p-1) = 6 steps of size/4 each way: 1.5 size.
  const ClusterNetwork blocks = link_only(2, 2);
  const ClusterCost ring = cluster_cost(blocks, Algorithm::ring, Collective::allreduce, size);
  EXPECT_DOUBLE_EQ(ring.link_bytes, 1.5 * 64 * MiB);
  EXPECT_NEAR(ring.seconds, 1.5 * 64 * MiB / 125e6, 1e-9);
  EXPECT_EQ(ring.steps, 6);
  // Round-robin placement (0, 2 on node 0; 1, 3 on node 1): every ring edge crosses, so each
  // node's 2 ranks send at once: L = 2 times the traffic of the blocks' ring.
  const std::vector<int> round_robin{0, 1, 0, 1};
  const ClusterNetwork rr = blocks.on(Topology::from_node_ids(round_robin));
  const ClusterCost ring_rr = cluster_cost(rr, Algorithm::ring, Collective::allreduce, size);
  EXPECT_DOUBLE_EQ(ring_rr.link_bytes, 2 * ring.link_bytes);
  EXPECT_NEAR(ring_rr.seconds, 2 * ring.seconds, 1e-9);
  // Hierarchical follows the topology, not the rank order: the bound on both.
  EXPECT_NEAR(cluster_cost(rr, Algorithm::hierarchical, Collective::allreduce, size).seconds,
              64 * MiB / 125e6, 1e-9);
  // At 8 ranks per node in blocks the ring's bound is 2 (p-1)/p: 15/8 size against size.
  const ClusterCost ring8 =
      cluster_cost(link_only(2, 8), Algorithm::ring, Collective::allreduce, size);
  EXPECT_DOUBLE_EQ(ring8.link_bytes, 2.0 * 15 / 16 * 64 * MiB);
}

TEST(ClusterNetwork, ThreeNodesOfOneRankFoldAndUnfold) {
  const ClusterNetwork c = link_only(3, 1);
  // rd on 3: rank 0 hands its vector to 1, 1 and 2 exchange, 1 hands the result back.
  const ClusterCost rd =
      cluster_cost(c, Algorithm::recursive_doubling, Collective::allreduce, size);
  EXPECT_EQ(rd.steps, 3);
  EXPECT_DOUBLE_EQ(rd.link_bytes, 3 * 64 * MiB);
  // The ring: 4 steps of size/3, every edge across.
  const ClusterCost ring = cluster_cost(c, Algorithm::ring, Collective::allreduce, size);
  EXPECT_NEAR(ring.link_bytes, 4.0 / 3 * 64 * MiB, 1e-3);
  EXPECT_NEAR(ring.seconds, 4.0 / 3 * 64 * MiB / 125e6, 1e-9);
  // Hierarchical needs a node with several ranks.
  EXPECT_TRUE(
      std::isinf(cluster_cost(c, Algorithm::hierarchical, Collective::allreduce, size).seconds));
  EXPECT_TRUE(std::isinf(
      cluster_cost(link_only(1, 4), Algorithm::hierarchical, Collective::allreduce, size).seconds));
}

TEST(ClusterNetwork, UnevenPlacementRunsTheLeaderVariant) {
  // 2 + 1 + 3 ranks: m = 1 shard, so the leaders fold and exchange the whole vector.
  const std::vector<int> nodes{0, 0, 1, 2, 2, 2};
  const ClusterNetwork c = link_only(1, 1).on(Topology::from_node_ids(nodes));
  const ClusterCost h = cluster_cost(c, Algorithm::hierarchical, Collective::allreduce, size);
  // Gather to the leader, a ring of the 3 leaders (2 reduce-scatter and 2 allgather steps of
  // a third of the vector: hierarchical_inter_ring), broadcast: 6 stages, 16 chunks pipelined.
  EXPECT_EQ(h.steps, 16 + 5);
  EXPECT_DOUBLE_EQ(h.link_bytes, 4 * 64 * MiB / 3);
  // Node 2's leader takes 2 pieces of the whole vector and sends it to 2 ranks.
  EXPECT_DOUBLE_EQ(h.memory_bytes, 4 * 64 * MiB);
  // Below 64 KiB per block, recursive doubling: gather, fold (node 0 -> 1), exchange (1 <-> 2),
  // unfold, broadcast, the whole vector over the link three times.
  const double small = 128 * 1024;
  const ClusterCost folded = cluster_cost(c, Algorithm::hierarchical, Collective::allreduce, small);
  EXPECT_EQ(folded.steps, 5);
  EXPECT_DOUBLE_EQ(folded.link_bytes, 3 * small);
}

TEST(ClusterNetwork, ANodesRanksShareItsMemory) {
  // One node of 4 ranks at 1 GB/s: the ring moves 4 blocks of size/4 per step through the one
  // memory, 6 steps.
  const ClusterNetwork c = ClusterNetwork::uniform(1, 4, gbit, 1e9, 0, 2e-6);
  const ClusterCost ring = cluster_cost(c, Algorithm::ring, Collective::allreduce, size);
  EXPECT_DOUBLE_EQ(ring.link_bytes, 0);
  EXPECT_DOUBLE_EQ(ring.memory_bytes, 6 * 64 * MiB);
  EXPECT_NEAR(ring.seconds, 6 * (2e-6 + 64 * MiB / 1e9), 1e-9);
}

TEST(ClusterNetwork, LatencyAndReductionAddPerStep) {
  // 2 x 1, 10 us per message, 1 ns per byte reduced: rd is one exchange of the whole vector
  // and one reduction of it; the ring overlaps its reduction with the wire (pipelined).
  const ClusterNetwork c = ClusterNetwork::uniform(2, 1, gbit, 1e18, 10e-6, 0, 1e-9);
  const ClusterCost rd =
      cluster_cost(c, Algorithm::recursive_doubling, Collective::allreduce, size);
  EXPECT_NEAR(rd.seconds, 10e-6 + 64 * MiB / 125e6 + 64 * MiB * 1e-9, 1e-9);
  const ClusterCost ring = cluster_cost(c, Algorithm::ring, Collective::allreduce, size);
  EXPECT_NEAR(ring.seconds, 2 * (10e-6 + 32 * MiB / 125e6), 1e-9);
}

TEST(ClusterNetwork, OtherCollectives) {
  const ClusterNetwork c = link_only(2, 2);
  // Ring allgather of a 64 MiB result: 3 steps of 16 MiB, one edge per node across.
  EXPECT_DOUBLE_EQ(cluster_cost(c, Algorithm::ring, Collective::allgather, size).link_bytes,
                   3 * 16 * MiB);
  // Binomial broadcast from 0 on 4 ranks: 0 -> 2 across, then 0 -> 1 and 2 -> 3 inside.
  const ClusterCost tree = cluster_cost(c, Algorithm::binomial_tree, Collective::broadcast, size);
  EXPECT_DOUBLE_EQ(tree.link_bytes, 64 * MiB);
  EXPECT_EQ(tree.steps, 2);
  // rd allgather only at a power of two.
  EXPECT_TRUE(std::isinf(
      cluster_cost(link_only(3, 1), Algorithm::recursive_doubling, Collective::allgather, size)
          .seconds));
}

TEST(ClusterNetwork, HierarchicalAllgatherReduceScatterBroadcastCrossOncePerNode) {
  const ClusterNetwork c = link_only(2, 2);
  // Allgather of a 64 MiB result: each leader sends its node's two 16 MiB blocks across once;
  // the flat ring moves 3 blocks through each link.
  const ClusterCost gather = cluster_cost(c, Algorithm::hierarchical, Collective::allgather, size);
  EXPECT_DOUBLE_EQ(gather.link_bytes, 32 * MiB);
  EXPECT_EQ(gather.steps, 3);  // to the leader, the leaders' ring (1 step), to the node
  EXPECT_LT(gather.link_bytes,
            cluster_cost(c, Algorithm::ring, Collective::allgather, size).link_bytes);
  // Reduce_scatter of 64 MiB: the leaders trade the other node's two blocks.
  EXPECT_DOUBLE_EQ(
      cluster_cost(c, Algorithm::hierarchical, Collective::reduce_scatter, size).link_bytes,
      32 * MiB);
  // Broadcast: the vector crosses once, then the leader copies it to its node's other rank.
  const ClusterCost broadcast =
      cluster_cost(c, Algorithm::hierarchical, Collective::broadcast, size);
  EXPECT_DOUBLE_EQ(broadcast.link_bytes, 64 * MiB);
  EXPECT_DOUBLE_EQ(broadcast.memory_bytes, 64 * MiB);
  EXPECT_EQ(broadcast.steps, 2);
  // 2 + 1 + 3: the leaders' ring takes 2 steps, the busiest link 3 blocks (of 6) in each.
  const std::vector<int> nodes{0, 0, 1, 2, 2, 2};
  const ClusterNetwork uneven = c.on(Topology::from_node_ids(nodes));
  EXPECT_DOUBLE_EQ(
      cluster_cost(uneven, Algorithm::hierarchical, Collective::allgather, size).link_bytes,
      64 * MiB);
  EXPECT_TRUE(std::isinf(
      cluster_cost(link_only(3, 1), Algorithm::hierarchical, Collective::broadcast, size).seconds));
}

TEST(ClusterNetwork, BadInputIsNamed) {
  expect_error(ErrorCode::invalid_argument, "(got 0 nodes of 8 ranks)",
               [] { ClusterNetwork::uniform(0, 8, gbit, 1e9); });
  expect_error(ErrorCode::invalid_argument,
               "(got link 0.000000 bit/s, intra 1000000000.000000 B/s)",
               [] { ClusterNetwork::uniform(2, 8, 0, 1e9); });
  expect_error(ErrorCode::invalid_argument, "a cluster's link_latency_s must be >= 0 (got -1.0",
               [] { ClusterNetwork::uniform(2, 8, gbit, 1e9, -1); });
  expect_error(ErrorCode::invalid_argument, "a cluster's intra_latency_s must be >= 0 (got -2.0",
               [] { ClusterNetwork::uniform(2, 8, gbit, 1e9, 0, -2); });
  expect_error(ErrorCode::invalid_argument, "a cluster's gamma_s_per_byte must be >= 0 (got nan",
               [] { ClusterNetwork::uniform(2, 8, gbit, 1e9, 0, 0, std::nan("")); });
  try {
    cluster_cost(link_only(2, 2), Algorithm::bruck, Collective::allreduce, 8);
    FAIL() << "bruck allreduce accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("bruck does not implement allreduce"), std::string::npos)
        << e.what();
  }
  EXPECT_DOUBLE_EQ(parse_byte_rate("200GB/s"), 200e9);
  EXPECT_DOUBLE_EQ(parse_byte_rate("4.5gb/s"), 4.5e9);
  EXPECT_DOUBLE_EQ(parse_byte_rate("100gbit"), 12.5e9);
  // Without "/s" the text is read as a link rate, and named so.
  expect_error(ErrorCode::invalid_argument, "bad link rate 'fast'",
               [] { parse_byte_rate("fast"); });
  expect_error(ErrorCode::invalid_argument, "bad byte rate '5parsecs': unknown unit 'parsecs'",
               [] { parse_byte_rate("5parsecs/s"); });
}

TEST(NetworkModelTwoLevel, ChoosesPerSizeAndScale) {
  // 100 Gbit/s links, 200 GB/s inside, 5 us across, 1 us inside.
  const NetworkModel net =
      NetworkModel::two_level(ClusterNetwork::uniform(2, 4, 100 * gbit, 200e9, 5e-6, 1e-6));
  // 2 x 4, 64 MiB: hierarchical moves the bound (size); the blocks' ring 7/4 size.
  const CollectiveCost big = net.collective(Collective::allreduce, size, 8);
  EXPECT_EQ(big.algorithm, Algorithm::hierarchical);
  const ClusterCost ring =
      cluster_cost(net.cluster_at(8), Algorithm::ring, Collective::allreduce, size);
  EXPECT_LT(big.seconds, ring.seconds);
  // 128 x 4 (another rank count: nodes of 4): hierarchical's ring between the nodes
  // (hierarchical_inter_ring) moves 2(N-1)/N of the vector through each link, where recursive
  // doubling moved it 7 times; the flat ring moves as much through a link in 2(p-1) steps of
  // p = 512 ranks instead of 2(N-1) of N = 128 nodes: hierarchical wins at 64 MiB.
  const ClusterNetwork at_scale = net.cluster_at(512);
  EXPECT_EQ(at_scale.topology.node_count(), 128);
  const ClusterCost hierarchical =
      cluster_cost(at_scale, Algorithm::hierarchical, Collective::allreduce, size);
  EXPECT_DOUBLE_EQ(hierarchical.link_bytes, 2.0 * 127 / 128 * 64 * MiB);
  EXPECT_EQ(hierarchical.steps, 16 + 1 + 2 * 127);  // 16 chunks through 2 + 254 stages
  EXPECT_LT(hierarchical.seconds,
            cluster_cost(at_scale, Algorithm::ring, Collective::allreduce, size).seconds);
  EXPECT_EQ(net.collective(Collective::allreduce, size, 512).algorithm, Algorithm::hierarchical);
  // A send crosses the link.
  EXPECT_NEAR(net.point_to_point(12'500'000), 5e-6 + 1e-3, 1e-12);
  expect_error(ErrorCode::invalid_argument, "this network model has one level",
               [] { NetworkModel::from_link(gbit, 0).cluster_at(4); });
}

// 10 ms of compute, then an allreduce of 64 MiB that depends on it.
StepProfile compute_then_allreduce() {
  StepProfile p;
  p.nodes.push_back({.name = "backward", .kind = NodeKind::compute, .duration_s = 10e-3});
  p.nodes.push_back(
      {.name = "grads", .kind = NodeKind::collective, .op = Collective::allreduce, .bytes = size});
  p.edges = {{0, 1}};
  return p;
}

TEST(NetworkModelTwoLevel, SimulatesAStepOnTheCluster) {
  // compute 10 ms, then an allreduce of 64 MiB: the step is the compute plus the chosen
  // algorithm's time on 2 x 2 at 1 Gbit/s.
  const StepProfile p = compute_then_allreduce();
  const NetworkModel net = NetworkModel::two_level(ClusterNetwork::uniform(2, 2, gbit, 5e9));
  const Prediction r = simulate(p, net, {.ranks = 4});
  const double h =
      cluster_cost(net.cluster_at(4), Algorithm::hierarchical, Collective::allreduce, size).seconds;
  EXPECT_EQ(r.nodes[1].algorithm, "hierarchical");
  EXPECT_NEAR(r.step_s, 10e-3 + h, 1e-9);
  // 64 MiB / 125 MB/s across, 16 chunks of 4 MiB pipelined: each chunk's reduce-scatter and
  // allgather (2 MiB each way through the node's one memory at 5 GB/s) run beside another
  // chunk's exchange, except the step before the first exchange and the step after the last
  // (2 nodes: no fold or unfold stage between them).
  EXPECT_NEAR(h, 64 * MiB / 125e6 + 2 * (4 * MiB / 5e9), 1e-9);
}

TEST(NetworkModelTwoLevel, AllowOnlyAsksWhatTheStepWouldBeWithFlatAlgorithms) {
  // The same step as above, flat algorithms only: the ring (the cheapest flat one at 64 MiB on
  // 2 x 2) replaces hierarchical, and the step grows by the difference.
  const StepProfile p = compute_then_allreduce();
  NetworkModel net = NetworkModel::two_level(ClusterNetwork::uniform(2, 2, gbit, 5e9));
  const ClusterNetwork at = net.cluster_at(4);
  net.allow_only({Algorithm::ring, Algorithm::recursive_doubling, Algorithm::rabenseifner});
  const CollectiveCost flat = net.collective(Collective::allreduce, size, 4);
  EXPECT_NE(flat.algorithm, Algorithm::hierarchical);
  double cheapest = INFINITY;
  for (Algorithm a : {Algorithm::ring, Algorithm::recursive_doubling, Algorithm::rabenseifner})
    cheapest = std::min(cheapest, cluster_cost(at, a, Collective::allreduce, size).seconds);
  EXPECT_DOUBLE_EQ(flat.seconds, cheapest);
  EXPECT_GT(flat.seconds,
            cluster_cost(at, Algorithm::hierarchical, Collective::allreduce, size).seconds);
  const Prediction r = simulate(p, net, {.ranks = 4});
  EXPECT_NEAR(r.step_s, 10e-3 + cheapest, 1e-9);
  // None of the allowed applies (the tree is not an allgather algorithm): a named error, not a
  // silent fallback.
  net.allow_only({Algorithm::binomial_tree});
  try {
    net.collective(Collective::allgather, size, 4);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("none of the allowed algorithms (tree) applies to "
                                         "allgather at 4 ranks"),
              std::string::npos)
        << e.what();
  }
  // One level too.
  NetworkModel wire = NetworkModel::from_link(gbit, 5e-6);
  wire.allow_only({Algorithm::ring});
  EXPECT_EQ(wire.collective(Collective::allreduce, size, 4).algorithm, Algorithm::ring);
}

}  // namespace
}  // namespace loom
