// GPU-direct capability report: CUDA-aware MPI, CUDA peer access between devices, and the
// nvidia-peermem / nv_peer_mem kernel module; and the check that refuses GPU-direct without them.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace loom {

/// @brief What this process can do to move GPU memory without staging through the host.
struct GpuDirectCapabilities {
  bool mpi_built = false;  ///< loom was built with MPI
  /// @brief The MPI headers declare MPIX_Query_cuda_support (MPIX_CUDA_AWARE_SUPPORT).
  bool mpi_cuda_extension = false;
  /// @brief MPIX_Query_cuda_support() returned 1 (queried only once MPI is initialised).
  bool mpi_cuda_aware = false;
  bool mpi_queried = false;   ///< false when MPI was not initialised at detection time
  bool cuda_runtime = false;  ///< libcudart could be loaded
  int cuda_devices = 0;
  std::vector<std::pair<int, int>> peer_access;  ///< (from, to) pairs with peer access
  std::string peer_memory_module;                ///< "nvidia_peermem", "nv_peer_mem" or ""
  std::string notes;                             ///< why something could not be probed

  /// @brief GPU-direct RDMA between nodes: CUDA-aware MPI, a GPU and the peer-memory module.
  bool rdma() const noexcept {
    return mpi_cuda_aware && cuda_devices > 0 && !peer_memory_module.empty();
  }
  /// @brief Device buffers can go straight to MPI (CUDA-aware MPI and a GPU).
  bool cuda_aware_mpi() const noexcept { return mpi_cuda_aware && cuda_devices > 0; }
  /// @brief The report loom-collectives --info prints, one "key: value" per line.
  std::string describe() const;
};

/// @brief Probes the capabilities now (CUDA through dlopen, so a build without a GPU at run time
/// reports zero devices instead of failing).
GpuDirectCapabilities detect_gpu_direct();

/// @brief Throws ErrorCode::unsupported listing every missing piece when `caps` cannot do
/// CUDA-aware MPI.
void require_gpu_direct(const GpuDirectCapabilities& caps);

}  // namespace loom
