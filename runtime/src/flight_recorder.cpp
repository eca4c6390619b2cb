// FlightRecorder: the lock-free ring, its JSON form and the dump file.
#include "loom/flight_recorder.hpp"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "json_quoted.hpp"
#include "loom/environment.hpp"
#include "steady_ns.hpp"

namespace loom {

namespace {

std::int64_t wall_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::string_view to_string(OperationState state) noexcept {
  switch (state) {
    case OperationState::scheduled:
      return "scheduled";
    case OperationState::started:
      return "started";
    case OperationState::completed:
      return "completed";
    case OperationState::failed:
      return "failed";
  }
  return "unknown";
}

std::int64_t FlightRecorder::steady_ticks() noexcept {
  return steady_ns();
}

FlightRecorder::FlightRecorder(std::size_t capacity)
    : _capacity(capacity),
      _ring_mask(capacity > 1 && (capacity & (capacity - 1)) == 0 ? capacity - 1 : 0),
      _slots(capacity ? std::make_unique<Slot[]>(capacity) : nullptr),
      _ticks0(ticks()),
      _wall0_ns(wall_ns()),
      _steady0_ns(steady_ns()) {}

FlightRecorder::~FlightRecorder() = default;

std::size_t FlightRecorder::default_capacity() {
  return static_cast<std::size_t>(
      environment::integer("LOOM_FLIGHT_RECORDER_SIZE", 0, 1 << 20).value_or(2048));
}

std::string FlightRecorder::default_directory() {
  return environment::text("LOOM_FLIGHT_RECORDER_DIR").value_or("");
}

std::uint64_t FlightRecorder::record(const OperationInfo& info, OperationState state,
                                     std::int64_t* seq_out) noexcept {
  const std::uint64_t id = _next_record.fetch_add(1, std::memory_order_relaxed);
  const std::int64_t collective_seq =
      info.collective ? _next_collective.fetch_add(1, std::memory_order_acq_rel) : -1;
  if (seq_out) *seq_out = collective_seq;
  const std::int64_t number =
      info.collective ? collective_seq : _next_p2p.fetch_add(1, std::memory_order_relaxed);
  if (_capacity != 0) write(id, info, state, number, !info.collective, false);
  return id;
}

// A number already taken (`seq` >= 0, by a repeat that could not join its entry) is this
// call's: it goes into the new entry, never dropped for another.
std::uint64_t FlightRecorder::record_new_blocking(const OperationInfo& info, std::int64_t& seq_out,
                                                  std::int64_t seq) noexcept {
  if (!info.collective) return record(info, OperationState::started, &seq_out);
  const std::uint64_t id = _next_record.fetch_add(1, std::memory_order_relaxed);
  if (seq < 0) seq = _next_collective.fetch_add(1, std::memory_order_acq_rel);
  seq_out = seq;
  // Rings of one keep no runs (each call its own entry), nor do named calls.
  if (_capacity != 0)
    write(id, info, OperationState::started, seq, false, _capacity >= 2 && info.name.empty());
  return id;
}

std::uint64_t FlightRecorder::record_new_blocking(std::string_view op, std::string_view algorithm,
                                                  DType dtype, std::size_t count,
                                                  std::int64_t& seq_out,
                                                  std::int64_t seq) noexcept {
  return record_new_blocking({{}, op, dtype, count, algorithm, -1, true}, seq_out, seq);
}

// Every writer takes the slot (the word's writing bit) before filling it, so that two never
// fill one slot at once (a ring that wrapped while a writer was descheduled, or two threads
// counting a repeat), and readers retry a slot whose word is being written or moved.
// A writer holds a slot for a few stores; one that waits longer (the holder was preempted)
// sleeps rather than yields: the progress thread may run at SCHED_FIFO, whose yield gives its
// core only to other realtime threads, never to the holder.
std::uint64_t FlightRecorder::take(Slot& s) noexcept {
  for (int tries = 0;; ++tries) {
    std::uint64_t word = s.word.load(std::memory_order_relaxed);
    if ((word & writing_bit) == 0 &&
        s.word.compare_exchange_weak(word, word | writing_bit, std::memory_order_acquire,
                                     std::memory_order_relaxed)) {
      std::atomic_thread_fence(std::memory_order_release);  // the bit before any field moves
      return word;
    }
    if (tries < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void FlightRecorder::write(std::uint64_t id, const OperationInfo& info, OperationState state,
                           std::int64_t number, bool p2p, bool blocking) noexcept {
  Slot& s = slot_of(id);
  take(s);
  s.id.store(no_record, std::memory_order_relaxed);
  s.first.store(number, std::memory_order_relaxed);
  if (info.name.empty()) {
    s.name[0].store(0, std::memory_order_relaxed);
  } else {
    std::uint64_t words[name_words]{};
    std::memcpy(words, info.name.data(), std::min(info.name.size(), sizeof words - 1));
    for (std::size_t w = 0; w < name_words; ++w)
      s.name[w].store(words[w], std::memory_order_relaxed);
  }
  s.op.store(info.op.data(), std::memory_order_relaxed);
  s.op_length.store(static_cast<std::uint32_t>(info.op.size()), std::memory_order_relaxed);
  s.algorithm.store(info.algorithm.data(), std::memory_order_relaxed);
  s.algorithm_length.store(static_cast<std::uint32_t>(info.algorithm.size()),
                           std::memory_order_relaxed);
  s.count.store(info.count, std::memory_order_relaxed);
  s.peer.store(info.peer, std::memory_order_relaxed);
  s.dtype.store(static_cast<std::uint8_t>(info.dtype), std::memory_order_relaxed);
  const std::int64_t now = ticks();
  s.created.store(now, std::memory_order_relaxed);
  s.started.store(state == OperationState::scheduled ? 0 : now, std::memory_order_relaxed);
  s.completed.store(0, std::memory_order_relaxed);
  // The new word first, still marked as written: whoever sees the new id then reads this
  // entry's number, never the previous entry's (collective_seq_of does not wait for the bit).
  const std::uint64_t word = (static_cast<std::uint64_t>(number) << number_shift) |
                             (p2p ? p2p_bit : 0) | (blocking ? blocking_bit : 0) |
                             state_bits(state);
  s.word.store(word | writing_bit, std::memory_order_relaxed);
  s.id.store(id, std::memory_order_release);
  s.word.store(word, std::memory_order_release);
}

// Under the slot, like every writer: an update of an entry whose slot was reused meanwhile (a
// late completion after the ring wrapped) finds another id there and changes nothing, instead
// of marking the entry that now holds the slot.
void FlightRecorder::update_taken(std::uint64_t id, OperationState state, bool stamp) noexcept {
  Slot& s = slot_of(id);
  if (s.id.load(std::memory_order_relaxed) != id) return;  // long gone: no need to take it
  const std::int64_t now = stamp ? ticks() : 0;
  std::uint64_t word = take(s);
  if (s.id.load(std::memory_order_relaxed) == id) {
    if (stamp && state == OperationState::started)
      s.started.store(now, std::memory_order_relaxed);
    else if (stamp && (state == OperationState::completed || state == OperationState::failed))
      s.completed.store(now, std::memory_order_relaxed);
    word = (word & ~state_mask) | state_bits(state);
  }
  s.word.store(word, std::memory_order_release);
}

std::int64_t FlightRecorder::collective_seq_of(std::uint64_t id) const noexcept {
  if (_capacity == 0) return -1;
  const Slot& s = slot_of(id);
  if (s.id.load(std::memory_order_acquire) != id) return -1;
  const std::uint64_t word = s.word.load(std::memory_order_acquire);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (s.id.load(std::memory_order_relaxed) != id || (word & p2p_bit) != 0) return -1;
  return static_cast<std::int64_t>(word >> number_shift);
}

std::vector<FlightRecord> FlightRecorder::entries() const {
  std::vector<FlightRecord> out;
  if (_capacity == 0) return out;
  const std::uint64_t end = _next_record.load(std::memory_order_acquire);
  const std::uint64_t begin = end > _capacity ? end - _capacity : 0;
  // Ticks to wall-clock ns, by the rate measured since construction.
  const std::int64_t ticks_now = ticks(), steady_now = steady_ns();
  const double ns_per_tick = ticks_now > _ticks0 ? static_cast<double>(steady_now - _steady0_ns) /
                                                       static_cast<double>(ticks_now - _ticks0)
                                                 : 1.0;
  auto to_wall = [&](std::int64_t t) -> std::int64_t {
    if (t == 0) return 0;
    return _wall0_ns + static_cast<std::int64_t>(static_cast<double>(t - _ticks0) * ns_per_tick);
  };
  // A copy of slot `id` taken while its id and version stayed the same; false when the slot was
  // being written (`*busy`) or holds another record.
  auto copy = [&](std::uint64_t id, FlightRecord& r, bool* busy) {
    const Slot& s = slot_of(id);
    const std::uint64_t before = s.id.load(std::memory_order_acquire);
    const std::uint64_t word = s.word.load(std::memory_order_acquire);
    *busy = before == no_record || (before == id && (word & writing_bit) != 0);
    if (before != id || *busy) return false;
    r.record_id = id;
    const auto number = static_cast<std::int64_t>(word >> number_shift);
    const bool p2p = (word & p2p_bit) != 0;
    r.collective_seq_id = p2p ? -1 : number;
    r.p2p_seq_id = p2p ? number : -1;
    r.repeats =
        p2p ? 0 : static_cast<std::uint64_t>(number - s.first.load(std::memory_order_relaxed));
    char name[name_words * 8 + 1]{};
    for (std::size_t w = 0; w < name_words; ++w) {
      const std::uint64_t name_word = s.name[w].load(std::memory_order_relaxed);
      std::memcpy(name + 8 * w, &name_word, 8);
    }
    r.op.clear();
    if (const char* op = s.op.load(std::memory_order_relaxed))
      r.op.assign(op, s.op_length.load(std::memory_order_relaxed));
    r.profiling_name = name[0] != '\0' ? std::string(name) : r.op;
    r.algorithm.clear();
    if (const char* a = s.algorithm.load(std::memory_order_relaxed))
      r.algorithm.assign(a, s.algorithm_length.load(std::memory_order_relaxed));
    r.count = s.count.load(std::memory_order_relaxed);
    r.peer = s.peer.load(std::memory_order_relaxed);
    r.dtype = static_cast<DType>(s.dtype.load(std::memory_order_relaxed));
    r.state = static_cast<OperationState>((word & state_mask) >> state_shift);
    // A repeat stamps only when its call started (a blocking call is created started); a
    // completion time belongs to the entry only once it completed or failed.
    const std::int64_t started = s.started.load(std::memory_order_relaxed);
    r.time_created_ns =
        to_wall(r.repeats > 0 ? started : s.created.load(std::memory_order_relaxed));
    r.time_discovered_started_ns = to_wall(started);
    const std::int64_t completed = s.completed.load(std::memory_order_relaxed);
    r.time_discovered_completed_ns =
        (r.state == OperationState::completed || r.state == OperationState::failed) &&
                completed >= started
            ? to_wall(completed)
            : 0;
    std::atomic_thread_fence(std::memory_order_acquire);
    const std::uint64_t after = s.id.load(std::memory_order_relaxed);
    const bool same_word = s.word.load(std::memory_order_relaxed) == word;
    *busy = after == no_record || (after == id && !same_word);
    return after == id && same_word;  // else rewritten while copied
  };
  for (std::uint64_t id = begin; id < end; ++id) {
    FlightRecord r;
    bool busy = false;
    // A blocking call counting a repeat holds its slot for a few stores: try again then.
    for (int attempt = 0; attempt < 1000; ++attempt) {
      if (copy(id, r, &busy)) {
        out.push_back(std::move(r));
        break;
      }
      if (!busy) break;  // overwritten by a newer record
      std::this_thread::yield();
    }
  }
  return out;
}

std::string FlightRecorder::name_of_collective(std::int64_t seq) const {
  if (seq < 0 || _capacity == 0) return {};
  // Collectives are most of the traffic; scan back from the newest.
  const auto all = entries();
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (seq <= it->collective_seq_id &&
        seq >= it->collective_seq_id - static_cast<std::int64_t>(it->repeats))
      return it->profiling_name;
  return {};
}

std::string FlightRecorder::to_json(int rank, int world, std::string_view backend,
                                    std::string_view reason) const {
  const auto all = entries();
  std::int64_t last_started = -1, last_completed = -1;
  for (const FlightRecord& r : all) {
    if (r.collective_seq_id < 0) continue;
    if (r.state != OperationState::scheduled)
      last_started = std::max(last_started, r.collective_seq_id);
    if (r.state == OperationState::completed)
      last_completed = std::max(last_completed, r.collective_seq_id);
    else if (r.repeats > 0)  // the calls it repeated all completed
      last_completed = std::max(last_completed, r.collective_seq_id - 1);
  }
  char host[256] = "unknown";
  ::gethostname(host, sizeof host - 1);
  std::string out =
      "{\n  \"version\": \"loom-flight-recorder 1\",\n  \"rank\": " + std::to_string(rank) +
      ",\n  \"world_size\": " + std::to_string(world) + ",\n  \"backend\": ";
  append_json_quoted(out, backend);
  out += ",\n  \"host\": ";
  append_json_quoted(out, host);
  out += ",\n  \"pid\": " + std::to_string(::getpid()) + ",\n  \"reason\": ";
  append_json_quoted(out, reason);
  out += ",\n  \"dumped_ns\": " + std::to_string(wall_ns()) +
         ",\n  \"capacity\": " + std::to_string(_capacity) +
         ",\n  \"next_collective_seq_id\": " + std::to_string(next_collective_seq()) +
         ",\n  \"last_started_collective_seq_id\": " + std::to_string(last_started) +
         ",\n  \"last_completed_collective_seq_id\": " + std::to_string(last_completed) +
         ",\n  \"entries\": [";
  for (std::size_t k = 0; k < all.size(); ++k) {
    const FlightRecord& r = all[k];
    out += k ? ",\n    {" : "\n    {";
    out += "\"record_id\": " + std::to_string(r.record_id) +
           ", \"collective_seq_id\": " + std::to_string(r.collective_seq_id) +
           ", \"p2p_seq_id\": " + std::to_string(r.p2p_seq_id) + ", \"profiling_name\": ";
    append_json_quoted(out, r.profiling_name);
    out += ", \"op\": ";
    append_json_quoted(out, r.op);
    out += ", \"input_dtypes\": [\"" + std::string(to_string(r.dtype)) + "\"]";
    out += ", \"input_sizes\": [[" + std::to_string(r.count) + "]], \"algorithm\": ";
    append_json_quoted(out, r.algorithm);
    out += ", \"peer\": " + std::to_string(r.peer) +
           ", \"is_p2p\": " + (r.p2p_seq_id >= 0 ? "true" : "false") + ", \"state\": \"" +
           std::string(to_string(r.state)) +
           "\", \"time_created_ns\": " + std::to_string(r.time_created_ns) +
           ", \"time_discovered_started_ns\": " + std::to_string(r.time_discovered_started_ns) +
           ", \"time_discovered_completed_ns\": " + std::to_string(r.time_discovered_completed_ns) +
           ", \"repeats\": " + std::to_string(r.repeats) + "}";
  }
  out += all.empty() ? "]\n}\n" : "\n  ]\n}\n";
  return out;
}

std::string FlightRecorder::dump(int rank, int world, std::string_view backend,
                                 std::string_view reason, std::string directory) const noexcept {
  try {
    if (directory.empty()) directory = default_directory();
    if (directory.empty()) return {};
    std::filesystem::create_directories(directory);
    const std::string path =
        directory + "/loom_flight_recorder_rank" + std::to_string(rank) + ".json";
    const std::string temporary = path + ".tmp" + std::to_string(::getpid());
    {
      std::ofstream file(temporary, std::ios::trunc);
      file << to_json(rank, world, backend, reason);
      if (!file) return {};
    }
    std::filesystem::rename(temporary, path);
    return path;
  } catch (...) {
    return {};
  }
}

}  // namespace loom
