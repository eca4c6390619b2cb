// Communicator: made by MPI_Comm_dup or MPI_Comm_create_group, freed unless MPI is finalised or
// requests on it were abandoned.
#include "communicator.hpp"

#include "loom/work.hpp"
#include "mpi_errors.hpp"

namespace loom::mpi {

Communicator::Communicator(MPI_Comm parent) {
  check("mpi backend", "MPI_Comm_dup", MPI_Comm_dup(parent, &_comm));
  finish_setup();
}

Communicator::Communicator(const std::vector<int>& world_ranks, int tag) {
  MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  check("mpi backend", "MPI_Comm_group", MPI_Comm_group(MPI_COMM_WORLD, &world_group));
  int rc =
      MPI_Group_incl(world_group, static_cast<int>(world_ranks.size()), world_ranks.data(), &group);
  MPI_Group_free(&world_group);
  check("mpi backend", "MPI_Group_incl", rc);
  rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &_comm);
  MPI_Group_free(&group);
  check("mpi backend", "MPI_Comm_create_group", rc);
  finish_setup();
}

Communicator::~Communicator() {
  // MPI_Comm_free after MPI_Finalize is illegal; a backend kept in a static may die that late.
  // With abandoned requests on it, leave it to the end of the process (which loom then ends
  // without MPI_Finalize): freeing it is collective in the standard's sense.
  if (_comm != MPI_COMM_NULL && !finalized() && abandoned_operations() == 0) MPI_Comm_free(&_comm);
}

void Communicator::finish_setup() {
  // Errors come back as return codes (and become loom::Error) instead of aborting the job.
  const int rc = MPI_Comm_set_errhandler(_comm, MPI_ERRORS_RETURN);
  if (rc != MPI_SUCCESS) {
    MPI_Comm_free(&_comm);
    throw failure("mpi backend", "MPI_Comm_set_errhandler", rc);
  }
  MPI_Comm_rank(_comm, &_rank);
  MPI_Comm_size(_comm, &_size);
}

}  // namespace loom::mpi
