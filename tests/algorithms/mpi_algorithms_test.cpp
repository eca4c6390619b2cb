// loom's collective algorithms over the MPI backend's algorithm channel: every (collective,
// algorithm) pair, every dtype and op, counts {0, 1, 7, 65539}; ctest runs it under mpirun
// with 2, 3 and 4 ranks.
#include <gtest/gtest.h>

#include <cstdlib>

#include "backends/collective_checks.hpp"
#include "backends/forced_algorithm_backend.hpp"
#include "backends/mpi_world.hpp"
#include "loom/executor.hpp"
#include "loom/mpi.hpp"
#include "scoped_env.hpp"

namespace loom {
namespace {

using testing::expect_all_ranks_ok;
using testing::world;

class MpiAlgorithms
    : public ::testing::TestWithParam<std::tuple<std::pair<Collective, Algorithm>, DType>> {};

TEST_P(MpiAlgorithms, MatchIndependentValues) {
  const auto [pair, dtype] = GetParam();
  testing::ForcedAlgorithmBackend forced(world(), pair.second);
  for (const auto& c : testing::cases_for(pair.first, dtype, {0, 1, 7, (1u << 16) + 3}))
    expect_all_ranks_ok(testing::check(forced, c));
}

INSTANTIATE_TEST_SUITE_P(AllCases, MpiAlgorithms,
                         ::testing::Combine(::testing::ValuesIn(testing::algorithm_pairs()),
                                            ::testing::ValuesIn(all_dtypes)),
                         [](const auto& info) {
                           const auto& pair = std::get<0>(info.param);
                           return std::string(to_string(pair.first)) + "_" +
                                  std::string(to_string(pair.second)) + "_" +
                                  std::string(to_string(std::get<1>(info.param)));
                         });

// A user's wildcard receive never takes an algorithm's message (they use another communicator).
TEST(MpiAlgorithmChannel, TrafficNeverMatchesAUsersReceive) {
  Backend& b = world();
  const int n = b.world_size();
  std::int32_t got = -1;
  auto user = b.recv_async(Buffer(&got, 1, DType::int32), any_source, any_tag);
  std::vector<std::int32_t> v(1000, b.rank() + 1);
  start_collective(
      b, Algorithm::ring,
      {Collective::allreduce, Buffer::of(std::span(v)), Buffer::of(std::span(v)), ReduceOp::sum, 0})
      ->wait();
  std::string failure;
  if (v[999] != n * (n + 1) / 2) failure = "ring allreduce gave " + std::to_string(v[999]);
  std::int32_t mine = 100 + b.rank();
  b.send(Buffer(&mine, 1, DType::int32), (b.rank() + 1) % n, 5);
  user->wait();
  if (got != 100 + (b.rank() + n - 1) % n) failure += " user recv got " + std::to_string(got);
  expect_all_ranks_ok(failure);
}

// The executor over MPI with LOOM_ALLREDUCE choosing per size: the selected algorithms run
// on the algorithm channel next to the executor's own traffic, and last_run() names them.
TEST(MpiExecutorAlgorithms, SelectedAlgorithmsRunInTheGraph) {
  Backend& b = world();
  const int n = b.world_size();
  std::optional<test::ScopedEnv> ranges(std::in_place, "LOOM_ALLREDUCE",
                                        "rd:0-1K;rabenseifner:1K-max");
  std::vector<double> small(9), large(20000);
  Graph g;
  auto fill = g.compute("fill", [&] {
    for (std::size_t i = 0; i < small.size(); ++i) small[i] = b.rank() + i;
    for (std::size_t i = 0; i < large.size(); ++i) large[i] = b.rank() * 3.0 + i;
  });
  auto a = g.allreduce("small", Buffer::of(std::span(small)));
  auto c = g.allreduce("large", Buffer::of(std::span(large)));
  fill.precede(a, c);
  ExecutorOptions options;
  options.profile = true;
  Executor ex(g, b, options);
  ranges.reset();
  std::string failure;
  for (int step = 0; step < 3; ++step) {
    ex.run();
    const double ranks = n * (n - 1) / 2.0;
    for (std::size_t i = 0; i < small.size(); ++i)
      if (small[i] != ranks + n * static_cast<double>(i)) failure = "small wrong";
    for (std::size_t i = 0; i < large.size(); ++i)
      if (large[i] != 3 * ranks + n * static_cast<double>(i)) failure = "large wrong";
  }
  for (const NodeTiming& t : ex.last_run()) {
    if (t.name == "small" && t.algorithm != "rd") failure += " small ran " + t.algorithm;
    if (t.name == "large" && t.algorithm != "rabenseifner") failure += " large ran " + t.algorithm;
  }
  expect_all_ranks_ok(failure);
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  return loom::testing::run_all_tests_on_every_rank(argc, argv);
}
