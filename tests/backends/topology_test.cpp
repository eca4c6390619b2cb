// loom::Topology (backends/topology.cpp): nodes from node ids, local ranks, leaders, at uneven
// and interleaved placements; and what Backend::topology() gives on the local backend.
#include "loom/topology.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "loom/error.hpp"
#include "loom/local.hpp"

namespace loom {
namespace {

using test::expect_error;

std::vector<int> as_vector(std::span<const int> ranks) {
  return {ranks.begin(), ranks.end()};
}

TEST(Topology, NodesAreNumberedByTheirLowestRank) {
  // ids as a launcher might give them: arbitrary, interleaved, uneven (3 + 1 + 2 ranks)
  const std::vector<int> ids = {42, 42, 7, 42, -3, 7};
  const Topology t = Topology::from_node_ids(ids);
  EXPECT_EQ(t.world_size(), 6);
  ASSERT_EQ(t.node_count(), 3);
  EXPECT_EQ(as_vector(t.ranks_of_node(0)), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(as_vector(t.ranks_of_node(1)), (std::vector<int>{2, 5}));
  EXPECT_EQ(as_vector(t.ranks_of_node(2)), (std::vector<int>{4}));
  const std::vector<int> node_of = {0, 0, 1, 0, 2, 1};
  const std::vector<int> local_rank = {0, 1, 0, 2, 0, 1};
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(t.node_of(r), node_of[r]) << "rank " << r;
    EXPECT_EQ(t.local_rank(r), local_rank[r]) << "rank " << r;
  }
  EXPECT_EQ(t.leaders(), (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(t.leader_of_node(1), 2);
  EXPECT_FALSE(t.uniform());
  EXPECT_EQ(t.describe(), "3 nodes: {0,1,3} {2,5} {4}");
}

TEST(Topology, BlocksPlaceConsecutiveRanksTogether) {
  const Topology even = Topology::blocks(6, 3);
  EXPECT_EQ(even.node_count(), 2);
  EXPECT_TRUE(even.uniform());
  EXPECT_EQ(even.describe(), "2 nodes: {0,1,2} {3,4,5}");
  EXPECT_EQ(even.local_rank(4), 1);
  const Topology remainder = Topology::blocks(5, 2);
  EXPECT_EQ(remainder.describe(), "3 nodes: {0,1} {2,3} {4}");
  EXPECT_FALSE(remainder.uniform());
  EXPECT_EQ(Topology::blocks(4, 2), Topology::from_node_ids(std::vector<int>{9, 9, 1, 1}));
}

TEST(Topology, SingleNodeAndNodePerRank) {
  const Topology one = Topology::single_node(3);
  EXPECT_EQ(one.node_count(), 1);
  EXPECT_EQ(one.leaders(), (std::vector<int>{0}));
  EXPECT_EQ(one.local_rank(2), 2);
  EXPECT_EQ(one.describe(), "1 node: {0,1,2}");
  const Topology apart = Topology::node_per_rank(3);
  EXPECT_EQ(apart.node_count(), 3);
  EXPECT_EQ(apart.leaders(), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(apart.local_rank(2), 0);
  EXPECT_TRUE(apart.uniform());
  EXPECT_NE(one, apart);
}

TEST(Topology, NodesNamedByTheirHosts) {
  const std::vector<int> ids = {5, 5, 9};
  const Topology t = Topology::from_node_ids(ids);
  EXPECT_EQ(t.node_name(1), "");
  EXPECT_EQ(t.node_label(1), "node 1");
  const std::vector<std::string> names = {"host-a", "host-a", "host-b"};
  const Topology named = t.with_node_names(names);
  EXPECT_EQ(named.node_name(0), "host-a");
  EXPECT_EQ(named.node_name(1), "host-b");
  EXPECT_EQ(named.node_label(1), "node 1 (host-b)");
  EXPECT_EQ(named.describe(), "2 nodes: {0,1} on host-a {2} on host-b");
  EXPECT_NE(named, t);
  const std::vector<std::string> split = {"host-a", "host-c", "host-b"};
  try {
    t.with_node_names(split);
    FAIL() << "two names for one node accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("rank 1 names node 0 'host-c' but rank 0 names it "
                                         "'host-a'"),
              std::string::npos)
        << e.what();
  }
  const std::vector<std::string> short_list = {"host-a"};
  expect_error(ErrorCode::invalid_argument, "Topology::with_node_names: 1 names for 3 ranks",
               [&] { t.with_node_names(short_list); });
  expect_error(ErrorCode::invalid_argument, "Topology::node_name: node 2 is out of range [0, 2)",
               [&] { t.node_name(2); });
}

TEST(Topology, BadArgumentsNameTheValue) {
  const auto expect_invalid = [](auto&& call, const std::string& text) {
    try {
      call();
      ADD_FAILURE() << "no error; expected one containing '" << text << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  const Topology t = Topology::blocks(4, 2);
  expect_invalid([&] { t.node_of(4); }, "rank 4 is out of range [0, 4)");
  expect_invalid([&] { t.local_rank(-1); }, "rank -1 is out of range [0, 4)");
  expect_invalid([&] { t.ranks_of_node(2); }, "node 2 is out of range [0, 2)");
  expect_invalid([] { Topology::from_node_ids({}); }, "no ranks");
  expect_invalid([] { Topology::blocks(4, 0); }, "ranks per node must be at least 1, got 0");
  expect_invalid([] { Topology::single_node(0); }, "the world size must be at least 1, got 0");
}

TEST(LocalBackendTopology, OneNodeUnlessTheWorldIsGivenOne) {
  std::atomic<int> checked{0};
  LocalWorld::run(3, [&](Backend& backend) {
    EXPECT_EQ(backend.topology(), Topology::single_node(3)) << "rank " << backend.rank();
    ++checked;
  });
  EXPECT_EQ(checked.load(), 3);
  EXPECT_EQ(make_local_backend()->topology(), Topology::single_node(1));
}

TEST(LocalBackendTopology, ConfiguredNodesAreEveryRanksTopology) {
  // uneven: 2 + 3 + 1 ranks, nodes interleaved
  const Topology placed = Topology::from_node_ids(std::vector<int>{0, 1, 1, 0, 2, 1});
  std::atomic<int> checked{0};
  LocalWorld::run(placed, [&](Backend& backend) {
    EXPECT_EQ(backend.world_size(), 6);
    const Topology& t = backend.topology();
    EXPECT_EQ(t, placed) << "rank " << backend.rank() << ": " << t.describe();
    EXPECT_EQ(t.describe(), "3 nodes: {0,3} {1,2,5} {4}");
    // the collectives still span the whole world
    int value = backend.rank() + 1;
    backend.allreduce(Buffer(&value, 1, DType::int32), ReduceOp::sum);
    EXPECT_EQ(value, 21);
    ++checked;
  });
  EXPECT_EQ(checked.load(), 6);
  LocalWorld world(Topology::blocks(4, 2));
  EXPECT_EQ(world.size(), 4);
  EXPECT_EQ(world.backend(3).topology().node_of(3), 1);
}

}  // namespace
}  // namespace loom
