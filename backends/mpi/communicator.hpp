// Communicator: an MPI communicator of the mpi backend's own, kept alive by every request on it.
// Private to backends/mpi.
#pragma once

#include "mpi_runtime.hpp"  // first: it includes mpi.h without the C++ bindings

#include <vector>

namespace loom::mpi {

/// @brief A communicator of the backend's own, shared by a backend and its pending works so
/// that the communicator outlives every request on it: a duplicate of MPI_COMM_WORLD or of
/// another Communicator, or (a subgroup) a new communicator over some ranks of MPI_COMM_WORLD
/// made by MPI_Comm_create_group, which only those ranks call. Its errors are returned
/// (MPI_ERRORS_RETURN) and become loom::Error instead of aborting the job.
class Communicator {
 public:
  /// @brief A duplicate of `parent` (collective over `parent`).
  explicit Communicator(MPI_Comm parent = MPI_COMM_WORLD);
  /// @brief The ranks `world_ranks` of MPI_COMM_WORLD, in that order (collective over them
  /// only; `tag` tells apart groups made at the same time by disjoint sets of ranks).
  Communicator(const std::vector<int>& world_ranks, int tag);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  MPI_Comm get() const noexcept { return _comm; }
  int rank() const noexcept { return _rank; }
  int size() const noexcept { return _size; }

 private:
  void finish_setup();

  MPI_Comm _comm = MPI_COMM_NULL;
  int _rank = 0;
  int _size = 1;
};

}  // namespace loom::mpi
