// What bench/cluster/cluster.sh promises, asserted from inside an MPI job running on it: each
// rank on its own node's host name, shared memory grouping exactly one node's ranks, collectives
// across nodes, and an inter-node link that is shaped while a node's memory is not.
// Run on every rank of the job (GoogleTest); `--pairs` prints instead, on rank 0, each rank
// pair's latency and bandwidth (the table in bench/RESULTS.md).
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

/// @brief The cluster as cluster.sh describes it to every rank (LOOM_CLUSTER_* variables).
struct ClusterLayout {
  std::vector<std::string> nodes;  // host names, node 0 first
  std::vector<int> node_ranks;     // ranks on each node
  std::vector<int> node_of_rank;   // mpirun fills each node's slots in turn
  double link_bits_per_s = 0;      // 0: unshaped
};

std::string required_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    throw std::runtime_error(std::string(name) +
                             " is not set: run this under bench/cluster/cluster.sh");
  }
  return value;
}

const ClusterLayout& layout() {
  static const ClusterLayout cluster = [] {
    ClusterLayout c;
    std::istringstream names(required_env("LOOM_CLUSTER_NODES"));
    for (std::string name; names >> name;) c.nodes.push_back(name);
    std::istringstream counts(required_env("LOOM_CLUSTER_RANKS_PER_NODE"));
    for (std::string count; std::getline(counts, count, ',');) {
      c.node_ranks.push_back(std::stoi(count));
      c.node_of_rank.insert(c.node_of_rank.end(), c.node_ranks.back(),
                            static_cast<int>(c.node_ranks.size()) - 1);
    }
    if (c.node_ranks.size() != c.nodes.size())
      throw std::runtime_error(
          "LOOM_CLUSTER_RANKS_PER_NODE has another node count than "
          "LOOM_CLUSTER_NODES");
    c.link_bits_per_s = std::stod(required_env("LOOM_CLUSTER_LINK_BITS"));
    return c;
  }();
  return cluster;
}

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

/// @brief The node cluster.sh places a rank on.
int node_of(int rank) {
  return layout().node_of_rank.at(rank);
}

/// @brief The lowest rank of `node`.
int first_rank_of(int node) {
  const auto& ranks = layout().node_ranks;
  return std::accumulate(ranks.begin(), ranks.begin() + node, 0);
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) {
    throw std::runtime_error(std::string("gethostname: ") + std::strerror(errno));
  }
  return name;
}

/// @brief Every test ends with this: all ranks learn whether any failed, so none waits alone.
void expect_all_ranks_passed() {
  int bad = ::testing::Test::HasFailure() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(bad, 0) << bad << " rank(s) failed this test";
}

/// @brief Seconds to move `bytes` from `from` to `to` (a send, then a one-byte reply that
/// says it all arrived), the fastest of `repeats`; 0 on the ranks not taking part. Collective.
double transfer_seconds(int from, int to, std::size_t bytes, int repeats) {
  std::vector<unsigned char> data(bytes, 0x5a);
  unsigned char done = 0;
  double best = 0;
  const int rank = world_rank();
  for (int i = 0; i < repeats + 1; ++i) {  // the first opens the connections: not timed
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = std::chrono::steady_clock::now();
    if (rank == from) {
      MPI_Send(data.data(), static_cast<int>(bytes), MPI_BYTE, to, 1, MPI_COMM_WORLD);
      MPI_Recv(&done, 1, MPI_BYTE, to, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == to) {
      MPI_Recv(data.data(), static_cast<int>(bytes), MPI_BYTE, from, 1, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
      MPI_Send(&done, 1, MPI_BYTE, from, 2, MPI_COMM_WORLD);
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (i > 0 && (best == 0 || s < best)) best = s;
  }
  return (rank == from || rank == to) ? best : 0;
}

/// @brief Half the median round trip of a `bytes` message between `a` and `b` over
/// `iterations`; 0 on the ranks not taking part. Collective. The median, because a rank that
/// shares a core with others now and then waits a scheduler slice.
double one_way_latency_s(int a, int b, std::size_t bytes, int iterations) {
  std::vector<unsigned char> data(std::max<std::size_t>(bytes, 1));
  std::vector<double> round_trips;
  const int rank = world_rank();
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank != a && rank != b) return 0;
  const int peer = rank == a ? b : a;
  for (int i = -10; i < iterations; ++i) {  // ten untimed rounds first
    const auto start = std::chrono::steady_clock::now();
    if (rank == a) {
      MPI_Send(data.data(), static_cast<int>(bytes), MPI_BYTE, peer, 3, MPI_COMM_WORLD);
      MPI_Recv(data.data(), static_cast<int>(bytes), MPI_BYTE, peer, 3, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
    } else {
      MPI_Recv(data.data(), static_cast<int>(bytes), MPI_BYTE, peer, 3, MPI_COMM_WORLD,
               MPI_STATUS_IGNORE);
      MPI_Send(data.data(), static_cast<int>(bytes), MPI_BYTE, peer, 3, MPI_COMM_WORLD);
    }
    if (i >= 0) {
      round_trips.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  std::nth_element(round_trips.begin(), round_trips.begin() + round_trips.size() / 2,
                   round_trips.end());
  return round_trips[round_trips.size() / 2] / 2;
}

TEST(EmulatedCluster, RanksMatchTheLayout) {
  ASSERT_EQ(world_size(), static_cast<int>(layout().node_of_rank.size()))
      << "the job has another rank count than the nodes' ranks added up";
  expect_all_ranks_passed();
}

TEST(EmulatedCluster, EachRankHasItsNodesHostName) {
  const int rank = world_rank();
  const std::string expected = layout().nodes.at(node_of(rank));
  EXPECT_EQ(host_name(), expected) << "rank " << rank;
  char processor[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(processor, &length);
  EXPECT_EQ(std::string(processor, length), expected) << "rank " << rank;
  expect_all_ranks_passed();
}

TEST(EmulatedCluster, SharedMemoryGroupsExactlyOneNode) {
  const int rank = world_rank();
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int node_size = 0;
  MPI_Comm_size(node, &node_size);
  std::vector<int> members(node_size);
  MPI_Allgather(&rank, 1, MPI_INT, members.data(), 1, MPI_INT, node);
  MPI_Comm_free(&node);
  std::vector<int> expected(layout().node_ranks.at(node_of(rank)));
  std::iota(expected.begin(), expected.end(), first_rank_of(node_of(rank)));
  EXPECT_EQ(members, expected) << "rank " << rank << " on " << host_name();
  expect_all_ranks_passed();
}

TEST(EmulatedCluster, AllreduceAcrossNodesIsExact) {
  const int rank = world_rank();
  const int size = world_size();
  for (const std::size_t count : {std::size_t{1}, std::size_t{1000}, std::size_t{1} << 20}) {
    std::vector<std::int64_t> values(count);
    for (std::size_t i = 0; i < count; ++i) values[i] = (rank + 1) * 1000003LL + i;
    MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(count), MPI_INT64_T, MPI_SUM,
                  MPI_COMM_WORLD);
    // sum over r of (r + 1) * 1000003 + i
    const std::int64_t ranks_part = 1000003LL * size * (size + 1) / 2;
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      if (values[i] != ranks_part + static_cast<std::int64_t>(i) * size) ++wrong;
    }
    EXPECT_EQ(wrong, 0u) << count << " elements on rank " << rank << "; first: " << values[0]
                         << " (expected " << ranks_part << ")";
  }
  expect_all_ranks_passed();
}

constexpr std::size_t kTransferBytes = std::size_t{4} << 20;

TEST(EmulatedCluster, InterNodeTransferKeepsToTheLinkRate) {
  if (layout().link_bits_per_s <= 0) GTEST_SKIP() << "the links are not shaped";
  // rank 0 on node 0 to the first rank of node 1
  const int to = first_rank_of(1);
  const double s = transfer_seconds(0, to, kTransferBytes, 3);
  if (world_rank() == 0) {
    const double bound = kTransferBytes * 8.0 / layout().link_bits_per_s;
    // tbf's bucket (256 KiB at 1 Gbit/s: 6% of 4 MiB) may pass ahead of the rate
    EXPECT_GE(s, 0.85 * bound) << "4 MiB from node 0 to node 1 went faster than the link allows";
    std::printf("inter-node: 4 MiB rank 0 -> rank %d in %.2f ms (%.0f MB/s; link bound %.2f ms)\n",
                to, s * 1e3, kTransferBytes / s / 1e6, bound * 1e3);
  }
  expect_all_ranks_passed();
}

/// @brief Bytes every interface of this rank's network namespace (lo included) has sent and
/// received, from /proc/net/dev (which shows the reading process's namespace).
std::uint64_t network_bytes() {
  std::FILE* f = std::fopen("/proc/net/dev", "r");
  if (!f) throw std::runtime_error("cannot read /proc/net/dev");
  char line[512];
  std::uint64_t total = 0;
  while (std::fgets(line, sizeof line, f)) {
    const char* colon = std::strchr(line, ':');
    if (!colon) continue;  // the two header lines
    unsigned long long rx = 0, tx = 0, skip = 0;
    // receive: bytes packets errs drop fifo frame compressed multicast; transmit: bytes ...
    if (std::sscanf(colon + 1, "%llu %llu %llu %llu %llu %llu %llu %llu %llu", &rx, &skip, &skip,
                    &skip, &skip, &skip, &skip, &skip, &tx) == 9)
      total += rx + tx;
  }
  std::fclose(f);
  return total;
}

// Shared memory inside a node, asserted on the transport itself, not on timing (a loaded host
// slows any transfer): 4 MiB sent between two ranks of node 0, three times, moves under 1 MiB
// through every interface of the node's namespace, loopback included (TCP between two ranks of
// one namespace would cross lo); the same from node 0 to node 1 moves at least the 12 MiB
// through them. The times are printed for the record.
TEST(EmulatedCluster, IntraNodeTransferUsesSharedMemoryNotTheNetwork) {
  if (layout().node_ranks[0] < 2) GTEST_SKIP() << "one rank on node 0: no intra-node pair";
  const std::uint64_t before = network_bytes();
  const double s = transfer_seconds(0, 1, kTransferBytes, 3);
  const std::uint64_t intra = network_bytes() - before;
  const double across_s = transfer_seconds(0, first_rank_of(1), kTransferBytes, 3);
  const std::uint64_t inter = network_bytes() - before - intra;
  if (world_rank() == 0) {
    EXPECT_LT(intra, std::uint64_t{1} << 20)
        << "4 MiB x 4 between two ranks of node 0 moved " << intra
        << " bytes through node 0's interfaces: not shared memory";
    EXPECT_GE(inter, 3 * kTransferBytes) << "4 MiB x 4 from node 0 to node 1 moved only " << inter
                                         << " bytes through node 0's interfaces";
    std::printf(
        "intra-node: 4 MiB rank 0 -> rank 1 in %.2f ms (%.0f MB/s), %llu bytes on the network; "
        "inter-node: %.2f ms, %llu bytes\n",
        s * 1e3, kTransferBytes / s / 1e6, static_cast<unsigned long long>(intra), across_s * 1e3,
        static_cast<unsigned long long>(inter));
  }
  expect_all_ranks_passed();
}

/// @brief `--pairs`: each pair's placement, 8 B latency (median of 1000) and 4 MiB bandwidth
/// (fastest of 3), printed by rank 0.
void print_pairs() {
  const int size = world_size();
  if (world_rank() == 0) {
    std::printf("%-6s %-6s %-10s %12s %14s\n", "from", "to", "placement", "latency_us",
                "bandwidth_MBs");
  }
  for (int a = 0; a < size; ++a) {
    for (int b = a + 1; b < size; ++b) {
      double latency = one_way_latency_s(a, b, 8, 1000);
      double seconds = transfer_seconds(a, b, kTransferBytes, 3);
      if (world_rank() == a) {
        MPI_Send(&latency, 1, MPI_DOUBLE, 0, 4, MPI_COMM_WORLD);
        MPI_Send(&seconds, 1, MPI_DOUBLE, 0, 4, MPI_COMM_WORLD);
      }
      if (world_rank() == 0) {
        MPI_Recv(&latency, 1, MPI_DOUBLE, a, 4, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Recv(&seconds, 1, MPI_DOUBLE, a, 4, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        std::printf("%-6d %-6d %-10s %12.1f %14.0f\n", a, b,
                    node_of(a) == node_of(b) ? "same-node" : "cross-node", latency * 1e6,
                    kTransferBytes / seconds / 1e6);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 0;
  try {
    layout();
    if (argc > 1 && std::strcmp(argv[1], "--pairs") == 0) {
      print_pairs();
    } else {
      ::testing::InitGoogleTest(&argc, argv);
      if (world_rank() != 0) {
        auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
        delete listeners.Release(listeners.default_result_printer());
      }
      status = RUN_ALL_TESTS();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cluster_probe on rank %d: %s\n", world_rank(), e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return status;
}
