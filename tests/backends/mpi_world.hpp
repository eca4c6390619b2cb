// The MPI world of a multi-rank test binary run by ctest under mpirun: the backend, the
// all-ranks verdict every test ends with, and a main() whose report only rank 0 prints.
#pragma once

#include <memory>
#include <string>

#include "backends/every_rank.hpp"
#include "loom/mpi.hpp"

namespace loom::testing {

inline Backend& world() {
  static std::shared_ptr<Backend> backend = make_mpi_backend();
  return *backend;
}

/// @brief every_rank.hpp's verdict over the MPI world.
inline void expect_all_ranks_ok(const std::string& failure) {
  expect_all_ranks_ok(world(), failure);
}

/// @brief main() of such a binary: MPI starts before any test (every_rank.hpp's main).
inline int run_all_tests_on_every_rank(int argc, char** argv) {
  return run_all_tests_on_every_rank(world(), argc, argv);
}

}  // namespace loom::testing
