// CommunicationProfiler: storage, statistics and the text report.
#include "loom/communication_profiler.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <mutex>
#include <ostream>

#include "steady_ns.hpp"

namespace loom {

struct CommunicationProfiler::State {
  // Per (operation, algorithm): totals over every record, latencies of the last `window`.
  struct Aggregate {
    OperationStats stats;
    std::vector<double> latencies;  // a ring of at most `window`
    std::size_t next = 0;
  };
  explicit State(std::size_t w) : window(std::max<std::size_t>(w, 1)) {}
  std::size_t window;
  mutable std::mutex mutex;
  std::deque<OperationRecord> recent;  // at most `window`
  std::vector<Aggregate> aggregates;
  std::size_t total = 0;
};

CommunicationProfiler::CommunicationProfiler(bool enabled, std::size_t window)
    : _enabled(enabled), _state(std::make_unique<State>(window)) {}

CommunicationProfiler::~CommunicationProfiler() = default;

std::int64_t CommunicationProfiler::now_ns() noexcept {
  return steady_ns();
}

void CommunicationProfiler::append(OperationRecord record) {
  std::lock_guard lock(_state->mutex);
  ++_state->total;
  auto& aggregates = _state->aggregates;
  auto it = std::find_if(aggregates.begin(), aggregates.end(), [&](const State::Aggregate& a) {
    return a.stats.operation == record.operation && a.stats.algorithm == record.algorithm;
  });
  if (it == aggregates.end()) {
    aggregates.push_back({OperationStats{record.operation, record.algorithm}, {}, 0});
    it = aggregates.end() - 1;
    it->stats.min_gbps = record.bandwidth_gbps();
    it->stats.max_gbps = record.bandwidth_gbps();
  }
  OperationStats& s = it->stats;
  ++s.count;
  s.total_bytes += record.bytes;
  s.total_s += record.seconds();
  s.min_gbps = std::min(s.min_gbps, record.bandwidth_gbps());
  s.max_gbps = std::max(s.max_gbps, record.bandwidth_gbps());
  if (it->latencies.size() < _state->window) {
    it->latencies.push_back(record.seconds());
  } else {
    it->latencies[it->next] = record.seconds();
    it->next = (it->next + 1) % _state->window;
  }
  if (_state->recent.size() == _state->window) _state->recent.pop_front();
  _state->recent.push_back(std::move(record));
}

std::vector<OperationRecord> CommunicationProfiler::records() const {
  std::lock_guard lock(_state->mutex);
  return {_state->recent.begin(), _state->recent.end()};
}

std::size_t CommunicationProfiler::total_recorded() const {
  std::lock_guard lock(_state->mutex);
  return _state->total;
}

void CommunicationProfiler::clear() {
  std::lock_guard lock(_state->mutex);
  _state->recent.clear();
  _state->aggregates.clear();
  _state->total = 0;
}

namespace {
// Nearest-rank percentile of sorted values.
double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::clamp<std::size_t>(rank, 1, sorted.size()) - 1];
}
}  // namespace

std::vector<OperationStats> CommunicationProfiler::stats() const {
  std::vector<OperationStats> out;
  std::vector<std::vector<double>> latencies;
  {
    std::lock_guard lock(_state->mutex);
    for (const auto& a : _state->aggregates) {
      out.push_back(a.stats);
      latencies.push_back(a.latencies);
    }
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    OperationStats& s = out[i];
    s.average_gbps = s.total_s > 0 ? static_cast<double>(s.total_bytes) / s.total_s * 1e-9 : 0;
    std::sort(latencies[i].begin(), latencies[i].end());
    s.p50_s = percentile(latencies[i], 0.50);
    s.p95_s = percentile(latencies[i], 0.95);
    s.p99_s = percentile(latencies[i], 0.99);
  }
  return out;
}

void CommunicationProfiler::write_report(std::ostream& out) const {
  char line[256];
  std::snprintf(line, sizeof line, "%-16s %-18s %8s %14s %12s %9s %9s %9s %10s %10s %10s\n",
                "operation", "algorithm", "count", "bytes", "time(ms)", "avg GB/s", "min GB/s",
                "max GB/s", "p50(us)", "p95(us)", "p99(us)");
  out << line;
  for (const OperationStats& s : stats()) {
    std::snprintf(
        line, sizeof line, "%-16s %-18s %8zu %14zu %12.3f %9.3f %9.3f %9.3f %10.1f %10.1f %10.1f\n",
        s.operation.c_str(), s.algorithm.c_str(), s.count, s.total_bytes, s.total_s * 1e3,
        s.average_gbps, s.min_gbps, s.max_gbps, s.p50_s * 1e6, s.p95_s * 1e6, s.p99_s * 1e6);
    out << line;
  }
}

}  // namespace loom
