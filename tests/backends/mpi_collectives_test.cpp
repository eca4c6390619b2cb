// Every collective, point-to-point operation and bad input on the MPI backend; ctest runs this
// binary under mpirun with 1, 2, 3 and 4 ranks.
#include <gtest/gtest.h>

#include "backends/bad_inputs.hpp"
#include "backends/collective_checks.hpp"
#include "backends/mpi_world.hpp"
#include "loom/mpi.hpp"

namespace loom {
namespace {

using testing::expect_all_ranks_ok;
using testing::world;

class MpiCollectives : public ::testing::TestWithParam<std::tuple<Collective, DType>> {};

TEST_P(MpiCollectives, MatchIndependentValues) {
  const auto [op, dtype] = GetParam();
  for (const auto& c : testing::cases_for(op, dtype, testing::standard_counts))
    expect_all_ranks_ok(testing::check(world(), c));
}

INSTANTIATE_TEST_SUITE_P(AllCases, MpiCollectives,
                         ::testing::Combine(::testing::ValuesIn(testing::all_collectives),
                                            ::testing::ValuesIn(all_dtypes)),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_" +
                                  std::string(to_string(std::get<1>(info.param)));
                         });

class MpiPointToPoint : public ::testing::TestWithParam<DType> {};

TEST_P(MpiPointToPoint, RingExchange) {
  for (std::size_t count : testing::standard_counts)
    expect_all_ranks_ok(testing::check_point_to_point(world(), GetParam(), count));
}

INSTANTIATE_TEST_SUITE_P(AllCases, MpiPointToPoint, ::testing::ValuesIn(all_dtypes),
                         [](const auto& info) { return std::string(to_string(info.param)); });

TEST(MpiBadInput, EveryRowRaisesANamedError) {
  if (world().world_size() < 2) GTEST_SKIP() << "the table needs at least 2 ranks";
  for (const auto& row : testing::bad_inputs()) expect_all_ranks_ok(testing::provoke(world(), row));
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  return loom::testing::run_all_tests_on_every_rank(argc, argv);
}
