// MpiBackend's topology under a plain mpirun (one host): every rank on one node, the same
// value on every rank. tests/cluster/cluster_topology_test.cpp checks it across nodes.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backends/mpi_world.hpp"
#include "loom/topology.hpp"

namespace loom {
namespace {

using testing::expect_all_ranks_ok;
using testing::world;

TEST(MpiTopology, OneHostIsOneNode) {
  const Topology& t = world().topology();
  std::string failure;
  if (t != Topology::single_node(world().world_size()))
    failure = "rank " + std::to_string(world().rank()) + " sees " + t.describe();
  expect_all_ranks_ok(failure);
}

TEST(MpiTopology, EveryRankSeesTheSameNodes) {
  // each rank's node of every rank, compared with rank 0's
  const Topology& t = world().topology();
  std::vector<std::int32_t> mine(world().world_size());
  for (int r = 0; r < world().world_size(); ++r) mine[r] = t.node_of(r);
  std::vector<std::int32_t> rank0 = mine;
  world().broadcast(Buffer(rank0.data(), rank0.size(), DType::int32), 0);
  expect_all_ranks_ok(mine == rank0 ? ""
                                    : "rank " + std::to_string(world().rank()) +
                                          " disagrees with rank 0: " + t.describe());
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  return loom::testing::run_all_tests_on_every_rank(argc, argv);
}
