// Soak on the MPI backend (ctest runs it under mpirun): the training-step graph for many steps;
// memory, pinned pool and file descriptors flat after warm-up on every rank. Long form:
// LOOM_SOAK_ITERATIONS=10000.
#include <gtest/gtest.h>

#include "soak/soak.hpp"

namespace loom {
namespace {

TEST(Soak, MpiBackendStaysFlat) {
  auto backend = create_backend("mpi");
  test::soak(*backend, test::soak_iterations(200));
  // Every rank agrees on the outcome, so one rank's failure fails the job on all of them.
  std::int32_t failed = ::testing::Test::HasFailure() ? 1 : 0;
  backend->allreduce(Buffer(&failed, 1, DType::int32), ReduceOp::sum);
  EXPECT_EQ(failed, 0) << "ranks with failures";
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
