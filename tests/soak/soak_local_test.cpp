// Soak on the local backend: 3 ranks (threads), the training-step graph for many steps; memory,
// pinned pool and file descriptors flat after warm-up. Long form: LOOM_SOAK_ITERATIONS=10000.
#include <gtest/gtest.h>

#include "loom/local.hpp"
#include "soak/soak.hpp"

namespace loom {
namespace {

TEST(Soak, LocalBackendThreeRanksStaysFlat) {
  const long iterations = test::soak_iterations(300);
  LocalWorld::run(3, [&](Backend& backend) { test::soak(backend, iterations); });
}

}  // namespace
}  // namespace loom
