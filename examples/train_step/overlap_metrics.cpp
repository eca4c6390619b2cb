// OverlapMetrics: unions of compute and communication intervals of one rank's timeline.
#include "overlap_metrics.hpp"

#include <algorithm>
#include <cstdint>
#include <utility>

namespace loom::examples {

namespace {

using Interval = std::pair<std::int64_t, std::int64_t>;

std::int64_t union_length(std::vector<Interval> intervals) {
  std::sort(intervals.begin(), intervals.end());
  std::int64_t total = 0, start = 0, end = 0;
  bool open = false;
  for (const auto& [s, e] : intervals) {
    if (open && s <= end) {
      end = std::max(end, e);
      continue;
    }
    if (open) total += end - start;
    start = s;
    end = e;
    open = true;
  }
  if (open) total += end - start;
  return total;
}

}  // namespace

OverlapMetrics measure_overlap(const std::vector<NodeTiming>& timings) {
  std::vector<Interval> compute, comm, all;
  for (const NodeTiming& t : timings) {
    if (t.start_ns == 0 && t.end_ns == 0) continue;
    if (t.end_ns <= t.start_ns) continue;
    const bool communication =
        t.kind == NodeKind::collective || t.kind == NodeKind::send || t.kind == NodeKind::recv;
    (communication ? comm : compute).emplace_back(t.start_ns, t.end_ns);
    all.emplace_back(t.start_ns, t.end_ns);
  }
  const std::int64_t c = union_length(compute), m = union_length(comm), u = union_length(all);
  const std::int64_t hidden = c + m - u;
  OverlapMetrics out;
  out.compute_ms = c / 1e6;
  out.comm_ms = m / 1e6;
  out.busy_ms = u / 1e6;
  out.hidden_ms = hidden / 1e6;
  out.exposed_comm_ms = (m - hidden) / 1e6;
  out.overlap_efficiency = m > 0 ? static_cast<double>(hidden) / static_cast<double>(m) : 0.0;
  return out;
}

}  // namespace loom::examples
