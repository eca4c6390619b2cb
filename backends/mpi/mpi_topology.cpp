// node_topology: an MPI communicator's ranks grouped by node (MPI_COMM_TYPE_SHARED).
#include "mpi_topology.hpp"

#include <cstring>
#include <string>
#include <vector>

#include "loom/error.hpp"
#include "mpi_errors.hpp"

namespace loom::mpi {
namespace {

void check(const char* call, int rc) {
  mpi::check("mpi backend: finding which ranks share a node", call, rc);
}

}  // namespace

Topology node_topology(MPI_Comm comm) {
  int rank = 0, size = 1;
  check("MPI_Comm_rank", MPI_Comm_rank(comm, &rank));
  check("MPI_Comm_size", MPI_Comm_size(comm, &size));
  MPI_Comm node = MPI_COMM_NULL;
  check("MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)",
        MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  // The node's name: its lowest rank (the node communicator's rank 0, split keyed by rank).
  int leader = rank;
  const int rc = MPI_Bcast(&leader, 1, MPI_INT, 0, node);
  MPI_Comm_free(&node);
  check("MPI_Bcast on the node", rc);
  std::vector<int> leaders(static_cast<std::size_t>(size));
  check("MPI_Allgather of the nodes",
        MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, comm));
  // Each node's host name, so that a failure can name the node of a missing rank.
  char name[MPI_MAX_PROCESSOR_NAME]{};
  int length = 0;
  check("MPI_Get_processor_name", MPI_Get_processor_name(name, &length));
  std::vector<char> names(static_cast<std::size_t>(size) * MPI_MAX_PROCESSOR_NAME);
  check("MPI_Allgather of the host names",
        MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME,
                      MPI_CHAR, comm));
  std::vector<std::string> name_of_rank;
  for (int r = 0; r < size; ++r) {
    const char* text = names.data() + static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME;
    name_of_rank.emplace_back(text, strnlen(text, MPI_MAX_PROCESSOR_NAME));
  }
  const Topology topology = Topology::from_node_ids(leaders);
  try {
    return topology.with_node_names(name_of_rank);
  } catch (const Error&) {
    // Ranks sharing memory under different host names (containers): the nodes stay unnamed.
    return topology;
  }
}

}  // namespace loom::mpi
