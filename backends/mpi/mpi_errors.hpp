// How the mpi backend reports MPI's failures and MPI's int counts as loom::Error. Private to
// backends/mpi.
#pragma once

#include "mpi_runtime.hpp"  // first: it includes mpi.h without the C++ bindings

#include <climits>
#include <cstddef>
#include <string>

#include "loom/error.hpp"

namespace loom::mpi {

/// @brief "<where>: <call> failed: <MPI's text>", where <where> is "allreduce on rank 1 of 4
/// (mpi)": ErrorCode::backend_failure.
inline Error failure(const std::string& where, const std::string& call, int rc) {
  return Error(ErrorCode::backend_failure, where + ": " + call + " failed: " + error_text(rc));
}

/// @brief Throws failure(where, call, rc) unless rc is MPI_SUCCESS.
inline void check(const std::string& where, const char* call, int rc) {
  if (rc != MPI_SUCCESS) throw failure(where, call, rc);
}

/// @brief `count` as MPI's int count. MPI counts are int; larger buffers would need derived
/// datatypes, which predefined reduction ops do not accept, so they are refused clearly
/// instead (ErrorCode::unsupported).
inline int to_int(const std::string& where, const char* what, std::size_t count) {
  if (count > static_cast<std::size_t>(INT_MAX))
    throw Error(ErrorCode::unsupported, where + ": " + what + " " + std::to_string(count) +
                                            " exceeds " + std::to_string(INT_MAX) +
                                            ", the largest count MPI takes (split the buffer)");
  return static_cast<int>(count);
}

}  // namespace loom::mpi
