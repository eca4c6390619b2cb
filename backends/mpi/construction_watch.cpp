// ConstructionWatch: the watchdog that reports a backend whose construction did not complete on
// every rank, and ends the process.
#include "construction_watch.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "loom/environment.hpp"
#include "mpi_runtime.hpp"

namespace loom::mpi {

ConstructionWatch::ConstructionWatch(std::chrono::nanoseconds limit) {
  int rank = -1, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  _watchdog.set_timeout(limit);
  _watchdog.on_expiry([limit, rank, size](std::uint64_t) {
    std::fprintf(stderr,
                 "[loom:timeout] making the mpi backend on rank %d of %d did not complete "
                 "within %s: it is collective (MPI_Comm_dup of MPI_COMM_WORLD, the ranks' "
                 "shared board) and a rank did not make its backend (it failed or stopped "
                 "before; a loom_torch.parallelize() or process group made on some ranks "
                 "only); a blocking MPI call cannot be abandoned, so loom ends this process "
                 "(status %d)\n",
                 rank, size,
                 environment::seconds_text(std::chrono::duration<double>(limit).count()).c_str(),
                 fatal_exit_status);
    std::fflush(nullptr);
    std::_Exit(fatal_exit_status);
  });
  _watched.emplace(_watchdog, 0);
}

}  // namespace loom::mpi
