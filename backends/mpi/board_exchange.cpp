// BoardExchange: each host's rank board sent to the other hosts at a timeout, with a deadline.
#include "board_exchange.hpp"

#include <algorithm>
#include <cstring>
#include <thread>

namespace loom::mpi {
namespace {

constexpr int board_tag = 7023;

// One rank's entry on the wire (plain bytes: every rank runs the same build).
struct WireSlot {
  std::int32_t rank;
  std::int32_t flags;  // 1 drained, 2 consequence
  std::int64_t last_started;
  std::int64_t last_completed;
  std::int64_t failed_seq;
  std::uint64_t failures;
  double quiet_s;  // seconds since its last heartbeat, on its host (-1: none)
  char failure[256];
};

struct WireHeader {
  std::int64_t seq;  // the collective the sender waits for
  std::int32_t node;
  std::int32_t count;
};

}  // namespace

BoardExchange::BoardExchange(MPI_Comm world, Topology topology, std::vector<RankSlot*> slots,
                             std::chrono::milliseconds wait)
    : _topology(std::move(topology)),
      _reader(0, slots),
      _wait(wait),
      _silent(static_cast<std::size_t>(_topology.node_count()), false),
      _said(static_cast<std::size_t>(_topology.world_size())) {
  MPI_Comm_rank(world, &_rank);
  // A communicator of its own: the answers never match the algorithms' or the user's messages.
  if (MPI_Comm_dup(world, &_comm) != MPI_SUCCESS) _comm = MPI_COMM_NULL;
  if (_comm != MPI_COMM_NULL) MPI_Comm_set_errhandler(_comm, MPI_ERRORS_RETURN);
}

BoardExchange::~BoardExchange() {
  // Freeing a communicator is collective and a host may be gone: left to MPI_Finalize.
  if (finalized()) return;
  if (_comm != MPI_COMM_NULL) MpiRuntime::instance().free_at_finalize(MPI_WIN_NULL, _comm);
  // A send to a dead or stopped host may never complete: its request is released, and its
  // buffer kept to the end of the process, since MPI may still read it.
  for (MPI_Request& r : _requests)
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  static std::mutex kept_mutex;
  static std::list<std::vector<char>> kept;
  std::lock_guard lock(kept_mutex);
  kept.splice(kept.end(), _sent);
}

void BoardExchange::receive(std::int64_t seq, std::vector<bool>& fresh) {
  for (;;) {
    int flag = 0;
    MPI_Message message;
    MPI_Status status;
    if (MPI_Improbe(MPI_ANY_SOURCE, board_tag, _comm, &flag, &message, &status) != MPI_SUCCESS ||
        !flag)
      return;
    int bytes = 0;
    MPI_Get_count(&status, MPI_BYTE, &bytes);
    std::vector<char> buffer(static_cast<std::size_t>(std::max(bytes, 0)));
    if (MPI_Mrecv(buffer.data(), bytes, MPI_BYTE, &message, MPI_STATUS_IGNORE) != MPI_SUCCESS)
      return;
    if (buffer.size() < sizeof(WireHeader)) continue;
    WireHeader header;
    std::memcpy(&header, buffer.data(), sizeof header);
    if (header.node < 0 || header.node >= _topology.node_count() || header.count < 0 ||
        buffer.size() < sizeof header + sizeof(WireSlot) * static_cast<std::size_t>(header.count))
      continue;
    for (int k = 0; k < header.count; ++k) {
      WireSlot w;
      std::memcpy(&w, buffer.data() + sizeof header + sizeof w * static_cast<std::size_t>(k),
                  sizeof w);
      if (w.rank < 0 || w.rank >= _topology.world_size()) continue;
      RankBoard::Peer p;
      p.visible = true;
      p.last_started = w.last_started;
      p.last_completed = w.last_completed;
      p.failed_seq = w.failed_seq;
      p.failures = w.failures;
      p.drained = (w.flags & 1) != 0;
      p.consequence = (w.flags & 2) != 0;
      p.quiet_s = w.quiet_s;
      w.failure[sizeof w.failure - 1] = '\0';
      p.failure = w.failure;
      _said[static_cast<std::size_t>(w.rank)] = std::move(p);
    }
    // An answer for this collective or a later one: the host is alive and past it.
    if (header.seq >= seq) fresh[static_cast<std::size_t>(header.node)] = true;
    _silent[static_cast<std::size_t>(header.node)] = false;
  }
}

std::vector<std::optional<RankBoard::Peer>> BoardExchange::ask(std::int64_t seq) {
  std::lock_guard lock(_mutex);
  const int my_node = _topology.node_of(_rank);
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::optional<RankBoard::Peer>> result(_said.size());
  if (_comm == MPI_COMM_NULL || _topology.node_count() < 2) return result;
  const bool recent = _asked_seq >= 0 && now - _asked < std::chrono::seconds(10);
  if (!recent) {
    // This host's board: every slot this rank can see.
    const auto mine = _topology.ranks_of_node(my_node);
    WireHeader header{seq, my_node, static_cast<std::int32_t>(mine.size())};
    std::vector<char>& buffer = _sent.emplace_back(sizeof header + sizeof(WireSlot) * mine.size());
    std::memcpy(buffer.data(), &header, sizeof header);
    for (std::size_t k = 0; k < mine.size(); ++k) {
      const RankBoard::Peer p = _reader.read(mine[k]);
      WireSlot w{};
      w.rank = mine[k];
      w.flags = (p.drained ? 1 : 0) | (p.consequence ? 2 : 0);
      w.last_started = p.last_started;
      w.last_completed = p.last_completed;
      w.failed_seq = p.failed_seq;
      w.failures = p.failures;
      w.quiet_s = p.quiet_s;
      std::strncpy(w.failure, p.failure.c_str(), sizeof w.failure - 1);
      std::memcpy(buffer.data() + sizeof header + sizeof w * k, &w, sizeof w);
    }
    for (int r = 0; r < _topology.world_size(); ++r) {
      if (_topology.node_of(r) == my_node) continue;
      MPI_Request request = MPI_REQUEST_NULL;
      if (MPI_Isend(buffer.data(), static_cast<int>(buffer.size()), MPI_BYTE, r, board_tag, _comm,
                    &request) == MPI_SUCCESS)
        _requests.push_back(request);
    }
    // Until every other host that has not been silent before answered, or the deadline.
    std::vector<bool> fresh(static_cast<std::size_t>(_topology.node_count()), false);
    fresh[static_cast<std::size_t>(my_node)] = true;
    const auto deadline = now + _wait;
    for (;;) {
      receive(seq, fresh);
      bool waiting = false;
      for (int node = 0; node < _topology.node_count(); ++node)
        waiting = waiting || (!fresh[node] && !_silent[node]);
      if (!waiting || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    for (int node = 0; node < _topology.node_count(); ++node)
      if (!fresh[node]) {
        _silent[node] = true;
        for (int r : _topology.ranks_of_node(node)) _said[static_cast<std::size_t>(r)].reset();
      }
    // Sends that completed free their requests (their buffers stay: a few hundred bytes each).
    std::erase_if(_requests, [](MPI_Request& r) {
      int done = 0;
      MPI_Test(&r, &done, MPI_STATUS_IGNORE);
      return done != 0;
    });
    _asked = now;
    _asked_seq = seq;
  }
  for (int r = 0; r < _topology.world_size(); ++r)
    if (_topology.node_of(r) != my_node) result[static_cast<std::size_t>(r)] = _said[r];
  return result;
}

}  // namespace loom::mpi
