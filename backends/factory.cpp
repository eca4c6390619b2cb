// create_backend: LOOM_BACKEND, mpirun detection and the list of backends this build has.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "loom/backend.hpp"
#include "loom/config.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"
#include "loom/local.hpp"
#if LOOM_HAVE_MPI
#include "loom/mpi.hpp"
#endif
#if LOOM_HAVE_NCCL
#include "loom/nccl.hpp"
#endif

namespace loom {

std::vector<std::string> built_backends() {
  std::vector<std::string> names{"local"};
#if LOOM_HAVE_MPI
  names.push_back("mpi");
#endif
#if LOOM_HAVE_NCCL
  names.push_back("nccl");
#endif
  return names;
}

bool launched_by_mpirun() noexcept {
  return environment::launched_by_mpirun();
}

std::shared_ptr<Backend> create_backend(std::string_view name) {
  std::string chosen(name);
  if (chosen.empty()) {
    chosen = environment::text("LOOM_BACKEND").value_or("");
  }
  const auto built = built_backends();
  if (chosen.empty()) {
    const bool mpi_built = std::find(built.begin(), built.end(), "mpi") != built.end();
    chosen = launched_by_mpirun() && mpi_built ? "mpi" : "local";
  }
  if (chosen == "local") return make_local_backend();
#if LOOM_HAVE_MPI
  if (chosen == "mpi") return make_mpi_backend();
#endif
#if LOOM_HAVE_NCCL
  if (chosen == "nccl") {
    // NCCL needs a CPU transport to share its unique id: MPI under mpirun, else one rank.
    std::shared_ptr<Backend> bootstrap;
#if LOOM_HAVE_MPI
    if (launched_by_mpirun()) bootstrap = make_mpi_backend();
#endif
    if (!bootstrap) bootstrap = make_local_backend();
    return make_nccl_backend(*bootstrap);
  }
#endif
  std::string list;
  for (const auto& b : built) list += (list.empty() ? "" : ", ") + b;
  if (chosen == "mpi" || chosen == "nccl")
    throw Error(ErrorCode::unavailable,
                "backend '" + chosen +
                    "' was not built into this loom (available in this build: " + list + ")");
  throw Error(ErrorCode::invalid_argument,
              "unknown backend '" + chosen + "'" +
                  (name.empty() ? std::string(" (from LOOM_BACKEND)") : std::string()) +
                  " (known: local, mpi, nccl; available in this build: " + list + ")");
}

}  // namespace loom
