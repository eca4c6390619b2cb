// SharedBoard: the shared window made and its slots found on every rank of the host, and the
// heartbeat thread started.
#include "shared_board.hpp"

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <new>
#include <stop_token>
#include <vector>

namespace loom::mpi {

SharedBoard::SharedBoard(MPI_Comm world) {
  int world_size = 1, world_rank = 0;
  MPI_Comm_size(world, &world_size);
  MPI_Comm_rank(world, &world_rank);
  _slots.assign(static_cast<std::size_t>(world_size), nullptr);
  if (MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &_host) != MPI_SUCCESS)
    return;
  MPI_Comm_set_errhandler(_host, MPI_ERRORS_RETURN);
  void* base = nullptr;
  if (MPI_Win_allocate_shared(sizeof(RankSlot), 1, MPI_INFO_NULL, _host, &base, &_window) !=
      MPI_SUCCESS) {
    _window = MPI_WIN_NULL;
    MpiRuntime::instance().free_at_finalize(_window, _host);
    return;
  }
  // Freed just before MPI_Finalize with every other board's window, in the order they were
  // made (the same on every rank: backends are made collectively), whether this board is
  // destroyed by then or not: freeing is collective, and ranks destroy their backends in
  // different orders (Python's garbage collector frees loom_torch's reducers when it runs) or
  // not at all, which in destruction order would leave each rank waiting in another window's
  // free.
  // A board still alive at finalize (its backend held by an object Python never collected,
  // after an exception) stops beating into the window before it is freed.
  MpiRuntime::instance().free_at_finalize(_window, _host, [beating = _beating] {
    std::lock_guard hold(beating->mutex);
    beating->slot = nullptr;
  });
  new (base) RankSlot();  // zero: nothing started, completed or failed
  MPI_Barrier(_host);     // every slot constructed before anyone reads one
  int host_size = 1;
  MPI_Comm_size(_host, &host_size);
  MPI_Group host_group, world_group;
  MPI_Comm_group(_host, &host_group);
  MPI_Comm_group(world, &world_group);
  std::vector<int> host_ranks(host_size), world_ranks(host_size);
  for (int k = 0; k < host_size; ++k) host_ranks[k] = k;
  MPI_Group_translate_ranks(host_group, host_size, host_ranks.data(), world_group,
                            world_ranks.data());
  MPI_Group_free(&host_group);
  MPI_Group_free(&world_group);
  for (int k = 0; k < host_size; ++k) {
    MPI_Aint size = 0;
    int unit = 0;
    void* slot = nullptr;
    if (MPI_Win_shared_query(_window, k, &size, &unit, &slot) == MPI_SUCCESS &&
        world_ranks[k] >= 0 && world_ranks[k] < world_size)
      _slots[static_cast<std::size_t>(world_ranks[k])] = static_cast<RankSlot*>(slot);
  }
  if (RankSlot* mine = _slots[static_cast<std::size_t>(world_rank)]) {
    _beating->slot = mine;
    _heartbeat = std::jthread([beating = _beating](std::stop_token stop) {
      std::mutex mutex;
      std::condition_variable_any wake;
      std::unique_lock lock(mutex);
      // wait_for returns the predicate's value (false) on a stop too: the loop tests the stop.
      while (!stop.stop_requested()) {
        {
          std::lock_guard hold(beating->mutex);
          if (beating->slot == nullptr) return;  // the window is about to be freed
          RankBoard::beat(*beating->slot);
        }
        wake.wait_for(lock, stop, std::chrono::milliseconds(100), [] { return false; });
      }
    });
  }
}

}  // namespace loom::mpi
