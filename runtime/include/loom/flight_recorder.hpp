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
/// collective can afford them; a repeated blocking call and a completion without a time stamp
/// are one compare-exchange on the slot's word (its state and newest sequence number), inline.
/// Readers (entries(), dump()) copy each slot under its record id and word, retry one being
/// written and skip one rewritten meanwhile. The collective sequence it hands out
/// (collective_seq_id) counts every collective of this rank's communicator in issue order, so
/// the n-th collective has the same number on every rank.
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
  /// times are whichever call wrote last. Inline: it runs before every blocking collective.
  std::uint64_t record_blocking(const OperationInfo& info, std::int64_t& collective_seq) noexcept {
    if (!info.collective || !info.name.empty())
      return record_new_blocking(info, collective_seq, -1);
    return record_blocking(info.op, info.algorithm, info.dtype, info.count, collective_seq);
  }
  /// @brief record_blocking of an unnamed collective: `op` and `algorithm` as in OperationInfo.
  std::uint64_t record_blocking(std::string_view op, std::string_view algorithm, DType dtype,
                                std::size_t count, std::int64_t& collective_seq) noexcept;
  /// @brief Moves record `id` to `state` (ignored once the slot was reused: a late completion
  /// never marks the entry that took it); `stamp` false leaves its times alone (a blocking
  /// call's completion: then it is one compare-exchange, inline).
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
  // A slot's word: what a repeat or a completion changes, so that each is one compare-exchange,
  // and the seqlock version readers check. Bit 0 is set while a writer holds the slot; bits 1-2
  // the state; bit 3 marks a blocking collective's entry (it may count repeats), bit 4 a
  // point-to-point one; the rest is the newest call's collective_seq_id (p2p_seq_id for
  // point-to-point). Each call's number is in one entry only and loom's callers only move a
  // state forward (a repeat moves the number on), so a word that a compare-exchange expects is
  // found only while the slot still holds that entry and call. (A word can come back unchanged
  // after a writer held the slot and changed nothing a compare-exchange relies on: an update
  // of a reused slot, or to the state the entry had.)
  static constexpr std::uint64_t writing_bit = 1;
  static constexpr unsigned state_shift = 1;
  static constexpr std::uint64_t state_mask = std::uint64_t{3} << state_shift;
  static constexpr std::uint64_t blocking_bit = 8;
  static constexpr std::uint64_t p2p_bit = 16;
  static constexpr unsigned number_shift = 5;
  static constexpr std::uint64_t state_bits(OperationState state) noexcept {
    return static_cast<std::uint64_t>(state) << state_shift;
  }
  static constexpr std::uint64_t no_record = ~std::uint64_t{0};  // a slot's id while written
  static constexpr std::size_t name_words = 8;                   // 63 characters and a NUL

  // Every field an atomic, so that a reader copying a slot while its writer fills it is a
  // benign (and detected) race rather than undefined behaviour; relaxed stores are plain moves
  // on x86. The fields a repeat reads and writes share the first cache line; the name has its own.
  struct alignas(64) Slot {
    std::atomic<std::uint64_t> id{no_record};
    std::atomic<std::uint64_t> word{0};
    std::atomic<const char*> op{nullptr};
    std::atomic<const char*> algorithm{nullptr};
    std::atomic<std::uint64_t> count{0};
    std::atomic<std::int64_t> started{0};  // ticks; a repeat's: when its newest call started
    std::atomic<std::uint32_t> op_length{0};
    std::atomic<std::uint32_t> algorithm_length{0};
    std::atomic<std::uint8_t> dtype{0};
    // Second line.
    std::atomic<std::int64_t> first{0};  // the number (see word) of the entry's first call
    std::atomic<std::int64_t> created{0};
    std::atomic<std::int64_t> completed{0};
    std::atomic<std::int32_t> peer{-1};
    std::atomic<std::uint64_t> name[name_words]{};
  };

  // A time stamp cheap enough for every collective: the TSC where there is one (a few ns, no
  // system call, never trapped by a hypervisor on the machines loom targets), else
  // steady_clock. entries() turns ticks into wall-clock time.
  static std::int64_t ticks() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    return static_cast<std::int64_t>(__builtin_ia32_rdtsc());
#else
    return steady_ticks();
#endif
  }
  static std::int64_t steady_ticks() noexcept;
  // Takes slot `s` for writing (sets the word's writing bit; waits while another writer has
  // it); returns the word it found.
  static std::uint64_t take(Slot& s) noexcept;
  // record_blocking when the call does not repeat the newest entry; `seq` when the collective
  // sequence number was already taken (>= 0).
  std::uint64_t record_new_blocking(const OperationInfo& info, std::int64_t& seq_out,
                                    std::int64_t seq) noexcept;
  // The same for an unnamed collective, out of line (and out of the way: cold) so that the
  // repeat never builds the info and its path stays in a few cache lines.
  [[gnu::cold]] std::uint64_t record_new_blocking(std::string_view op, std::string_view algorithm,
                                                  DType dtype, std::size_t count,
                                                  std::int64_t& seq_out, std::int64_t seq) noexcept;
  // update() under the slot, with a time stamp or when a writer holds the slot.
  [[gnu::cold]] void update_taken(std::uint64_t id, OperationState state, bool stamp) noexcept;
  // Fills slot `id` (taken from _next_record) with a new entry.
  void write(std::uint64_t id, const OperationInfo& info, OperationState state, std::int64_t number,
             bool p2p, bool blocking) noexcept;
  // The slot of record `id`: a mask for the power-of-two capacities (the default's), since a
  // 64-bit division would be a tenth of recording a sub-microsecond call.
  Slot& slot_of(std::uint64_t id) const noexcept {
    return _slots[_ring_mask ? static_cast<std::size_t>(id & _ring_mask)
                             : static_cast<std::size_t>(id % _capacity)];
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

// The repeat: the newest entry is this call's op, algorithm, dtype and count, blocking, and
// completed; the call takes the next collective number, and if that follows the entry's newest
// call with nothing recorded since, one compare-exchange moves the entry's word to this call,
// started (the writing bit held for the time stamp, so that readers see the two together).
inline std::uint64_t FlightRecorder::record_blocking(std::string_view op,
                                                     std::string_view algorithm, DType dtype,
                                                     std::size_t count,
                                                     std::int64_t& seq_out) noexcept {
  const std::uint64_t end = _next_record.load(std::memory_order_relaxed);
  if (end == 0 || _capacity < 2)
    return record_new_blocking(op, algorithm, dtype, count, seq_out, -1);
  Slot& s = slot_of(end - 1);
  const std::uint64_t word = s.word.load(std::memory_order_acquire);
  constexpr std::uint64_t repeatable = blocking_bit | state_bits(OperationState::completed);
  const bool same = (word & (writing_bit | state_mask | blocking_bit | p2p_bit)) == repeatable &&
                    s.id.load(std::memory_order_relaxed) == end - 1 &&
                    s.op.load(std::memory_order_relaxed) == op.data() &&
                    s.count.load(std::memory_order_relaxed) == count &&
                    s.algorithm.load(std::memory_order_relaxed) == algorithm.data() &&
                    s.dtype.load(std::memory_order_relaxed) == static_cast<std::uint8_t>(dtype) &&
                    s.op_length.load(std::memory_order_relaxed) == op.size() &&
                    s.algorithm_length.load(std::memory_order_relaxed) == algorithm.size();
  if (!same) return record_new_blocking(op, algorithm, dtype, count, seq_out, -1);
  const std::int64_t seq = _next_collective.fetch_add(1, std::memory_order_acq_rel);
  seq_out = seq;
  // Only the very next collective, with no record in between, joins the entry (an asynchronous
  // one may have been recorded meanwhile by another thread).
  if (static_cast<std::uint64_t>(seq) != (word >> number_shift) + 1 ||
      _next_record.load(std::memory_order_relaxed) != end)
    return record_new_blocking(op, algorithm, dtype, count, seq_out, seq);
  const std::uint64_t next = (static_cast<std::uint64_t>(seq) << number_shift) | blocking_bit |
                             state_bits(OperationState::started);
  std::uint64_t expected = word;
  if (!s.word.compare_exchange_strong(expected, next | writing_bit, std::memory_order_acquire,
                                      std::memory_order_relaxed))
    return record_new_blocking(op, algorithm, dtype, count, seq_out, seq);
  std::atomic_thread_fence(std::memory_order_release);  // the bit before the stamp
  s.started.store(ticks(), std::memory_order_relaxed);
  s.word.store(next, std::memory_order_release);
  return end - 1;
}

// Without a stamp, one compare-exchange of the word, which fails (and is retried against the
// new word) if anything moved: the id is read after the word, so a word of a rewritten slot is
// never taken for this record's.
inline void FlightRecorder::update(std::uint64_t id, OperationState state, bool stamp) noexcept {
  if (_capacity == 0) return;
  if (!stamp) {
    Slot& s = slot_of(id);
    std::uint64_t word = s.word.load(std::memory_order_acquire);
    while ((word & writing_bit) == 0) {
      if (s.id.load(std::memory_order_relaxed) != id) return;
      if (s.word.compare_exchange_weak(word, (word & ~state_mask) | state_bits(state),
                                       std::memory_order_release, std::memory_order_acquire))
        return;
    }
  }
  update_taken(id, state, stamp);
}

}  // namespace loom
