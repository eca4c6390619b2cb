// RankBoard: publishing and reading the ranks' progress and failures; the missing-rank text.
#include "loom/rank_board.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "loom/flight_recorder.hpp"
#include "steady_ns.hpp"

namespace loom {

RankBoard::RankBoard(int rank, std::vector<RankSlot*> slots)
    : _rank(rank),
      _slots(std::move(slots)),
      _mine(rank >= 0 && rank < static_cast<int>(_slots.size()) ? _slots[rank] : nullptr),
      _seen(_slots.size(), 0) {
  for (std::size_t r = 0; r < _slots.size(); ++r)
    if (_slots[r]) _seen[r] = _slots[r]->failures.load(std::memory_order_acquire);
}

void RankBoard::beat(RankSlot& slot) noexcept {
  // max(1, ...): 0 means "never beats"
  slot.alive_ns.store(std::max<std::int64_t>(1, steady_ns()), std::memory_order_relaxed);
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
  if (const std::int64_t alive = s.alive_ns.load(std::memory_order_relaxed); alive != 0)
    p.quiet_s = std::max(0.0, static_cast<double>(steady_ns() - alive) * 1e-9);
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
  std::string missing, unknown;
  std::vector<int> silent_late, live_late;  // started it, not completed: heartbeat stale / not
  double quiet_for = -1;  // the least quiet of silent_late: none of them beat for this long
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
      if (p.last_completed < seq) {
        if (p.quiet_s >= silent_after_s) {
          silent_late.push_back(r);
          quiet_for = quiet_for < 0 ? p.quiet_s : std::min(quiet_for, p.quiet_s);
        } else {
          live_late.push_back(r);
        }
      }
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
  // "rank 1, ranks 2, 3 on host b": the ranks grouped by host, in order of first appearance.
  auto by_host = [&](const std::vector<int>& ranks) {
    std::vector<std::pair<std::string, std::vector<int>>> groups;
    for (int r : ranks) {
      const std::string h = host(r).empty() || host(r) == host(_rank) ? "" : host(r);
      auto it =
          std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == h; });
      if (it == groups.end()) it = groups.insert(groups.end(), {h, {}});
      it->second.push_back(r);
    }
    std::string out;
    for (const auto& [h, members] : groups) {
      if (!out.empty()) out += ", ";
      out += members.size() > 1 ? "ranks " : "rank ";
      for (std::size_t k = 0; k < members.size(); ++k)
        out += (k ? ", " : "") + std::to_string(members[k]);
      if (!h.empty()) out += " on host " + h;
    }
    return out;
  };
  if (text.empty()) {
    if (!silent_late.empty()) {
      char quiet[32];
      std::snprintf(quiet, sizeof quiet, "%.1f", quiet_for);
      const bool one = silent_late.size() == 1;
      text = by_host(silent_late) + " started it but " +
             (one ? "its process has" : "their processes have") + " shown no sign of life for " +
             quiet + " s (stopped, frozen or dead)";
      if (!live_late.empty())
        text += "; " + by_host(live_late) + " started it and " +
                (live_late.size() == 1 ? "is" : "are") + " alive, waiting inside it";
    } else if (!live_late.empty()) {
      text = by_host(live_late) +
             (live_late.size() == 1 ? " started it but has not completed it"
                                    : " started it but have not completed it") +
             " (stopped or stuck inside it)";
    } else {
      text = "every rank this process can see started it";
    }
  }
  if (!unknown.empty())
    text += "; rank " + unknown +
            " on another host: not visible from here (their own errors or flight records say "
            "where they are)";
  return text;
}

}  // namespace loom
