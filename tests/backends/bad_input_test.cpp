// The bad-input table on the local backend (2 and 3 ranks) and the backend factory's errors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <mutex>

#include "backends/bad_inputs.hpp"
#include "expect_error.hpp"
#include "loom/config.hpp"
#include "loom/local.hpp"

namespace loom {
namespace {

using test::expect_error;

class BadInputLocal : public ::testing::TestWithParam<std::tuple<int, std::size_t>> {};

TEST_P(BadInputLocal, RaisesANamedError) {
  const auto [world, row] = GetParam();
  const auto table = testing::bad_inputs();
  std::mutex mutex;
  std::vector<std::string> failures;
  LocalWorld::run(world, [&](Backend& b) {
    auto result = testing::provoke(b, table.at(row));
    std::lock_guard lock(mutex);
    if (!result.empty()) failures.push_back(result);
  });
  EXPECT_TRUE(failures.empty()) << failures.front();
}

INSTANTIATE_TEST_SUITE_P(
    Table, BadInputLocal,
    ::testing::Combine(::testing::Values(2, 3),
                       ::testing::Range<std::size_t>(0, testing::bad_inputs().size())),
    [](const auto& info) {
      return testing::bad_inputs()[std::get<1>(info.param)].name + "_np" +
             std::to_string(std::get<0>(info.param));
    });

TEST(BackendFactory, UnknownBackendListsTheAvailableOnes) {
  expect_error(ErrorCode::invalid_argument,
               "unknown backend 'carrier-pigeon' (known: local, mpi, nccl; available in this "
               "build: local",
               [] { create_backend("carrier-pigeon"); });
}

TEST(BackendFactory, NcclWithoutItBuiltIsUnavailable) {
  if (LOOM_HAVE_NCCL) GTEST_SKIP() << "this build has NCCL";
  expect_error(ErrorCode::unavailable,
               "backend 'nccl' was not built into this loom (available in this build: local",
               [] { create_backend("nccl"); });
}

TEST(BackendFactory, LocalIsTheDefaultOutsideMpirun) {
  if (launched_by_mpirun()) GTEST_SKIP() << "launched by mpirun";
  ::unsetenv("LOOM_BACKEND");
  auto backend = create_backend();
  EXPECT_EQ(backend->name(), "local");
  EXPECT_EQ(backend->world_size(), 1);
  std::vector<int> v{1, 2, 3};
  backend->allreduce(Buffer::of(std::span(v)), ReduceOp::sum);
  EXPECT_EQ(v, (std::vector<int>{1, 2, 3}));
}

TEST(BackendFactory, EnvironmentChoosesTheBackend) {
  ::setenv("LOOM_BACKEND", "nonsense", 1);
  expect_error(ErrorCode::invalid_argument,
               "unknown backend 'nonsense' (from LOOM_BACKEND) (known: local, mpi, nccl; available "
               "in this build: local",
               [] { create_backend(); });
  ::setenv("LOOM_BACKEND", "local", 1);
  EXPECT_EQ(create_backend()->name(), "local");
  ::unsetenv("LOOM_BACKEND");
}

}  // namespace
}  // namespace loom
