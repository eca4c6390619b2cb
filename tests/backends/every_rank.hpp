// What a multi-rank test binary (under mpirun, or loom-launch) shares whatever its backend: the
// all-ranks verdict every test ends with, and a main() whose report only rank 0 prints.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "loom/backend.hpp"

namespace loom::testing {

/// @brief Every test ends by agreeing on whether all ranks passed, so one rank's failure
/// cannot leave the others waiting in the next collective.
inline void expect_all_ranks_ok(Backend& world, const std::string& failure) {
  EXPECT_TRUE(failure.empty()) << failure;
  std::int32_t bad = failure.empty() ? 0 : 1;
  world.allreduce(Buffer(&bad, 1, DType::int32), ReduceOp::sum);
  EXPECT_EQ(bad, 0) << bad << " rank(s) saw wrong values";
}

/// @brief main() of such a binary, once `world` exists: every rank runs and asserts, only
/// rank 0 prints gtest's report.
inline int run_all_tests_on_every_rank(Backend& world, int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (world.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  return RUN_ALL_TESTS();
}

}  // namespace loom::testing
