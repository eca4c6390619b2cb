// CommunicationProfiler: storage, statistics and the text report.
#include "loom/communication_profiler.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <ostream>

namespace loom {

struct CommunicationProfiler::State {
  mutable std::mutex mutex;
  std::vector<OperationRecord> records;
};

CommunicationProfiler::CommunicationProfiler(bool enabled)
    : _enabled(enabled), _state(std::make_unique<State>()) {}

CommunicationProfiler::~CommunicationProfiler() = default;

std::int64_t CommunicationProfiler::now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void CommunicationProfiler::append(OperationRecord record) {
  std::lock_guard lock(_state->mutex);
  _state->records.push_back(std::move(record));
}

std::vector<OperationRecord> CommunicationProfiler::records() const {
  std::lock_guard lock(_state->mutex);
  return _state->records;
}

void CommunicationProfiler::clear() {
  std::lock_guard lock(_state->mutex);
  _state->records.clear();
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
  const auto all = records();
  std::vector<OperationStats> out;
  std::vector<std::vector<double>> latencies;
  for (const OperationRecord& r : all) {
    auto it = std::find_if(out.begin(), out.end(), [&](const OperationStats& s) {
      return s.operation == r.operation && s.algorithm == r.algorithm;
    });
    if (it == out.end()) {
      out.push_back({r.operation, r.algorithm});
      latencies.emplace_back();
      it = out.end() - 1;
      it->min_gbps = r.bandwidth_gbps();
      it->max_gbps = r.bandwidth_gbps();
    }
    OperationStats& s = *it;
    ++s.count;
    s.total_bytes += r.bytes;
    s.total_s += r.seconds();
    s.min_gbps = std::min(s.min_gbps, r.bandwidth_gbps());
    s.max_gbps = std::max(s.max_gbps, r.bandwidth_gbps());
    latencies[static_cast<std::size_t>(it - out.begin())].push_back(r.seconds());
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
