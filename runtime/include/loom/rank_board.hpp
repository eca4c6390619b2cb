// RankBoard: where every rank publishes the collective it last started and completed, and its
// failures, in memory its peers read without any progress from the rank itself (a shared-memory
// window under MPI, shared state on the local backend). It says who is missing on a timeout.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

class FlightRecorder;

/// @brief One rank's entry on the board. Lives in memory shared by the ranks of a host (lock-free
/// atomics are address-free, so they work across processes); plain data, no constructor needed
/// beyond zero-initialisation.
struct RankSlot {
  std::atomic<std::uint64_t> started;    ///< 1 + collective_seq_id last started (0: none)
  std::atomic<std::uint64_t> completed;  ///< 1 + collective_seq_id last completed (0: none)
  std::atomic<std::uint64_t> failures;   ///< how many failures this rank published
  std::atomic<std::int64_t> failed_seq;  ///< the first collective it had not issued then
  std::atomic<std::uint64_t> drained;    ///< bit 0: it issued the rest of that run's collectives;
                                         ///< bit 1: the failure is a consequence (a timeout)
  std::atomic<std::uint64_t> text[32];   ///< the failure's message (255 characters)
  std::atomic<std::int64_t> alive_ns;    ///< steady_clock (CLOCK_MONOTONIC, one per host) ns
                                         ///< of the process's last heartbeat (0: it has none)
};

/// @brief This rank's view of the board.
class RankBoard {
 public:
  /// @brief `slots[r]` is rank r's slot, or nullptr for a rank whose slot this process cannot
  /// see (another host).
  RankBoard(int rank, std::vector<RankSlot*> slots);

  int rank() const noexcept { return _rank; }
  int world_size() const noexcept { return static_cast<int>(_slots.size()); }

  /// @brief This rank started / completed collective `seq`: each entry only ever grows (one
  /// compare-exchange), since starts and completions may come from several threads out of
  /// issue order (a blocking call beside the progress thread's completions, several
  /// collectives in flight), and a peer reading a number that went back would name the wrong
  /// collective as missing.
  void started(std::int64_t seq) noexcept {
    if (_mine) raise(_mine->started, static_cast<std::uint64_t>(seq + 1));
  }
  void completed(std::int64_t seq) noexcept {
    if (_mine) raise(_mine->completed, static_cast<std::uint64_t>(seq + 1));
  }

  /// @brief This rank's process is alive now: a heartbeat (one clock read and one store), from
  /// a thread that runs whatever the rank's other threads do (the MPI backend's board beats
  /// every 100 ms), so that a peer tells a stopped or frozen process from one waiting inside a
  /// collective. A board that never beats says nothing about liveness.
  void beat() noexcept {
    if (_mine) beat(*_mine);
  }
  static void beat(RankSlot& slot) noexcept;

  /// @brief A rank whose last heartbeat is older than this is named as stopped or frozen.
  static constexpr double silent_after_s = 1.0;

  /// @brief Publishes a failure of this rank: its message, the first collective it had not
  /// issued (`next_seq`), and whether it will issue the rest of the run (drain) so that its
  /// peers' collectives complete with its stale data.
  /// `consequence`: the failure only follows another rank's (a timeout waiting for it, a
  /// peer_failed): peers then do not report this rank as the cause.
  void publish_failure(std::string_view message, std::int64_t next_seq, bool drained,
                       bool consequence = false) noexcept;

  /// @brief What rank `r` published.
  struct Peer {
    bool visible = false;  ///< false: on another host (nothing known)
    std::int64_t last_started = -1;
    std::int64_t last_completed = -1;
    std::uint64_t failures = 0;
    std::int64_t failed_seq = -1;
    bool drained = false;
    bool consequence = false;  ///< the failure follows another rank's (it timed out too)
    double quiet_s = -1;       ///< seconds since its last heartbeat, read on its host (-1: none)
    std::string failure;       ///< the latest failure's message
  };
  Peer read(int r) const;

  /// @brief How this rank learns about the ranks it cannot see: `host_of_rank[r]` names rank
  /// r's host (node) in messages, and `ask(seq)` asks the other hosts for their boards when a
  /// timeout in collective `seq` needs them (the MPI backend exchanges them across hosts with a
  /// deadline): entry r is what rank r's host said of it, or empty where no rank of that host
  /// answered. Set once, before the board is shared between threads.
  using RemoteQuery = std::function<std::vector<std::optional<Peer>>(std::int64_t seq)>;
  void set_remote(std::vector<std::string> host_of_rank, RemoteQuery ask);

  /// @brief A peer failure that makes this rank's run stale: a peer that failed before
  /// issuing a collective in [first_seq, end_seq) and drained it (so the collective completed
  /// here with its stale data). Failures already reported, and those of earlier collectives,
  /// are consumed; later ones are kept for the run they belong to.
  struct Failure {
    int rank = -1;
    std::int64_t seq = -1;
    std::string message;
  };
  std::optional<Failure> take_stale_run_failure(std::int64_t first_seq, std::int64_t end_seq);

  /// @brief Why collective `seq` has not completed here, for a timeout message: "rank 2 did
  /// not arrive (last started #56 'bucket2.allreduce')", the failure of a missing rank that
  /// published one, or, where every rank started it, those that have not completed it: first
  /// any whose heartbeat is older than silent_after_s ("rank 5 started it but its process has
  /// shown no sign of life for 4.0 s (stopped, frozen or dead)"), then the live ones; with
  /// set_remote, ranks on other hosts as their hosts answered, each missing one with its host
  /// ("rank 2 on host b did not arrive"), and the ranks of a host that did not answer named with it
  /// ("ranks 2, 3 on host b: no rank of host b answered"). `failed_rank` gets a missing rank that
  /// published a failure (else -1).
  std::string who_is_missing(std::int64_t seq, const FlightRecorder& recorder,
                             int* failed_rank = nullptr) const;

 private:
  static void raise(std::atomic<std::uint64_t>& entry, std::uint64_t value) noexcept {
    std::uint64_t now = entry.load(std::memory_order_relaxed);
    while (now < value && !entry.compare_exchange_weak(now, value, std::memory_order_release,
                                                       std::memory_order_relaxed)) {
    }
  }

  int _rank;
  std::vector<RankSlot*> _slots;
  RankSlot* _mine;
  std::mutex _mutex;                 // guards _seen
  std::vector<std::uint64_t> _seen;  // failures of each peer already consumed
  std::vector<std::string> _hosts;   // by rank; empty: unknown
  RemoteQuery _ask;
};

}  // namespace loom
