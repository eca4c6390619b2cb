// The Open MPI backend: configuration and construction (mpi.h stays out of this header).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "loom/backend.hpp"

namespace loom {

/// @brief How loom uses MPI; from_env() reads LOOM_MPI_* variables.
struct MpiConfig {
  /// @brief Pass device buffers straight to MPI when it reports CUDA support.
  bool use_cuda_aware = true;
  /// @brief Otherwise device buffers are staged through pinned host memory in chunks of this
  /// many bytes (device-to-host of one chunk overlaps MPI moving the previous one). Only
  /// element-wise operations (allreduce, reduce, broadcast) are chunked; the others, and
  /// point-to-point messages, are staged whole.
  std::size_t staging_chunk_bytes = std::size_t{4} << 20;
  /// @brief Staged operations read their device input, and write their device output, after
  /// the work enqueued on this stream so far (an event, no host wait): a copy or kernel still
  /// in flight there neither feeds stale data in nor lands over the result. nullptr: the
  /// legacy default stream, where cudaMemcpy and kernels launched without a stream run. A
  /// cudaStream_t.
  void* staging_input_stream = nullptr;
  /// @brief Fail when MPI cannot give MPI_THREAD_MULTIPLE (loom's progress engine and TBB
  /// workers call MPI from several threads, so a lower level would be unsafe).
  bool require_thread_multiple = true;
  /// @brief The ranks of MPI_COMM_WORLD the backend spans, in the order of its ranks (rank i of
  /// the backend is world rank ranks[i]); empty: all of them. Only those ranks make it
  /// (MPI_Comm_create_group), together; a rank outside them, a rank named twice or a rank
  /// outside the job is ErrorCode::invalid_argument. For subgroups (torch's new_group).
  std::vector<int> ranks;
  /// @brief Tells apart subgroups made at the same time by disjoint sets of ranks (the same on
  /// every rank of one group; [0, MPI_TAG_UB]).
  int group_tag = 0;

  /// @brief Defaults overridden by LOOM_MPI_CUDA_AWARE=0|1.
  static MpiConfig from_env();
};

/// @brief The MPI backend over a duplicate of MPI_COMM_WORLD (or of the ranks config.ranks
/// names). Initialises MPI on first use
/// (MPI_Init_thread with MPI_THREAD_MULTIPLE) and finalises it at exit only if loom did.
/// Throws ErrorCode::unavailable when MPI cannot start or lacks the thread level.
std::shared_ptr<Backend> make_mpi_backend(const MpiConfig& config = MpiConfig::from_env());

}  // namespace loom
