// The NCCL backend: configuration, construction over a bootstrap backend, and launch groups.
// nccl.h and cuda_runtime.h stay out of this header.
#pragma once

#include <chrono>
#include <memory>

#include "loom/backend.hpp"
#include "loom/cuda_stream.hpp"

namespace loom {

/// @brief How loom uses NCCL; from_env() reads LOOM_NCCL_DEVICE and LOOM_TIMEOUT_S.
struct NcclConfig {
  /// @brief The CUDA device of this rank; -1 picks local rank % visible devices (the local rank
  /// from OMPI_COMM_WORLD_LOCAL_RANK / LOCAL_RANK, else the bootstrap rank).
  int device = -1;
  /// @brief An operation (or the communicator set-up) not done after this long fails with
  /// ErrorCode::timeout and the communicator is aborted (ncclCommAbort); later operations
  /// fail with ErrorCode::cancelled.
  std::chrono::milliseconds timeout = std::chrono::minutes(5);
  /// @brief Collectives start after the work enqueued on this stream so far (recorded with an
  /// event when each operation is issued, no host wait); nullptr: the legacy default stream.
  cuda::NativeStream input_stream = nullptr;
  /// @brief Enqueue every operation on input_stream itself instead of the backend's own
  /// high-priority communication stream: no event and no cross-stream wait per operation
  /// (about 0.4 us less on an H100), at the price of communication and compute sharing one
  /// stream (no overlap between them on the device).
  bool run_on_input_stream = false;

  /// @brief Defaults overridden by LOOM_NCCL_DEVICE=<index> and LOOM_TIMEOUT_S=<seconds>.
  static NcclConfig from_env();
};

/// @brief A backend whose operations are NCCL calls on device buffers of this rank's GPU,
/// enqueued on a high-priority communication stream the backend owns; a Work completes when a
/// CUDA event recorded behind the operation does (polled, never synchronised), and fails when
/// ncclCommGetAsyncError reports an error.
///
/// `bootstrap` (MPI across processes, or a LocalWorld rank for one process driving several
/// GPUs) carries the set-up: every rank publishes "host + GPU PCI bus id" (or why it has no
/// GPU) and, before NCCL is touched, every rank fails alike with ErrorCode::unavailable when
/// some rank has no usable GPU, or ErrorCode::unsupported when two ranks would share one GPU
/// (NCCL refuses that). Then rank 0's ncclUniqueId is broadcast and the communicator is made
/// non-blocking (ncclCommInitRankConfig, blocking = 0), so that a timeout can abort it.
///
/// NCCL has no tags, no wildcards and no probe: send/recv take tag 0 and a definite peer, and
/// probe/recv_message are ErrorCode::unsupported. Buffers must be on this rank's device.
std::shared_ptr<Backend> make_nccl_backend(Backend& bootstrap,
                                           const NcclConfig& config = NcclConfig::from_env());

/// @brief While alive, NCCL operations started on this thread (on any nccl backend) are
/// queued and launched together when the group ends (ncclGroupStart / ncclGroupEnd): the way
/// to issue a bucket's collectives in one launch. Their Works complete after the group ended.
/// Groups nest; only the outermost one launches.
class NcclGroup {
 public:
  NcclGroup();
  /// @brief Ends the group if end() was not called (errors are then reported on the Works).
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  /// @brief Launches the group now; throws loom::Error if NCCL refuses it.
  void end();

 private:
  bool _open = true;
};

}  // namespace loom
