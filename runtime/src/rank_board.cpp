// RankBoard: publishing and reading the ranks' progress and failures; the missing-rank text.
#include "loom/rank_board.hpp"

#include <algorithm>
#include <cstring>

#include "loom/flight_recorder.hpp"

namespace loom {

RankBoard::RankBoard(int rank, std::vector<RankSlot*> slots)
    : _rank(rank),
      _slots(std::move(slots)),
      _mine(rank >= 0 && rank < static_cast<int>(_slots.size()) ? _slots[rank] : nullptr),
      _seen(_slots.size(), 0) {
  for (std::size_t r = 0; r < _slots.size(); ++r)
    if (_slots[r]) _seen[r] = _slots[r]->failures.load(std::memory_order_acquire);
}

void RankBoard::completed(std::int64_t seq) noexcept {
  if (!_mine) return;
  // Completions may come out of issue order (several collectives in flight): keep the highest.
  const auto value = static_cast<std::uint64_t>(seq + 1);
  if (_mine->completed.load(std::memory_order_relaxed) < value)
    _mine->completed.store(value, std::memory_order_release);
}

void RankBoard::publish_failure(std::string_view message, std::int64_t next_seq, bool drained,
                                bool consequence) noexcept {
  if (!_mine) return;
  char text[sizeof _mine->text]{};
  std::memcpy(text, message.data(), std::min(message.size(), sizeof text - 1));
  for (std::size_t w = 0; w < std::size(_mine->text); ++w) {
    std::uint64_t word = 0;
    std::memcpy(&word, text + 8 * w, 8);
    _mine->text[w].store(word, std::memory_order_relaxed);
  }
  _mine->failed_seq.store(next_seq, std::memory_order_relaxed);
  _mine->drained.store((drained ? 1u : 0u) | (consequence ? 2u : 0u), std::memory_order_relaxed);
  // Last, with release: a reader that sees the new count sees the fields above.
  _mine->failures.fetch_add(1, std::memory_order_release);
}

RankBoard::Peer RankBoard::read(int r) const {
  Peer p;
  if (r < 0 || r >= world_size() || !_slots[r]) return p;
  const RankSlot& s = *_slots[r];
  p.visible = true;
  p.failures = s.failures.load(std::memory_order_acquire);
  p.last_started = static_cast<std::int64_t>(s.started.load(std::memory_order_acquire)) - 1;
  p.last_completed = static_cast<std::int64_t>(s.completed.load(std::memory_order_acquire)) - 1;
  if (p.failures != 0) {
    p.failed_seq = s.failed_seq.load(std::memory_order_relaxed);
    const std::uint64_t flags = s.drained.load(std::memory_order_relaxed);
    p.drained = (flags & 1u) != 0;
    p.consequence = (flags & 2u) != 0;
    char text[sizeof s.text + 1]{};
    for (std::size_t w = 0; w < std::size(s.text); ++w) {
      const std::uint64_t word = s.text[w].load(std::memory_order_relaxed);
      std::memcpy(text + 8 * w, &word, 8);
    }
    p.failure = text;
  }
  return p;
}

std::optional<RankBoard::Failure> RankBoard::take_stale_run_failure(std::int64_t first_seq,
                                                                    std::int64_t end_seq) {
  std::lock_guard lock(_mutex);
  std::optional<Failure> found;
  for (int r = 0; r < world_size(); ++r) {
    if (r == _rank || !_slots[r]) continue;
    const Peer p = read(r);
    if (p.failures == _seen[r]) continue;
    if (p.failed_seq >= end_seq) continue;  // a later run's: kept for it
    _seen[r] = p.failures;
    if (!found && p.drained && p.failed_seq >= first_seq)
      found = Failure{r, p.failed_seq, p.failure};
  }
  return found;
}

void RankBoard::set_remote(std::vector<std::string> host_of_rank, RemoteQuery ask) {
  _hosts = std::move(host_of_rank);
  _ask = std::move(ask);
}

std::string RankBoard::who_is_missing(std::int64_t seq, const FlightRecorder& recorder,
                                      int* failed_rank) const {
  if (failed_rank) *failed_rank = -1;
  std::string missing, unknown, late;
  std::vector<std::optional<Peer>> remote;  // what the other hosts said, asked once
  bool asked = false;
  // The ranks of each host that did not answer, in order of first appearance.
  std::vector<std::pair<std::string, std::string>> silent;
  auto host = [&](int r) {
    return r < static_cast<int>(_hosts.size()) ? _hosts[r] : std::string();
  };
  auto named = [&](std::int64_t s) {
    if (s < 0) return std::string("nothing yet");
    std::string text = "#" + std::to_string(s);
    const std::string name = recorder.name_of_collective(s);
    if (!name.empty()) text += " '" + name + "'";
    return text;
  };
  for (int r = 0; r < world_size(); ++r) {
    if (r == _rank) continue;
    Peer p = read(r);
    if (!p.visible && _ask) {
      if (!asked) {
        remote = _ask(seq);
        asked = true;
      }
      if (r < static_cast<int>(remote.size()) && remote[r]) {
        p = *remote[r];
        p.visible = true;
      } else {
        auto it = std::find_if(silent.begin(), silent.end(),
                               [&](const auto& s) { return s.first == host(r); });
        if (it == silent.end()) it = silent.insert(silent.end(), {host(r), ""});
        it->second += (it->second.empty() ? "" : ", ") + std::to_string(r);
        continue;
      }
    }
    if (!p.visible) {
      unknown += (unknown.empty() ? "" : ", ") + std::to_string(r);
      continue;
    }
    if (p.last_started >= seq) {
      if (p.last_completed < seq)
        late += (late.empty() ? "" : ", ") + std::to_string(r) +
                (host(r).empty() || host(r) == host(_rank) ? "" : " on host " + host(r));
      continue;
    }
    if (!missing.empty()) missing += "; ";
    missing += "rank " + std::to_string(r) +
               (host(r).empty() || host(r) == host(_rank) ? "" : " on host " + host(r)) +
               " did not arrive (last started " + named(p.last_started) + ")";
    if (p.failures != 0 && p.failed_seq <= seq) {
      if (p.consequence) {
        missing += ": it gave up waiting too";
      } else {
        missing += ": it failed: " + p.failure;
        if (failed_rank && *failed_rank < 0) *failed_rank = r;
      }
    }
  }
  std::string text = missing;
  for (const auto& [name, ranks] : silent) {
    if (!text.empty()) text += "; ";
    const bool several = ranks.find(',') != std::string::npos;
    const std::string where = name.empty() ? "another host" : "host " + name;
    text += (several ? "ranks " : "rank ") + ranks + " on " + where + (several ? " are" : " is") +
            " missing: no rank of " + where + " answered (the node is down, stopped or cut off)";
  }
  if (text.empty())
    text = late.empty() ? std::string("every rank this process can see started it")
                        : (late.find(',') == std::string::npos
                               ? "rank " + late + " started it but has not completed it"
                               : "ranks " + late + " started it but have not completed it") +
                              " (stopped or stuck inside it)";
  if (!unknown.empty())
    text += "; rank " + unknown +
            " on another host: not visible from here (their own errors or flight records say "
            "where they are)";
  return text;
}

}  // namespace loom
