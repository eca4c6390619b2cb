// MpiBackend::topology() on the emulated cluster (bench/cluster/cluster.sh): its nodes are the
// cluster's nodes (network namespaces with their own host names), rank for rank.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "backends/collective_checks.hpp"
#include "backends/forced_algorithm_backend.hpp"
#include "backends/mpi_world.hpp"
#include "loom/algorithm.hpp"
#include "loom/algorithm_selector.hpp"
#include "loom/topology.hpp"
#include "scoped_env.hpp"

namespace loom {
namespace {

using testing::expect_all_ranks_ok;
using testing::world;

std::vector<std::string> cluster_nodes() {
  const char* names = std::getenv("LOOM_CLUSTER_NODES");
  std::vector<std::string> nodes;
  std::istringstream in(names != nullptr ? names : "");
  for (std::string name; in >> name;) nodes.push_back(name);
  return nodes;
}

// The node of every rank: LOOM_CLUSTER_RANKS_PER_NODE ("2,1,3"), whose slots mpirun fills in
// turn.
std::vector<int> cluster_node_of_rank() {
  const char* counts = std::getenv("LOOM_CLUSTER_RANKS_PER_NODE");
  std::vector<int> node_of;
  std::istringstream in(counts != nullptr ? counts : "");
  int node = 0;
  for (std::string count; std::getline(in, count, ','); ++node)
    node_of.insert(node_of.end(), std::stoi(count), node);
  return node_of;
}

TEST(ClusterTopology, NodesAreTheClustersNodes) {
  const auto nodes = cluster_nodes();
  const auto node_of = cluster_node_of_rank();
  ASSERT_FALSE(nodes.empty()) << "LOOM_CLUSTER_NODES is not set: run under cluster.sh";
  ASSERT_EQ(world().world_size(), static_cast<int>(node_of.size()));
  const Topology& t = world().topology();
  // Named by the nodes' host names, which the MPI backend gathers.
  std::vector<std::string> name_of_rank;
  for (int node : node_of) name_of_rank.push_back(nodes.at(static_cast<std::size_t>(node)));
  const Topology expected = Topology::from_node_ids(node_of).with_node_names(name_of_rank);
  std::string failure;
  if (t != expected)
    failure = "rank " + std::to_string(world().rank()) + " sees " + t.describe() +
              ", the cluster is " + expected.describe();
  expect_all_ranks_ok(failure);
}

TEST(ClusterTopology, MyNodeIsTheHostIRunOn) {
  const auto nodes = cluster_nodes();
  ASSERT_FALSE(nodes.empty());
  const Topology& t = world().topology();
  const int rank = world().rank();
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string failure;
  const int node = t.node_of(rank);
  if (node >= static_cast<int>(nodes.size()) || nodes[node] != host)
    failure = "rank " + std::to_string(rank) + " runs on " + host + " but its node is " +
              std::to_string(node);
  else if (t.node_name(node) != host)
    failure = "rank " + std::to_string(rank) + " runs on " + host + " but its node is named '" +
              t.node_name(node) + "'";
  else if (t.leader_of_node(node) != rank - t.local_rank(rank))
    failure = "rank " + std::to_string(rank) + ": leader " +
              std::to_string(t.leader_of_node(node)) + ", local rank " +
              std::to_string(t.local_rank(rank));
  expect_all_ranks_ok(failure);
}

// Hierarchical allreduce across the cluster's nodes, chosen by LOOM_ALLREDUCE=hierarchical:0-max:
// exact sums, maxima and averages at counts below the rank count, odd and large; where the
// cluster has one rank per node the selector falls back to a flat algorithm and says why.
TEST(ClusterTopology, HierarchicalAllreduceIsExact) {
  Backend& b = world();
  const int n = b.world_size();
  const Topology& t = b.topology();
  const AlgorithmSelector selector = [] {
    test::ScopedEnv env("LOOM_ALLREDUCE", "hierarchical:0-max");
    return AlgorithmSelector::from_environment();
  }();
  const bool can = t.node_count() < n;
  std::string failure;
  for (std::size_t count : {std::size_t{1}, std::size_t{3}, std::size_t{7}, std::size_t{1} << 20,
                            (std::size_t{1} << 20) + 3}) {
    std::vector<double> sum(count), avg(count);
    std::vector<std::int32_t> max(count);
    for (std::size_t i = 0; i < count; ++i) {
      sum[i] = avg[i] = b.rank() + static_cast<double>(i);
      max[i] = static_cast<std::int32_t>((b.rank() * 7 + i) % 11);
    }
    std::vector<double> sum_out(count);
    const CollectiveArgs sum_args{Collective::allreduce, Buffer::of(std::span(sum)),
                                  Buffer::of(std::span(sum_out)), ReduceOp::sum, 0};
    const AlgorithmChoice choice = selector.choose(sum_args, b);
    if ((choice.algorithm == Algorithm::hierarchical) != can)
      failure += " count " + std::to_string(count) + " chose " +
                 std::string(to_string(choice.algorithm)) + " (" + choice.reason + ")";
    run_collective(b, choice.algorithm, sum_args);
    run_collective(b, choice.algorithm,
                   {Collective::allreduce, Buffer::of(std::span(avg)), Buffer::of(std::span(avg)),
                    ReduceOp::avg, 0});
    run_collective(b, choice.algorithm,
                   {Collective::allreduce, Buffer::of(std::span(max)), Buffer::of(std::span(max)),
                    ReduceOp::max, 0});
    const double ranks = n * (n - 1) / 2.0;
    for (std::size_t i = 0; i < count && failure.empty(); ++i) {
      std::int32_t expected_max = 0;
      for (int r = 0; r < n; ++r)
        expected_max = std::max(expected_max, static_cast<std::int32_t>((r * 7 + i) % 11));
      if (sum_out[i] != ranks + n * static_cast<double>(i) ||
          std::abs(avg[i] - (ranks / n + static_cast<double>(i))) > 1e-9 * (1 + avg[i]) ||
          max[i] != expected_max)
        failure = "count " + std::to_string(count) + " element " + std::to_string(i) + ": sum " +
                  std::to_string(sum_out[i]) + " avg " + std::to_string(avg[i]) + " max " +
                  std::to_string(max[i]);
    }
  }
  expect_all_ranks_ok(failure);
}

// Hierarchical allgather, reduce_scatter and broadcast across the cluster's nodes: every dtype
// and op against independent values (tests/backends/collective_checks.cpp) at counts below the
// rank count, odd and large; where the cluster has one rank per node they cannot run, and say so.
TEST(ClusterTopology, HierarchicalAllgatherReduceScatterBroadcastAreExact) {
  Backend& b = world();
  const Topology& t = b.topology();
  const bool can = t.node_count() < b.world_size();
  std::string failure;
  for (Collective op : {Collective::allgather, Collective::reduce_scatter, Collective::broadcast})
    for (DType dtype : {DType::float32, DType::float64, DType::int32, DType::bfloat16})
      for (const auto& c : testing::cases_for(op, dtype, {1, 7, (std::size_t{1} << 16) + 3})) {
        if (!failure.empty()) break;
        testing::ForcedAlgorithmBackend forced(b, Algorithm::hierarchical);
        failure = testing::check(forced, c);
        if (failure.empty() && (forced.last_algorithm() == Algorithm::hierarchical) != can)
          failure = testing::describe(c) + ": hierarchical " +
                    (can ? "did not run" : "ran on one rank per node") + " on " + t.describe();
      }
  expect_all_ranks_ok(failure);
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  return loom::testing::run_all_tests_on_every_rank(argc, argv);
}
