// BoardExchange: the rank boards of the other hosts, asked for at a timeout, so that a survivor
// names the missing ranks of another node, or the node that no longer answers.
#pragma once

#include "mpi_runtime.hpp"  // first: it includes mpi.h without the C++ bindings

#include <chrono>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <vector>

#include "loom/rank_board.hpp"
#include "loom/topology.hpp"

namespace loom::mpi {

/// @brief Each host's rank board is shared memory its own ranks read; another host's is out of
/// reach. At a timeout every waiting rank sends its host's board (every slot it can see) to the
/// ranks of the other hosts on a communicator of its own, and reads theirs until one rank of
/// every other host has answered for the same collective or later, or `wait` has passed: a
/// host none of whose ranks answers is down, stopped or cut off. Survivors time out in the
/// same collective within moments of each other, so each one's answer comes while the others
/// wait. A host that stayed silent is not waited for again, and an answer is reused for 10 s
/// (a failure names several collectives at once). Thread-safe.
class BoardExchange {
 public:
  /// @brief Collective over `world` (duplicates it). `slots` as the SharedBoard's.
  BoardExchange(MPI_Comm world, Topology topology, std::vector<RankSlot*> slots,
                std::chrono::milliseconds wait);
  ~BoardExchange();
  BoardExchange(const BoardExchange&) = delete;
  BoardExchange& operator=(const BoardExchange&) = delete;

  /// @brief What the other hosts say of their ranks, by rank (empty: this host's ranks, and the
  /// ranks of a host that did not answer). `seq`: the collective this rank waits for.
  std::vector<std::optional<RankBoard::Peer>> ask(std::int64_t seq);

 private:
  void receive(std::int64_t seq, std::vector<bool>& fresh);

  MPI_Comm _comm = MPI_COMM_NULL;
  Topology _topology;
  int _rank = 0;
  RankBoard _reader;  // reads this host's slots
  std::chrono::milliseconds _wait;
  std::mutex _mutex;
  std::vector<bool> _silent;                          // by node
  std::vector<std::optional<RankBoard::Peer>> _said;  // by rank, the latest answer
  std::list<std::vector<char>> _sent;                 // buffers of sends that may be pending
  std::vector<MPI_Request> _requests;
  std::chrono::steady_clock::time_point _asked{};
  std::int64_t _asked_seq = -1;
};

}  // namespace loom::mpi
