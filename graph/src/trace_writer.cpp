// Chrome trace-event JSON (Perfetto, chrome://tracing) of one executor run.
#include "trace_writer.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <ostream>

#include "intervals.hpp"
#include "json_quoted.hpp"

namespace loom::detail {
namespace {

// Newline and tab in a name show as \n and \t.
std::string json_string(const std::string& text) {
  return json_quoted(text, JsonControl::short_newline_tab);
}

std::string micros(std::int64_t ns) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", ns / 1000.0);
  return text;
}

constexpr int communicator_lane_base = 1000;
constexpr int outside_lane_base = 2000;
constexpr int exposed_lane = 3000;

// The union of the compute spans, as sorted disjoint intervals.
std::vector<Interval> compute_union(const std::vector<TraceSpan>& spans) {
  std::vector<Interval> busy;
  for (const TraceSpan& s : spans)
    if (s.worker >= 0 || s.outside) busy.emplace_back(s.start_ns, s.end_ns);
  return merged(std::move(busy));
}

}  // namespace

void write_chrome_trace(std::ostream& out, const TraceClock& clock,
                        const std::vector<TraceSpan>& spans) {
  const int rank = clock.rank;
  // Communication spans of one communicator may overlap without nesting: give each the first
  // sub-lane free at its start (greedy interval colouring, by start time).
  std::vector<std::size_t> by_start(spans.size());
  for (std::size_t i = 0; i < spans.size(); ++i) by_start[i] = i;
  std::sort(by_start.begin(), by_start.end(),
            [&](std::size_t a, std::size_t b) { return spans[a].start_ns < spans[b].start_ns; });
  std::map<std::string, int> communicator_ids;
  std::map<int, std::vector<std::int64_t>> lane_ends;  // communicator id -> end of each sub-lane
  std::vector<int> tid(spans.size());
  std::map<int, std::string> lane_names;
  for (std::size_t i : by_start) {
    const TraceSpan& s = spans[i];
    if (s.worker >= 0) {
      tid[i] = s.worker;
      lane_names[s.worker] = "worker " + std::to_string(s.worker);
      continue;
    }
    const int id =
        s.outside ? -1
                  : communicator_ids.emplace(s.communicator, communicator_ids.size()).first->second;
    auto& ends = lane_ends[id];
    std::size_t sub = 0;
    while (sub < ends.size() && ends[sub] > s.start_ns) ++sub;
    if (sub == ends.size()) ends.push_back(0);
    ends[sub] = std::max(s.end_ns, s.start_ns + 1);
    if (s.outside) {
      tid[i] = outside_lane_base + static_cast<int>(sub);
      lane_names[tid[i]] = "outside" + (sub == 0 ? std::string() : " #" + std::to_string(sub));
      continue;
    }
    tid[i] = communicator_lane_base + 100 * id + static_cast<int>(sub);
    lane_names[tid[i]] = "comm " + s.communicator + (sub == 0 ? "" : " #" + std::to_string(sub));
  }

  out << "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"loom_rank\":" << rank
      << ",\"loom_world\":" << clock.world << ",\"loom_run_start_ns\":" << clock.run_start_ns
      << ",\"loom_clock_offset_ns\":" << clock.clock_offset_ns << "},\"traceEvents\":[\n";
  out << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << rank
      << ",\"tid\":0,\"args\":{\"name\":\"loom rank " << rank << "\"}}";
  for (const auto& [lane, name] : lane_names) {
    out << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << rank << ",\"tid\":" << lane
        << ",\"args\":{\"name\":" << json_string(name) << "}}";
    out << ",\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":" << rank << ",\"tid\":" << lane
        << ",\"args\":{\"sort_index\":" << lane << "}}";
  }
  const std::vector<Interval> busy = compute_union(spans);
  bool any_exposed = false;
  std::vector<std::pair<std::int64_t, std::int64_t>> bytes_changes;  // (time, +/- bytes)
  for (std::size_t i : by_start) {
    const TraceSpan& s = spans[i];
    std::int64_t exposed_ns = 0;
    const bool communication = s.worker < 0 && !s.outside;
    if (communication) {
      for (const Interval& gap : uncovered(s.start_ns, s.end_ns, busy)) {
        exposed_ns += gap.second - gap.first;
        any_exposed = true;
        out << ",\n{\"name\":" << json_string("exposed (" + s.name + ")")
            << ",\"cat\":\"exposed\",\"ph\":\"X\",\"pid\":" << rank << ",\"tid\":" << exposed_lane
            << ",\"ts\":" << micros(gap.first) << ",\"dur\":" << micros(gap.second - gap.first)
            << ",\"args\":{\"node\":" << json_string(s.name) << "}}";
      }
      bytes_changes.emplace_back(s.start_ns, static_cast<std::int64_t>(s.bytes));
      bytes_changes.emplace_back(s.end_ns, -static_cast<std::int64_t>(s.bytes));
    }
    out << ",\n{\"name\":" << json_string(s.name) << ",\"cat\":" << json_string(s.category)
        << ",\"ph\":\"X\",\"pid\":" << rank << ",\"tid\":" << tid[i]
        << ",\"ts\":" << micros(s.start_ns)
        << ",\"dur\":" << micros(std::max<std::int64_t>(s.end_ns - s.start_ns, 0))
        << ",\"args\":{\"op\":" << json_string(s.describe) << ",\"bytes\":" << s.bytes;
    if (!s.algorithm.empty()) out << ",\"algorithm\":" << json_string(s.algorithm);
    if (s.issue_index >= 0) out << ",\"issue_index\":" << s.issue_index;
    if (communication && s.ready_ns >= 0)
      out << ",\"waited_for_turn_us\":"
          << micros(std::max<std::int64_t>(s.start_ns - s.ready_ns, 0));
    if (communication) out << ",\"exposed_us\":" << micros(exposed_ns);
    out << "}}";
  }
  if (any_exposed)
    out << ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << rank
        << ",\"tid\":" << exposed_lane << ",\"args\":{\"name\":\"exposed communication\"}}";
  // Ends before starts at the same time, so the counter never counts one operation twice.
  std::sort(bytes_changes.begin(), bytes_changes.end());
  std::int64_t in_flight = 0;
  for (std::size_t k = 0; k < bytes_changes.size(); ++k) {
    in_flight += bytes_changes[k].second;
    if (k + 1 < bytes_changes.size() && bytes_changes[k + 1].first == bytes_changes[k].first)
      continue;  // one sample per time stamp
    out << ",\n{\"name\":\"bytes in flight\",\"ph\":\"C\",\"pid\":" << rank
        << ",\"ts\":" << micros(bytes_changes[k].first) << ",\"args\":{\"bytes\":" << in_flight
        << "}}";
  }
  out << "\n]}\n";
}

}  // namespace loom::detail
