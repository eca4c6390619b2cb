// The Open MPI backend: configuration and construction (mpi.h stays out of this header).
#pragma once

#include <memory>

#include "loom/backend.hpp"

namespace loom {

/// @brief How loom uses MPI (seed 001's MPIConfig); from_env() reads LOOM_MPI_* variables.
struct MpiConfig {
  /// @brief Pass device buffers straight to MPI when it reports CUDA support.
  bool use_cuda_aware = true;
  /// @brief Fail when MPI cannot give MPI_THREAD_MULTIPLE (loom's progress engine and TBB
  /// workers call MPI from several threads, so a lower level would be unsafe).
  bool require_thread_multiple = true;

  /// @brief Defaults overridden by LOOM_MPI_CUDA_AWARE=0|1.
  static MpiConfig from_env();
};

/// @brief The MPI backend over a duplicate of MPI_COMM_WORLD. Initialises MPI on first use
/// (MPI_Init_thread with MPI_THREAD_MULTIPLE) and finalises it at exit only if loom did.
/// Throws ErrorCode::unavailable when MPI cannot start or lacks the thread level.
std::shared_ptr<Backend> make_mpi_backend(const MpiConfig& config = MpiConfig::from_env());

}  // namespace loom
