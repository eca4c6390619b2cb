// The topology of an MPI communicator: its ranks grouped by the node whose memory they share.
// Private to backends/mpi.
#pragma once

#include "loom/topology.hpp"
#include "mpi_runtime.hpp"

namespace loom::mpi {

/// @brief Which ranks of `comm` share a node: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED),
/// then every rank's node (named by its lowest rank of `comm`) gathered to all. Collective
/// over `comm`; throws ErrorCode::backend_failure naming the MPI call that failed.
Topology node_topology(MPI_Comm comm);

}  // namespace loom::mpi
