// MpiCommunicator: the tool's own duplicate of MPI_COMM_WORLD, for calls made without loom.
// Private to loom-collectives (it includes mpi.h).
#pragma once

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <string>

#include "loom/error.hpp"

namespace loom::bench {

/// @brief Throws loom::Error naming the MPI call and MPI's own text for `rc`.
inline void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(rc, text, &length);
  throw Error(ErrorCode::backend_failure, std::string(call) + " failed: " + text);
}

/// @brief MPI_Comm_dup(MPI_COMM_WORLD) with errors returned rather than fatal; freed on
/// destruction unless MPI is already finalised.
class MpiCommunicator {
 public:
  MpiCommunicator() {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (initialised == 0)
      throw Error(ErrorCode::unavailable, "MPI is not initialised (mpi-raw needs the mpi backend)");
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &_comm), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(_comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(_comm, &_rank);
  }
  ~MpiCommunicator() {
    int finalised = 0;
    MPI_Finalized(&finalised);
    if (finalised == 0) MPI_Comm_free(&_comm);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  MPI_Comm get() const noexcept { return _comm; }
  int rank() const noexcept { return _rank; }

 private:
  MPI_Comm _comm = MPI_COMM_NULL;
  int _rank = 0;
};

}  // namespace loom::bench
