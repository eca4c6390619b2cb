// Algorithm: one way of performing a collective that the benchmark times (loom's backend call,
// or the same MPI call made directly).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "loom/algorithm.hpp"
#include "loom/backend.hpp"

namespace loom::bench {

/// @brief One collective call: the operation, its buffers and, where it applies, the
/// operator and root. Broadcast works in place on `recv`.
struct Call {
  Collective collective = Collective::allreduce;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  Buffer send;
  Buffer recv;
};

/// @brief A timed implementation of the collectives.
class Algorithm {
 public:
  virtual ~Algorithm() = default;
  /// @brief The name -a takes: "native", "mpi-raw".
  virtual std::string_view name() const noexcept = 0;
  /// @brief Why this combination cannot run here (a row is then skipped), or "" when it can.
  virtual std::string unsupported(Collective collective, DType dtype, ReduceOp op) const = 0;
  /// @brief Why this algorithm cannot run this particular call (a size too small for the
  /// ranks...; the row is then skipped), or "".
  virtual std::string cannot_run(const Call& call) const {
    (void)call;
    return {};
  }
  /// @brief What actually runs for `call` when the name does not say it ("auto" names the
  /// selector's choice), or "".
  virtual std::string chosen(const Call& call) const {
    (void)call;
    return {};
  }
  /// @brief Performs the call and returns once it is complete on this rank.
  virtual void run(const Call& call) = 0;
};

/// @brief One of loom's algorithms (ring, rd, ...; see loom/algorithm.hpp) on `backend`.
std::unique_ptr<Algorithm> make_loom_algorithm(Backend& backend, loom::Algorithm algorithm);

/// @brief What the AlgorithmSelector (LOOM_TUNING_FILE, LOOM_<COLL>) chooses for each call.
std::unique_ptr<Algorithm> make_auto_algorithm(Backend& backend);

/// @brief loom's own call on `backend`: the blocking form (the *_async call, then Work::wait).
std::unique_ptr<Algorithm> make_native_algorithm(Backend& backend);

/// @brief The MPI call loom's mpi backend stands for (MPI_Allreduce, ...), made directly on a
/// duplicate of MPI_COMM_WORLD. Needs MPI to be initialised (by the mpi backend).
/// Defined only when loom is built with MPI.
std::unique_ptr<Algorithm> make_mpi_raw_algorithm();

}  // namespace loom::bench
