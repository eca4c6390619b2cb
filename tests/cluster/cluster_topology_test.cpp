// MpiBackend::topology() on the emulated cluster (bench/cluster/cluster.sh): its nodes are the
// cluster's nodes (network namespaces with their own host names), rank for rank.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "backends/mpi_world.hpp"
#include "loom/topology.hpp"

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
  const Topology expected = Topology::from_node_ids(node_of);
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
  else if (t.leader_of_node(node) != rank - t.local_rank(rank))
    failure = "rank " + std::to_string(rank) + ": leader " +
              std::to_string(t.leader_of_node(node)) + ", local rank " +
              std::to_string(t.local_rank(rank));
  expect_all_ranks_ok(failure);
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  return loom::testing::run_all_tests_on_every_rank(argc, argv);
}
