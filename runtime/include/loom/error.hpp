// loom::Error: the one exception type loom throws, with a code a program can act on.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace loom {

/// @brief What kind of failure an Error reports (docs/ERRORS.md lists each).
enum class ErrorCode {
  invalid_argument,  ///< the caller passed something loom cannot use (sizes, dtypes, ranks)
  unsupported,       ///< the combination is valid in general but not here (op on a dtype)
  unavailable,       ///< a backend or feature was not built or cannot start
  mismatch,          ///< ranks disagree (collective sequence, message size)
  timeout,           ///< an operation did not complete in the allowed time
  backend_failure,   ///< the transport (MPI, NCCL) reported an error
  cancelled,         ///< the operation was abandoned because something else failed
  out_of_memory,     ///< a pool or allocator could not satisfy a request
  graph_invalid,     ///< a task graph failed validation (cycle, race, dangling edge)
  node_failed,       ///< a node of a task graph threw during a run
  peer_failed,       ///< another rank failed (its node threw, its call was refused), so this
                     ///< rank's operation or run cannot be trusted or cannot complete
  internal,          ///< a loom bug: please report it
};

/// @brief The stable, lower-case name of a code ("invalid_argument").
std::string_view to_string(ErrorCode code) noexcept;

/// @brief The exception loom throws; what() reads "[loom:<code>] <message>".
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);

  /// @brief The kind of failure.
  ErrorCode code() const noexcept { return _code; }
  /// @brief The message without the "[loom:<code>] " prefix.
  const std::string& message() const noexcept { return _message; }

 private:
  ErrorCode _code;
  std::string _message;
};

}  // namespace loom
