// MpiBackend's topology under a plain mpirun (one host): every rank on one node, the same
// value on every rank. tests/cluster/cluster_topology_test.cpp checks it across nodes.
#include <gtest/gtest.h>
#include <unistd.h>

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
  // One node, named by this host (MPI_Get_processor_name: the host name under Open MPI).
  const Topology& t = world().topology();
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::vector<std::string> names(static_cast<std::size_t>(world().world_size()), host);
  std::string failure;
  if (t != Topology::single_node(world().world_size()).with_node_names(names))
    failure = "rank " + std::to_string(world().rank()) + " sees " + t.describe() +
              ", expected one node on " + host;
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
