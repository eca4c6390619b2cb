// PointToPointBackend: a Backend over a transport that moves tagged messages only (ucx): the
// narrow set of calls such a transport implements, its collectives run by loom's algorithms, and
// HostBoard, the rank board its processes share in memory on each host.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "loom/backend.hpp"
#include "loom/rank_board.hpp"
#include "loom/store.hpp"

namespace loom {

/// @brief Which traffic a message is: a user's send/recv, or loom's algorithms (whose tags
/// never match a user's receive).
enum class MessageChannel : unsigned char { user, algorithm };

/// @brief How a PointToPointBackend runs its collectives: start `args` (validated) on `backend`
/// and return the Work, unrecorded. loom::start_on_algorithms (algorithms/, a layer above
/// backends/, hence passed in by whoever makes the backend).
using CollectiveStarter =
    std::function<std::unique_ptr<Work>(Backend& backend, const CollectiveArgs& args)>;

class DeviceStaging;
struct StagingRequest;

/// @brief A Backend whose transport has no collectives. A transport implements rank(),
/// world_size(), name(), start_message() (both channels), poll_probe(), receive_message() and
/// max_tag(); everything else (validation, the flight record, the rank board, the watchdog,
/// agreement, timeouts) is Backend's, and every collective is the CollectiveStarter's, so the
/// selector's `native` for such a backend is loom's algorithms (start_on_algorithms' choice).
/// With stage_device_buffers, operations on CUDA buffers run on pinned host copies.
class PointToPointBackend : public Backend {
 public:
  bool has_algorithm_channel() const noexcept final { return true; }
  /// @brief The CPU; and this process's CUDA devices once stage_device_buffers was called.
  bool supports(Device device) const noexcept override;

 protected:
  /// @brief `collectives` must not be empty (ErrorCode::invalid_argument).
  explicit PointToPointBackend(CollectiveStarter collectives);

  /// @brief Moves CUDA buffers through pinned host memory (CUDA builds): each operation on a
  /// device buffer copies it down after the work enqueued on `input_stream` so far (nullptr:
  /// the legacy default stream), runs on the host copy (allreduce, reduce and broadcast in
  /// chunks of `chunk_bytes`, pipelined with the copies; the others whole), and completes when
  /// the result is back on the device. Without CUDA: ErrorCode::unavailable.
  void stage_device_buffers(std::size_t chunk_bytes, cuda::NativeStream input_stream);

  /// @brief Starts sending (`send`) or receiving exactly buffer.bytes() into `buffer`, to or
  /// from `peer` (a receive: or any_source) with `tag` (a receive: or any_tag) on `channel`;
  /// arguments already validated. A received message of another size fails the Work with
  /// ErrorCode::mismatch naming both sizes.
  virtual std::unique_ptr<Work> start_message(MessageChannel channel, bool send, Buffer buffer,
                                              int peer, int tag) = 0;

 private:
  std::unique_ptr<Work> start_broadcast(Buffer buffer, int root) final;
  std::unique_ptr<Work> start_reduce(Buffer send, Buffer recv, ReduceOp op, int root) final;
  std::unique_ptr<Work> start_allreduce(Buffer send, Buffer recv, ReduceOp op) final;
  std::unique_ptr<Work> start_allgather(Buffer send, Buffer recv) final;
  std::unique_ptr<Work> start_reduce_scatter(Buffer send, Buffer recv, ReduceOp op) final;
  std::unique_ptr<Work> start_alltoall(Buffer send, Buffer recv) final;
  std::unique_ptr<Work> start_barrier() final;
  std::unique_ptr<Work> start_send(Buffer buffer, int peer, int tag) final;
  std::unique_ptr<Work> start_recv(Buffer buffer, int peer, int tag) final;
  std::unique_ptr<Work> start_algorithm_send(Buffer buffer, int peer, int tag) final;
  std::unique_ptr<Work> start_algorithm_recv(Buffer buffer, int peer, int tag) final;

  bool staged(Buffer buffer) const noexcept;
  std::unique_ptr<Work> stage(StagingRequest request);

  CollectiveStarter _collectives;
  std::shared_ptr<DeviceStaging> _staging;  // shared_ptr: no complete type needed where unused
};

/// @brief The rank board of a job that met through a store, as the MPI backend's shared window:
/// the lowest rank of each host creates a POSIX shared-memory segment of one RankSlot per rank
/// (shm_open, named through the rendezvous and unlinked once every rank of the host mapped it),
/// so that a peer that is stopped, dead or stuck still says how far it got; a thread of its own
/// beats this rank's heartbeat every 100 ms. Ranks on other hosts are named with their host.
/// The mapping stays until the process ends (the backend's watchdog may read it while the
/// backend is destroyed); the heartbeat stops with this object. Collective over the rendezvous;
/// a host whose segment cannot be made or opened gets no slots (its board says nothing, the
/// reason on stderr) rather than failing the backend.
class HostBoard {
 public:
  explicit HostBoard(Rendezvous& rendezvous);
  ~HostBoard();
  HostBoard(const HostBoard&) = delete;
  HostBoard& operator=(const HostBoard&) = delete;

  /// @brief The board over the slots (set_rank_board), naming every rank's host.
  std::unique_ptr<RankBoard> make_board() const;

 private:
  int _rank = 0;
  std::vector<RankSlot*> _slots;
  std::vector<std::string> _hosts;
  std::jthread _heartbeat;
};

}  // namespace loom
