// SharedBoard: the ranks' board in a shared-memory window over the ranks of this host, and this
// rank's heartbeat thread. Private to backends/mpi.
#pragma once

#include "mpi_runtime.hpp"  // first: it includes mpi.h without the C++ bindings

#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "loom/rank_board.hpp"

namespace loom::mpi {

/// @brief The ranks' board in a shared-memory window over the ranks of this host
/// (MPI_Win_allocate_shared on an MPI_COMM_TYPE_SHARED split): each rank's RankSlot is written
/// with plain atomic stores and read by its host peers with plain loads, so a peer that is
/// stopped, dead or stuck in a call still says how far it got. Ranks on other hosts are not
/// visible (their slots are null): a timeout message names them as such. A thread of its own
/// beats this rank's heartbeat every 100 ms whatever the rank's other threads do (inside a
/// blocking MPI call too), so its peers tell a stopped or frozen process from one waiting in a
/// collective.
class SharedBoard {
 public:
  /// @brief Collective over `world`.
  explicit SharedBoard(MPI_Comm world);
  /// @brief Freeing the window is collective, and a peer may be stopped or dead: it is freed
  /// just before MPI_Finalize (registered when it was made), never here. The heartbeat thread
  /// stops at once (jthread: request_stop, then join).
  ~SharedBoard() = default;
  SharedBoard(const SharedBoard&) = delete;
  SharedBoard& operator=(const SharedBoard&) = delete;

  /// @brief Every rank of `world`'s slot; null for the ranks of other hosts.
  const std::vector<RankSlot*>& slots() const noexcept { return _slots; }

 private:
  MPI_Comm _host = MPI_COMM_NULL;
  MPI_Win _window = MPI_WIN_NULL;
  std::vector<RankSlot*> _slots;
  // This rank's slot while the window exists; shared with the heartbeat thread and the
  // runtime's finalize, which clears it before freeing the window.
  struct Beating {
    std::mutex mutex;
    RankSlot* slot = nullptr;
  };
  std::shared_ptr<Beating> _beating = std::make_shared<Beating>();
  std::jthread _heartbeat;
};

}  // namespace loom::mpi
