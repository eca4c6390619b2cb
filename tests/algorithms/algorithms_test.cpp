// loom's collective algorithms on the local backend: every (collective, algorithm) pair, every
// dtype and reduce op, 1-5 ranks and counts {0, 1, 7, 65539}, against independent values;
// fallback, channel isolation and concurrent instances.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backends/collective_checks.hpp"
#include "backends/forced_algorithm_backend.hpp"
#include "expect_error.hpp"
#include "loom/algorithm.hpp"
#include "loom/error.hpp"
#include "loom/local.hpp"

namespace loom {
namespace {

using test::expect_error;

const std::vector<std::size_t> algorithm_counts{0, 1, 7, (1u << 16) + 3};

using Param = std::tuple<int, std::pair<Collective, Algorithm>>;
class LocalAlgorithms : public ::testing::TestWithParam<Param> {};

TEST_P(LocalAlgorithms, MatchIndependentValues) {
  const auto [world, pair] = GetParam();
  const auto [op, algorithm] = pair;
  std::vector<testing::Case> cases;
  for (DType dtype : all_dtypes)
    for (const auto& c : testing::cases_for(op, dtype, algorithm_counts)) cases.push_back(c);
  // Every case in one world: each is collective and every rank runs the list in order, so the
  // ranks' threads are made once (under the sanitizers a thread's start-up, not the cases, was
  // most of the matrix's time).
  std::mutex mutex;
  std::vector<std::string> failures;
  LocalWorld::run(world, [&](Backend& inner) {
    testing::ForcedAlgorithmBackend forced(inner, algorithm);
    for (const auto& c : cases) {
      std::string result = testing::check(forced, c);
      // The algorithm itself must have run wherever it can (no silent native).
      const std::size_t count = op == Collective::reduce_scatter ? c.count * world : c.count;
      std::vector<std::byte> probe(count * dtype_size(c.dtype));
      const CollectiveArgs args{op, Buffer(probe.data(), count, c.dtype),
                                Buffer(probe.data(), count, c.dtype), c.redop, 0};
      const bool can = cannot_run(algorithm, args, inner).empty();
      if (result.empty() && (forced.last_algorithm() == algorithm) != can)
        result = testing::describe(c) + ": ran " + std::string(to_string(forced.last_algorithm())) +
                 " but cannot_run says " + (can ? "it can" : "it cannot");
      if (!result.empty()) {
        std::lock_guard lock(mutex);
        failures.push_back(result);
      }
    }
  });
  ASSERT_TRUE(failures.empty()) << failures.front() << " (and " << failures.size() - 1 << " more)";
}

INSTANTIATE_TEST_SUITE_P(AllCases, LocalAlgorithms,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5),
                                            ::testing::ValuesIn(testing::algorithm_pairs())),
                         [](const auto& info) {
                           const auto& pair = std::get<1>(info.param);
                           return "np" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::string(to_string(pair.first)) + "_" +
                                  std::string(to_string(pair.second));
                         });

// Hierarchical allreduce, allgather, reduce_scatter and broadcast on configured node layouts
// (even, one rank per node, uneven, one node, interleaved, four nodes: two exchanges with no
// fold between them): every dtype and op, counts below the rank count and odd, in and out of
// place (the largest count's 8-byte types, and 4-byte ones where a node holds one rank, take
// allreduce's inter-node ring on 3 and 5 nodes), broadcast from the last rank (not its node's
// leader where its node has several); each runs exactly where cannot_run says it can (several
// nodes, some node with several ranks).
class HierarchicalLayouts : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(HierarchicalLayouts, MatchIndependentValues) {
  const std::vector<int>& node_ids = GetParam();
  const Topology topology = Topology::from_node_ids(node_ids);
  const bool expect_run =
      topology.node_count() >= 2 && topology.node_count() < topology.world_size();
  std::vector<testing::Case> cases;
  for (Collective op : {Collective::allreduce, Collective::allgather, Collective::reduce_scatter,
                        Collective::broadcast})
    for (DType dtype : all_dtypes)
      for (const auto& c : testing::cases_for(op, dtype, algorithm_counts)) cases.push_back(c);
  // Every case in one world (as LocalAlgorithms does).
  std::mutex mutex;
  std::vector<std::string> failures;
  LocalWorld::run(topology, [&](Backend& inner) {
    testing::ForcedAlgorithmBackend forced(inner, Algorithm::hierarchical);
    for (const auto& c : cases) {
      std::string result = testing::check(forced, c);
      const bool ran = forced.last_algorithm() == Algorithm::hierarchical;
      if (result.empty() && c.count != 0 && ran != expect_run)
        result = testing::describe(c) + ": hierarchical " + (ran ? "ran" : "did not run") + " on " +
                 topology.describe();
      if (!result.empty()) {
        std::lock_guard lock(mutex);
        failures.push_back(topology.describe() + ": " + result);
      }
    }
  });
  ASSERT_TRUE(failures.empty()) << failures.front() << " (and " << failures.size() - 1 << " more)";
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, HierarchicalLayouts,
    ::testing::Values(std::vector<int>{0, 0, 1, 1}, std::vector<int>{0, 1, 2},
                      std::vector<int>{0, 0, 0, 1, 1, 1}, std::vector<int>{0, 0, 1, 2, 2, 2},
                      std::vector<int>{0, 0, 0, 0}, std::vector<int>{0, 1, 0, 1, 1},
                      std::vector<int>{0, 0, 1, 1, 1, 2, 2, 2, 2},
                      std::vector<int>{0, 0, 1, 2, 3, 4}, std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3}),
    [](const auto& info) {
      std::string name = "n";
      for (int id : info.param) name += std::to_string(id);
      return name;
    });

// Hierarchical allreduce pipelines vectors of 2 MiB and more in chunks (hierarchical_chunks):
// 2 and 5 chunks of odd sizes, every reduce op, in and out of place, on even, uneven,
// interleaved and 5-node layouts (recursive doubling and the ring between nodes).
TEST(Algorithms, HierarchicalAllreducePipelinesLargeVectorsInChunks) {
  ASSERT_EQ(hierarchical_chunks(600001 * 4), 2);
  ASSERT_EQ(hierarchical_chunks(700001 * 8), 5);
  for (const std::vector<int>& ids :
       {std::vector<int>{0, 0, 1, 1}, std::vector<int>{0, 1, 0, 1, 1},
        std::vector<int>{0, 0, 1, 1, 1, 2, 2, 2, 2}, std::vector<int>{0, 0, 1, 2, 3, 4}}) {
    const Topology topology = Topology::from_node_ids(ids);
    for (const auto& [dtype, count] : {std::pair{DType::float32, std::size_t{600001}},
                                       std::pair{DType::int64, std::size_t{700001}}})
      for (const auto& c : testing::cases_for(Collective::allreduce, dtype, {count})) {
        std::mutex mutex;
        std::vector<std::string> failures;
        LocalWorld::run(topology, [&](Backend& inner) {
          testing::ForcedAlgorithmBackend forced(inner, Algorithm::hierarchical);
          std::string result = testing::check(forced, c);
          if (result.empty() && forced.last_algorithm() != Algorithm::hierarchical)
            result = testing::describe(c) + ": hierarchical did not run";
          if (!result.empty()) {
            std::lock_guard lock(mutex);
            failures.push_back(topology.describe() + ": " + result);
          }
        });
        ASSERT_TRUE(failures.empty()) << failures.front();
      }
  }
}

TEST(Algorithms, HierarchicalCannotRunOnOneNodeOrOneRankPerNode) {
  std::vector<float> v(8);
  const CollectiveArgs args{Collective::allreduce, Buffer::of(std::span(v)),
                            Buffer::of(std::span(v)), ReduceOp::sum, 0};
  LocalWorld one_node(4);
  EXPECT_NE(cannot_run(Algorithm::hierarchical, args, one_node.backend(0)).find("one node"),
            std::string::npos);
  LocalWorld spread(Topology::node_per_rank(3));
  EXPECT_NE(cannot_run(Algorithm::hierarchical, args, spread.backend(0)).find("one rank per node"),
            std::string::npos);
  LocalWorld two_by_two(Topology::blocks(4, 2));
  EXPECT_EQ(cannot_run(Algorithm::hierarchical, args, two_by_two.backend(0)), "");
  const CollectiveArgs reduce{Collective::reduce, Buffer::of(std::span(v)),
                              Buffer::of(std::span(v)), ReduceOp::sum, 0};
  EXPECT_NE(
      cannot_run(Algorithm::hierarchical, reduce, two_by_two.backend(0)).find("does not implement"),
      std::string::npos);
  std::vector<float> gathered(32);
  const CollectiveArgs gather{Collective::allgather, Buffer::of(std::span(v)),
                              Buffer::of(std::span(gathered)), ReduceOp::sum, 0};
  EXPECT_EQ(cannot_run(Algorithm::hierarchical, gather, two_by_two.backend(0)), "");
}

TEST(Algorithms, CannotRunExplainsWhy) {
  LocalWorld world(3);
  std::vector<float> v(2);
  const CollectiveArgs small{Collective::allreduce, Buffer::of(std::span(v)),
                             Buffer::of(std::span(v)), ReduceOp::sum, 0};
  EXPECT_NE(cannot_run(Algorithm::ring, small, world.backend(0)).find("count 2 < 3 ranks"),
            std::string::npos);
  EXPECT_EQ(cannot_run(Algorithm::recursive_doubling, small, world.backend(0)), "");
  EXPECT_EQ(cannot_run(Algorithm::native, small, world.backend(0)), "");
  std::vector<float> gathered(6);
  const CollectiveArgs gather{Collective::allgather, Buffer::of(std::span(v)),
                              Buffer::of(std::span(gathered)), ReduceOp::sum, 0};
  EXPECT_NE(
      cannot_run(Algorithm::recursive_doubling, gather, world.backend(0)).find("power-of-two"),
      std::string::npos);
  EXPECT_NE(cannot_run(Algorithm::bruck, small, world.backend(0)).find("does not implement"),
            std::string::npos);
  const CollectiveArgs on_gpu{
      Collective::allreduce, Buffer(v.data(), 2, DType::float32, Device::cuda(0)),
      Buffer(v.data(), 2, DType::float32, Device::cuda(0)), ReduceOp::sum, 0};
  EXPECT_NE(cannot_run(Algorithm::recursive_doubling, on_gpu, world.backend(0)).find("device"),
            std::string::npos);
  try {
    start_collective(world.backend(0), Algorithm::ring, small);
    FAIL() << "ring on 2 elements over 3 ranks started";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported);
    EXPECT_NE(std::string(e.what()).find("allreduce on rank 0 of 3"), std::string::npos);
  }
}

TEST(Algorithms, BadArgumentsAreTheBackendsErrors) {
  LocalWorld world(2);
  std::vector<float> a(4), b(5);
  try {
    start_collective(world.backend(0), Algorithm::rabenseifner,
                     {Collective::allreduce, Buffer::of(std::span(a)), Buffer::of(std::span(b)),
                      ReduceOp::sum, 0});
    FAIL() << "mismatched counts accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("recv count 5 differs from send count 4"),
              std::string::npos);
  }
  std::vector<std::uint8_t> flags(4);
  const Buffer bools(flags.data(), flags.size(), DType::boolean);
  expect_error(ErrorCode::unsupported, "reduce op avg is not defined for bool", [&] {
    start_collective(world.backend(0), Algorithm::ring,
                     {Collective::allreduce, bools, bools, ReduceOp::avg, 0});
  });
  expect_error(ErrorCode::invalid_argument, "unknown algorithm 'ringg'",
               [] { parse_algorithm("ringg"); });
  EXPECT_EQ(parse_algorithm("binomial"), Algorithm::binomial_tree);
}

// run_collective: the blocking form, native through Backend::collective, the others through
// start_collective; both exact, on an odd rank count and an odd size, and validated alike.
TEST(Algorithms, RunCollectiveBlocksUntilDoneForNativeAndLoomAlgorithms) {
  LocalWorld::run(3, [](Backend& b) {
    for (Algorithm algorithm : {Algorithm::native, Algorithm::ring, Algorithm::binomial_tree}) {
      std::vector<double> v(1001);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = b.rank() + static_cast<double>(i);
      run_collective(b, algorithm,
                     {Collective::allreduce, Buffer::of(std::span(v)), Buffer::of(std::span(v)),
                      ReduceOp::sum, 0});
      for (std::size_t i = 0; i < v.size(); ++i)
        ASSERT_EQ(v[i], 3.0 + 3.0 * static_cast<double>(i)) << to_string(algorithm) << " at " << i;
    }
    std::vector<float> root_only(5, 1.0f + b.rank());
    b.collective({Collective::broadcast, Buffer::of(std::span(root_only)),
                  Buffer::of(std::span(root_only)), ReduceOp::sum, 2});
    EXPECT_EQ(root_only[4], 3.0f);
    std::vector<float> a(4), c(5);
    try {
      run_collective(b, Algorithm::native,
                     {Collective::allreduce, Buffer::of(std::span(a)), Buffer::of(std::span(c)),
                      ReduceOp::sum, 0});
      ADD_FAILURE() << "mismatched counts accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
      EXPECT_NE(std::string(e.what()).find("recv count 5 differs from send count 4"),
                std::string::npos);
    }
  });
}

// Starting an algorithm builds no string: its description is made when asked (an error, a
// timeout, a dump) and names the collective, rank, algorithm, buffer and reduce op.
TEST(Algorithms, AnAlgorithmsWorkDescribesItselfWhenAsked) {
  LocalWorld::run(3, [](Backend& b) {
    std::vector<float> v(7, 1.0f), all(21, 0.0f);
    auto reduce = start_collective(b, Algorithm::ring,
                                   {Collective::allreduce, Buffer::of(std::span(v)),
                                    Buffer::of(std::span(v)), ReduceOp::max, 0});
    const std::string at = " on rank " + std::to_string(b.rank()) + " of 3 (local): ";
    EXPECT_EQ(reduce->description(), "allreduce" + at + "ring float32[7]@cpu max");
    reduce->wait();
    auto gather = start_collective(b, Algorithm::bruck,
                                   {Collective::allgather, Buffer::of(std::span(v)),
                                    Buffer::of(std::span(all)), ReduceOp::sum, 0});
    EXPECT_EQ(gather->description(), "allgather" + at + "bruck float32[7]@cpu");
    gather->wait();
    EXPECT_EQ(all, std::vector<float>(21, 1.0f));
  });
}

// Algorithm messages travel on their own channel: a user receive posted for any source and
// any tag before an algorithm runs still gets the user's message, not the algorithm's.
TEST(Algorithms, TrafficNeverMatchesAUsersReceive) {
  LocalWorld::run(3, [](Backend& b) {
    std::int32_t got = -1;
    auto user = b.recv_async(Buffer(&got, 1, DType::int32), any_source, any_tag);
    std::vector<std::int32_t> v(1000, b.rank() + 1);
    start_collective(b, Algorithm::ring,
                     {Collective::allreduce, Buffer::of(std::span(v)), Buffer::of(std::span(v)),
                      ReduceOp::sum, 0})
        ->wait();
    EXPECT_EQ(v[999], 6);
    std::int32_t mine = 100 + b.rank();
    b.send(Buffer(&mine, 1, DType::int32), (b.rank() + 1) % 3, 5);
    user->wait();
    EXPECT_EQ(got, 100 + (b.rank() + 2) % 3);
  });
}

// Several instances in flight at once, completed in reverse order, stay apart (each has its
// own tag).
TEST(Algorithms, ConcurrentInstancesKeepTheirOwnMessages) {
  LocalWorld::run(4, [](Backend& b) {
    std::vector<std::vector<double>> data;
    std::vector<std::unique_ptr<Work>> works;
    for (int k = 0; k < 6; ++k) data.emplace_back(50000 + 7 * k, b.rank() * 10.0 + k);
    for (int k = 0; k < 6; ++k) {
      const Algorithm a = k % 2 == 0 ? Algorithm::ring : Algorithm::rabenseifner;
      works.push_back(start_collective(b, a,
                                       {Collective::allreduce, Buffer::of(std::span(data[k])),
                                        Buffer::of(std::span(data[k])), ReduceOp::sum, 0}));
    }
    for (int k = 5; k >= 0; --k) works[k]->wait();
    for (int k = 0; k < 6; ++k)
      for (double x : data[k]) ASSERT_EQ(x, 60.0 + 4 * k);  // (0+10+20+30) + 4k
  });
}

// The ring reduce-scatter receives every other partial into its output (one scratch block,
// none at 2 ranks), or, given its input as workspace, accumulates the partials in the input's
// blocks (no scratch): at 2-5 ranks and an odd block size every rank gets its block's exact
// sum and maximum either way, and without the workspace the input is left as it was.
TEST(Algorithms, RingReduceScatterWithAndWithoutItsInputAsWorkspaceGivesTheResult) {
  for (int world = 2; world <= 5; ++world)
    for (bool workspace : {false, true})
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max})
        LocalWorld::run(world, [&](Backend& b) {
          const std::size_t block = 1001;
          const auto n = static_cast<std::size_t>(world) * block;
          std::vector<double> send(n), out(block, -1.0);
          // Rank r's element i: (r + 1) * 1000 + i, with every third element's ranks reversed
          // so that the maximum is not always the last rank's.
          const auto value = [&](int r, std::size_t i) {
            const int who = i % 3 == 0 ? world - 1 - r : r;
            return (who + 1) * 1000.0 + double(i);
          };
          for (std::size_t i = 0; i < n; ++i) send[i] = value(b.rank(), i);
          const std::vector<double> before = send;
          CollectiveArgs args{Collective::reduce_scatter, Buffer::of(std::span(send)),
                              Buffer::of(std::span(out)), op, 0};
          args.send_is_workspace = workspace;
          start_collective(b, Algorithm::ring, args)->wait();
          const std::string what = "world " + std::to_string(world) +
                                   (workspace ? " workspace " : " ") + std::string(to_string(op)) +
                                   " rank " + std::to_string(b.rank());
          for (std::size_t k = 0; k < block; ++k) {
            const std::size_t i = b.rank() * block + k;
            double want = op == ReduceOp::sum ? 0.0 : value(0, i);
            for (int r = 0; r < world; ++r)
              want = op == ReduceOp::sum ? want + value(r, i) : std::max(want, value(r, i));
            ASSERT_EQ(out[k], want) << what << " element " << k;
          }
          if (!workspace) EXPECT_EQ(send, before) << what;
        });
}

// A rank that fails while the others are inside an algorithm makes their transfers fail with
// ErrorCode::cancelled (never a hang), and run() reports the original failure.
TEST(Algorithms, AFailedPeerCancelsInsteadOfHanging) {
  try {
    LocalWorld::run(3, [](Backend& b) {
      if (b.rank() == 1) throw Error(ErrorCode::invalid_argument, "rank 1 gives up");
      std::vector<float> v(100000, 1.0f);
      start_collective(b, Algorithm::ring,
                       {Collective::allreduce, Buffer::of(std::span(v)), Buffer::of(std::span(v)),
                        ReduceOp::sum, 0})
          ->wait();
    });
    FAIL() << "the run succeeded without rank 1";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 1 gives up"), std::string::npos);
  }
}

// Where the operand order changes the bits (min/max of +0 and -0: the kernels keep the first
// operand on a tie; NaNs with different payloads: x86 keeps the first payload, under sum too),
// every algorithm still gives every rank the same bits. Recursive doubling and hierarchical's
// inter-node exchanges once combined `mine op theirs` on both partners, in opposite orders.
TEST(Algorithms, EveryAllreduceIsBitIdenticalAcrossRanks) {
  const std::vector<std::vector<int>> layouts{{0, 1},         {0, 1, 2},    {0, 0, 1},
                                              {0, 0, 1, 1},   {0, 1, 2, 3}, {0, 0, 1, 1, 2, 2},
                                              {0, 1, 0, 1, 2}};
  struct Case {
    const char* what;
    ReduceOp op;
    bool nan;
  };
  const Case cases[] = {{"min of +0/-0", ReduceOp::min, false},
                        {"max of +0/-0", ReduceOp::max, false},
                        {"sum of NaN payloads", ReduceOp::sum, true},
                        {"min of NaN payloads", ReduceOp::min, true},
                        {"max of NaN payloads", ReduceOp::max, true}};
  const std::size_t n = 37;
  int compared = 0;
  for (const auto& layout : layouts)
    for (const Case& c : cases)
      for (Algorithm algorithm : candidates(Collective::allreduce)) {
        const Topology topology = Topology::from_node_ids(std::span<const int>(layout));
        const int world = topology.world_size();
        std::vector<std::vector<std::uint32_t>> bits(static_cast<std::size_t>(world));
        bool refused = false;
        std::mutex mutex;
        LocalWorld::run(topology, [&](Backend& b) {
          std::vector<float> v(n);
          for (std::size_t i = 0; i < n; ++i) {
            const std::uint32_t word =
                c.nan ? 0x7fc00000u | static_cast<std::uint32_t>(b.rank() + 1 + i)
                      : ((b.rank() + i) % 2 == 0 ? 0x00000000u : 0x80000000u);
            std::memcpy(&v[i], &word, sizeof word);
          }
          const CollectiveArgs args{Collective::allreduce, Buffer::of(std::span(v)),
                                    Buffer::of(std::span(v)), c.op, 0};
          if (!cannot_run(algorithm, args, b).empty()) {
            std::lock_guard lock(mutex);
            refused = true;
            return;
          }
          run_collective(b, algorithm, args);
          std::vector<std::uint32_t> mine(n);
          std::memcpy(mine.data(), v.data(), n * sizeof(float));
          std::lock_guard lock(mutex);
          bits[static_cast<std::size_t>(b.rank())] = std::move(mine);
        });
        if (refused) continue;
        ++compared;
        for (int r = 1; r < world; ++r)
          EXPECT_EQ(bits[static_cast<std::size_t>(r)], bits[0])
              << to_string(algorithm) << ", " << c.what << ", " << world << " ranks on "
              << topology.node_count() << " nodes: rank " << r << " differs from rank 0";
      }
  EXPECT_GT(compared, 100);  // the algorithms ran, not only refused
}

}  // namespace
}  // namespace loom
