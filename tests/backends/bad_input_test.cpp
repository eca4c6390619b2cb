// The bad-input table on the local backend (2 and 3 ranks) and the backend factory's errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>

#include "backends/bad_inputs.hpp"
#include "expect_error.hpp"
#include "loom/config.hpp"
#include "loom/environment.hpp"
#include "loom/local.hpp"
#include "scoped_env.hpp"

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
               "unknown backend 'carrier-pigeon' (known: local, mpi, nccl, ucx; available in this "
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
  test::ScopedEnv env("LOOM_BACKEND", nullptr);
  auto backend = create_backend();
  EXPECT_EQ(backend->name(), "local");
  EXPECT_EQ(backend->world_size(), 1);
  std::vector<int> v{1, 2, 3};
  backend->allreduce(Buffer::of(std::span(v)), ReduceOp::sum);
  EXPECT_EQ(v, (std::vector<int>{1, 2, 3}));
}

// A process that initialised MPI on its own (Open MPI's singleton, e.g. mpi4py imported by
// PyTorch Lightning) has PMIX_RANK=0 and OMPI_MCA_ess=singleton: not an mpirun job, so its
// workers meet through the store; mpirun's own ranks carry OMPI_MCA_ess=^singleton.
TEST(BackendFactory, AnMpiSingletonIsNotAnMpirunJob) {
  if (launched_by_mpirun()) GTEST_SKIP() << "launched by mpirun";
  {
    test::ScopedEnv rank("PMIX_RANK", "0");
    {
      test::ScopedEnv ess("OMPI_MCA_ess", "singleton");
      EXPECT_FALSE(launched_by_mpirun());
      EXPECT_EQ(environment::launcher_rank(), std::nullopt);
    }
    test::ScopedEnv ess("OMPI_MCA_ess", "^singleton");
    EXPECT_TRUE(launched_by_mpirun());
    EXPECT_EQ(environment::launcher_rank(), 0);
  }
  EXPECT_FALSE(launched_by_mpirun());
}

// register_backend: a backend added from outside loom is made by name and through
// LOOM_BACKEND, with the setup create_backend was given.
TEST(BackendFactory, ARegisteredBackendIsMadeByNameWithItsSetup) {
  BackendSetup seen;
  int made = 0;
  register_backend("test-registered", [&](const BackendSetup& setup) {
    seen = setup;
    ++made;
    return make_local_backend();
  });
  const auto names = built_backends();
  EXPECT_EQ(names.front(), "local");
  EXPECT_NE(std::find(names.begin(), names.end(), "test-registered"), names.end());
  BackendSetup setup;
  setup.rank = 2;
  setup.world_size = 5;
  setup.group = "tp";
  setup.timeout = std::chrono::seconds(7);
  auto backend = create_backend("test-registered", setup);
  EXPECT_EQ(backend->name(), "local");
  EXPECT_EQ(made, 1);
  EXPECT_EQ(seen.rank, 2);
  EXPECT_EQ(seen.world_size, 5);
  EXPECT_EQ(seen.group, "tp");
  EXPECT_EQ(seen.timeout, std::chrono::seconds(7));
  test::ScopedEnv env("LOOM_BACKEND", "test-registered");
  create_backend();
  EXPECT_EQ(made, 2);
  EXPECT_EQ(seen.group, "world");  // the default setup
}

TEST(BackendFactory, RegisteringTwiceOrEmptyIsNamed) {
  auto factory = [](const BackendSetup&) { return make_local_backend(); };
  register_backend("test-twice", factory);
  expect_error(ErrorCode::invalid_argument,
               "register_backend: backend 'test-twice' is already registered",
               [&] { register_backend("test-twice", factory); });
  expect_error(ErrorCode::invalid_argument, "register_backend: backend 'local' is already",
               [&] { register_backend("local", factory); });
  expect_error(ErrorCode::invalid_argument, "the backend name is empty",
               [&] { register_backend("", factory); });
  expect_error(ErrorCode::invalid_argument, "the factory of backend 'test-empty' is empty",
               [] { register_backend("test-empty", BackendFactory{}); });
  // A factory's own error reaches the caller unchanged.
  register_backend("test-failing", [](const BackendSetup&) -> std::shared_ptr<Backend> {
    throw Error(ErrorCode::unavailable, "test-failing: no store given");
  });
  expect_error(ErrorCode::unavailable, "test-failing: no store given",
               [] { create_backend("test-failing"); });
}

TEST(BackendFactory, EnvironmentChoosesTheBackend) {
  {
    test::ScopedEnv env("LOOM_BACKEND", "nonsense");
    expect_error(
        ErrorCode::invalid_argument,
        "unknown backend 'nonsense' (from LOOM_BACKEND) (known: local, mpi, nccl, ucx; available "
        "in this build: local",
        [] { create_backend(); });
  }
  test::ScopedEnv env("LOOM_BACKEND", "local");
  EXPECT_EQ(create_backend()->name(), "local");
}

}  // namespace
}  // namespace loom
