// ConstructionWatch: ends the process when making the mpi backend, a collective MPI has no
// nonblocking form of, outlives the timeout. Private to backends/mpi.
#pragma once

#include <chrono>
#include <optional>

#include "loom/call_watchdog.hpp"

namespace loom::mpi {

/// @brief Making a backend is collective (two MPI_Comm_dup of MPI_COMM_WORLD, the host split and
/// its shared window, the topology exchange) and MPI has no nonblocking form of these calls: a
/// rank that never makes its backend (it failed or stopped before, in code that runs on some
/// ranks only) would leave its peers inside them forever. They run watched, from this object's
/// construction to its destruction: at `limit` loom says what it waited for and ends the
/// process, as for any blocking call it cannot abandon.
class ConstructionWatch {
 public:
  explicit ConstructionWatch(std::chrono::nanoseconds limit);

 private:
  CallWatchdog _watchdog;
  std::optional<WatchedCall> _watched;
};

}  // namespace loom::mpi
