// Harness: the untimed collective steps of the benchmark itself (barriers, agreeing on results).
#pragma once

#include <cstdint>
#include <memory>

#include "loom/backend.hpp"
#include "loom/config.hpp"

namespace loom::bench {

/// @brief Synchronises the ranks around timed blocks and combines per-rank results.
///
/// Every algorithm of a run is timed between the same barriers: on the mpi backend they are
/// MPI_Barrier calls made directly, whose exit is as tight as MPI can make it, so that neither
/// algorithm inherits the other's synchronisation.
class Harness {
 public:
  virtual ~Harness() = default;
  virtual void barrier() = 0;
  /// @brief The largest `value` over the ranks (every rank gets it).
  virtual double max(double value) = 0;
  /// @brief The sum of `value` over the ranks (every rank gets it).
  virtual std::int64_t sum(std::int64_t value) = 0;
};

/// @brief A harness over `backend` (the local backend's ranks are threads).
std::unique_ptr<Harness> make_backend_harness(Backend& backend);

#if LOOM_HAVE_MPI
/// @brief A harness over a duplicate of MPI_COMM_WORLD; MPI must be initialised.
std::unique_ptr<Harness> make_mpi_harness();
/// @brief Ends every process of the job (after a failure that left other ranks inside a
/// collective, where returning would hang them).
[[noreturn]] void abort_mpi_job(int status);
#endif

}  // namespace loom::bench
