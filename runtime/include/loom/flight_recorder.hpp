// FlightRecorder: each rank's last N communication operations in a fixed-size ring, written as
// JSON (field names after PyTorch's flight recorder) when a run times out, mismatches or fails.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loom/dtype.hpp"

namespace loom {

/// @brief Where an operation is: handed to the transport (scheduled), accepted by it (started),
/// done (completed), or ended in an error (failed).
enum class OperationState : std::uint8_t { scheduled, started, completed, failed };

/// @brief "scheduled", "started", "completed", "failed".
std::string_view to_string(OperationState state) noexcept;

/// @brief A copy of one entry of the ring.
struct FlightRecord {
  std::uint64_t record_id = 0;          ///< every operation of this recorder, from 0
  std::int64_t collective_seq_id = -1;  ///< collectives only: the same on every rank
  std::int64_t p2p_seq_id = -1;         ///< point-to-point only
  std::string profiling_name;           ///< the node's name, or the call ("allreduce")
  std::string op;                       ///< "allreduce", "send", ...
  DType dtype = DType::uint8;
  std::size_t count = 0;
  std::string algorithm;  ///< "native", "ring", ...
  int peer = -1;          ///< point-to-point: the other rank
  OperationState state = OperationState::scheduled;
  std::int64_t time_created_ns = 0;  ///< wall clock (ns since the epoch)
  std::int64_t time_discovered_started_ns = 0;
  std::int64_t time_discovered_completed_ns = 0;  ///< completed or failed; 0 while running
  /// Blocking collectives only: how many identical calls before this one the entry also stands
  /// for (FlightRecorder::record_blocking). They are collectives collective_seq_id - repeats to
  /// collective_seq_id - 1, all completed; state and times are the newest call's.
  std::uint64_t repeats = 0;
};

/// @brief What an operation is, for FlightRecorder::record. `op` and `algorithm` must be
/// strings of static storage (to_string() results): the ring keeps the pointers.
struct OperationInfo {
  std::string_view name;  ///< copied (up to 63 characters); empty: the op names it
  std::string_view op;
  DType dtype = DType::uint8;
  std::size_t count = 0;
  std::string_view algorithm;
  int peer = -1;
  bool collective = true;
};

/// @brief The last `capacity` entries of one rank (an operation each, or a run of repeated
/// blocking collectives: record_blocking), without locks.
///
/// record() and the state updates are a handful of relaxed atomic stores, one compare-exchange
/// that takes the slot (a writer waits only for another writing the same slot, i.e. when the
/// ring wrapped under a descheduled writer) and a time-stamp counter read, so that every
/// collective can afford them; readers (entries(), dump()) copy each slot under its record id
/// and version, retry one being written and skip one rewritten meanwhile. The collective
/// sequence it hands out (collective_seq_id) counts every collective of this rank's
/// communicator in issue order, so the n-th collective has the same number on every rank.
class FlightRecorder {
 public:
  /// @brief `capacity` entries (0: keep none; sequence numbers are still counted).
  explicit FlightRecorder(std::size_t capacity);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  /// @brief LOOM_FLIGHT_RECORDER_SIZE, else 2048; a malformed value is invalid_argument.
  static std::size_t default_capacity();
  /// @brief LOOM_FLIGHT_RECORDER_DIR, or empty when unset (dumps are then skipped).
  static std::string default_directory();

  std::size_t capacity() const noexcept { return _capacity; }

  /// @brief Records a new operation in state `state`; returns its record id, and its
  /// collective_seq_id in `*collective_seq` when given (-1 for point-to-point).
  std::uint64_t record(const OperationInfo& info, OperationState state = OperationState::scheduled,
                       std::int64_t* collective_seq = nullptr) noexcept;
  /// @brief A blocking collective, started now: record(info, started, collective_seq), except
  /// that a call identical to the newest record (an unnamed blocking collective of the same op,
  /// algorithm, dtype and count that completed, with nothing recorded since) is counted in that
  /// entry (FlightRecord::repeats) rather than written into a new one: a loop of small blocking
  /// calls keeps one warm slot instead of sweeping the ring, and the ring keeps the last
  /// `capacity` different operations. Returns the entry's record id (the same for every call an
  /// entry counts). A rank's blocking calls are sequential; calls from several threads at once
  /// each get their own sequence number and are each counted once, but the entry's state and
  /// times are whichever call wrote last.
  std::uint64_t record_blocking(const OperationInfo& info, std::int64_t& collective_seq) noexcept;
  /// @brief Moves record `id` to `state` under its slot, like every writer (ignored once the
  /// slot was reused: a late completion never marks the entry that took it); `stamp` false
  /// leaves its times alone (a blocking call's completion: the time-stamp read is most of the
  /// cost of recording a sub-microsecond call).
  void update(std::uint64_t id, OperationState state, bool stamp = true) noexcept;
  /// @brief The collective_seq_id of record `id` (its newest call's), or -1 (not a collective,
  /// or overwritten).
  std::int64_t collective_seq_of(std::uint64_t id) const noexcept;

  /// @brief collective_seq_id the next collective will get (= collectives recorded so far).
  std::int64_t next_collective_seq() const noexcept {
    return _next_collective.load(std::memory_order_acquire);
  }
  /// @brief The name of collective `seq` if it is still in the ring, else empty.
  std::string name_of_collective(std::int64_t seq) const;

  /// @brief The entries still in the ring, oldest first.
  std::vector<FlightRecord> entries() const;

  /// @brief JSON of the ring ({"version", "rank", ..., "entries": [...]}).
  std::string to_json(int rank, int world, std::string_view backend, std::string_view reason) const;
  /// @brief Writes to_json() to `<directory>/loom_flight_recorder_rank<rank>.json` (directory:
  /// LOOM_FLIGHT_RECORDER_DIR when empty); returns the path written, or empty when no
  /// directory is set or writing failed (never throws: it runs while reporting another error).
  std::string dump(int rank, int world, std::string_view backend, std::string_view reason,
                   std::string directory = {}) const noexcept;

 private:
  struct Slot;
  // Takes slot `s` for writing (its version even to odd; waits while another writer has it);
  // returns the even version it found.
  static std::uint64_t take(Slot& s) noexcept;
  // Counts collective `seq` as a repeat in slot `s` if it still holds record `id` and `seq`
  // follows its newest call; false (the slot untouched) otherwise.
  static bool count_repeat(Slot& s, std::uint64_t id, std::int64_t seq) noexcept;
  // Fills slot `id` (taken from _next_record) with a new entry.
  void write(std::uint64_t id, const OperationInfo& info, OperationState state,
             std::int64_t collective_seq, std::int64_t p2p_seq, bool blocking) noexcept;
  // The slot of record `id`: a mask for the power-of-two capacities (the default's), since a
  // 64-bit division would be a tenth of recording a sub-microsecond call.
  std::size_t slot_of(std::uint64_t id) const noexcept {
    return _ring_mask ? static_cast<std::size_t>(id & _ring_mask)
                      : static_cast<std::size_t>(id % _capacity);
  }
  std::size_t _capacity;
  std::uint64_t _ring_mask;  // capacity - 1 when capacity is a power of two (> 1), else 0
  std::unique_ptr<Slot[]> _slots;
  std::atomic<std::uint64_t> _next_record{0};
  std::atomic<std::int64_t> _next_collective{0};
  std::atomic<std::int64_t> _next_p2p{0};
  // The time-stamp counter at construction and the wall clock then: ticks become ns at read.
  std::int64_t _ticks0;
  std::int64_t _wall0_ns;
  std::int64_t _steady0_ns;
};

}  // namespace loom
