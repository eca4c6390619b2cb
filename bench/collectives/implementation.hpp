// Implementation: one way of performing a collective that the benchmark times (loom's backend call,
// or the same MPI call made directly).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "loom/algorithm.hpp"
#include "loom/backend.hpp"

namespace loom::bench {

/// @brief A timed implementation of the collectives.
class Implementation {
 public:
  virtual ~Implementation() = default;
  /// @brief The name -a takes: "native", "mpi-raw".
  virtual std::string_view name() const noexcept = 0;
  /// @brief Why this combination cannot run here (a row is then skipped), or "" when it can.
  virtual std::string unsupported(Collective collective, DType dtype, ReduceOp op) const = 0;
  /// @brief Why this algorithm cannot run this particular call (a size too small for the
  /// ranks...; the row is then skipped), or "".
  virtual std::string cannot_run(const CollectiveArgs& call) const {
    (void)call;
    return {};
  }
  /// @brief What actually runs for `call` when the name does not say it ("auto" names the
  /// selector's choice), or "".
  virtual std::string chosen(const CollectiveArgs& call) const {
    (void)call;
    return {};
  }
  /// @brief Performs the call and returns once it is complete on this rank.
  virtual void run(const CollectiveArgs& call) = 0;
};

/// @brief One of loom's algorithms (ring, rd, ...; see loom/algorithm.hpp) on `backend`.
std::unique_ptr<Implementation> make_loom_implementation(Backend& backend,
                                                         loom::Algorithm algorithm);

/// @brief What the AlgorithmSelector (LOOM_TUNING_FILE, LOOM_<COLL>) chooses for each call.
std::unique_ptr<Implementation> make_auto_implementation(Backend& backend);

/// @brief loom's own call on `backend`: the blocking form (the *_async call, then Work::wait).
std::unique_ptr<Implementation> make_native_implementation(Backend& backend);

/// @brief The MPI call loom's mpi backend stands for (MPI_Allreduce, ...), made directly on a
/// duplicate of MPI_COMM_WORLD. Needs MPI to be initialised (by the mpi backend).
/// Defined only when loom is built with MPI.
std::unique_ptr<Implementation> make_mpi_raw_implementation();

}  // namespace loom::bench
