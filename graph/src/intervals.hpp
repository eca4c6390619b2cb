// Intervals of a timeline (ns): unions and the gaps they leave, shared by the overlap metrics,
// the trace's exposed lane and the DOT's exposed times.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace loom::detail {

using Interval = std::pair<std::int64_t, std::int64_t>;  ///< [start, end)

/// @brief The union of `intervals` as sorted, disjoint intervals.
inline std::vector<Interval> merged(std::vector<Interval> intervals) {
  std::sort(intervals.begin(), intervals.end());
  std::vector<Interval> out;
  for (const Interval& i : intervals) {
    if (!out.empty() && i.first <= out.back().second)
      out.back().second = std::max(out.back().second, i.second);
    else
      out.push_back(i);
  }
  return out;
}

/// @brief The parts of [start, end) that no interval of `busy` (sorted, disjoint) covers.
inline std::vector<Interval> uncovered(std::int64_t start, std::int64_t end,
                                       const std::vector<Interval>& busy) {
  std::vector<Interval> out;
  std::int64_t at = start;
  auto it =
      std::lower_bound(busy.begin(), busy.end(), Interval{start, start},
                       [](const Interval& a, const Interval& b) { return a.second <= b.first; });
  for (; it != busy.end() && it->first < end && at < end; ++it) {
    if (it->first > at) out.emplace_back(at, it->first);
    at = std::max(at, it->second);
  }
  if (at < end) out.emplace_back(at, end);
  return out;
}

/// @brief Total length of `intervals` (sorted, disjoint).
inline std::int64_t length(const std::vector<Interval>& intervals) {
  std::int64_t total = 0;
  for (const Interval& i : intervals) total += i.second - i.first;
  return total;
}

}  // namespace loom::detail
