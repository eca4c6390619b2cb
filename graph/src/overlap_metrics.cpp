// OverlapMetrics: unions of compute and communication intervals of one rank's timeline.
#include "loom/overlap_metrics.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <ostream>
#include <thread>
#include <utility>
#include <vector>

#include "intervals.hpp"
#include "loom/environment.hpp"

namespace loom {

namespace {

using detail::Interval;

std::int64_t union_length(std::vector<Interval> intervals) {
  return detail::length(detail::merged(std::move(intervals)));
}

}  // namespace

OverlapMetrics measure_overlap(std::span<const NodeTiming> timings) {
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

namespace {

bool communicates(const NodeTiming& t) {
  return t.kind == NodeKind::collective || t.kind == NodeKind::send || t.kind == NodeKind::recv;
}

bool ran(const NodeTiming& t) {
  return !(t.start_ns == 0 && t.end_ns == 0) && t.end_ns >= t.start_ns;
}

// Elementary intervals between the times at which anything starts or ends: on each, the set of
// running nodes is constant.
struct Sweep {
  std::vector<std::int64_t> cuts;
  std::vector<int> computing;  // per elementary interval: compute nodes running

  explicit Sweep(std::span<const NodeTiming> timings) {
    for (const NodeTiming& t : timings) {
      if (!ran(t)) continue;
      cuts.push_back(t.start_ns);
      cuts.push_back(t.end_ns);
      if (communicates(t) && t.ready_ns >= 0) cuts.push_back(t.ready_ns);
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    computing.assign(cuts.empty() ? 0 : cuts.size() - 1, 0);
    for (const NodeTiming& t : timings)
      if (ran(t) && !communicates(t)) add(t.start_ns, t.end_ns, computing);
  }
  std::size_t at(std::int64_t time) const {
    return static_cast<std::size_t>(std::lower_bound(cuts.begin(), cuts.end(), time) -
                                    cuts.begin());
  }
  void add(std::int64_t start, std::int64_t end, std::vector<int>& count) const {
    for (std::size_t k = at(start); k < at(end); ++k) ++count[k];
  }
  double ms(std::size_t k) const { return (cuts[k + 1] - cuts[k]) / 1e6; }
};

}  // namespace

std::vector<CommunicationReport> explain_communication(std::span<const NodeTiming> timings,
                                                       unsigned cores) {
  if (cores == 0) cores = std::max(1u, std::thread::hardware_concurrency());
  const Sweep sweep(timings);
  std::vector<const NodeTiming*> comm;
  for (const NodeTiming& t : timings)
    if (ran(t) && communicates(t)) comm.push_back(&t);
  std::sort(comm.begin(), comm.end(), [](const NodeTiming* a, const NodeTiming* b) {
    return a->issue_index != b->issue_index ? a->issue_index < b->issue_index
                                            : a->start_ns < b->start_ns;
  });
  std::vector<CommunicationReport> out;
  for (const NodeTiming* t : comm) {
    CommunicationReport r;
    r.name = t->name;
    r.issue_index = t->issue_index;
    const std::int64_t ready = t->ready_ns >= 0 ? std::min(t->ready_ns, t->start_ns) : t->start_ns;
    r.ready_ms = ready / 1e6;
    r.issued_ms = t->start_ns / 1e6;
    r.completed_ms = t->end_ns / 1e6;
    // Per elementary interval of its flight: who else was in flight.
    std::map<std::string, double> shared;
    double flight_ms = 0;
    std::vector<std::size_t> exposed_in_flight;
    for (std::size_t k = sweep.at(ready); k < sweep.at(t->end_ns); ++k) {
      const std::int64_t mid = sweep.cuts[k];
      const bool in_flight = mid >= t->start_ns;
      const bool computing = sweep.computing[k] > 0;
      if (in_flight) {
        flight_ms += sweep.ms(k);
        if (sweep.computing[k] >= static_cast<int>(cores)) r.cores_busy_ms += sweep.ms(k);
      }
      std::string other;
      if (in_flight)
        for (const NodeTiming* o : comm)
          if (o != t && o->start_ns <= mid && mid < o->end_ns) {
            shared[o->name] += sweep.ms(k);
            if (other.empty()) other = o->name;
          }
      if (computing) continue;
      r.exposed_ms += sweep.ms(k);
      if (!in_flight)
        r.waiting_for_order_ms += sweep.ms(k);
      else if (!other.empty())
        r.wire_busy_ms += sweep.ms(k);
      else
        exposed_in_flight.push_back(k);
    }
    const bool starved = flight_ms > 0 && r.cores_busy_ms > 0.5 * flight_ms;
    for (std::size_t k : exposed_in_flight)
      (starved ? r.starved_ms : r.own_transfer_ms) += sweep.ms(k);
    for (const auto& [name, ms] : shared)
      if (r.busy_with.empty() || ms > shared[r.busy_with]) r.busy_with = name;
    const std::pair<double, std::string> causes[] = {
        {r.waiting_for_order_ms, "waiting for the issue order"},
        {r.wire_busy_ms, "wire busy with " + r.busy_with},
        {r.starved_ms, "transport starved of CPU"},
        {r.own_transfer_ms, "its own transfer"}};
    const auto* largest =
        std::max_element(std::begin(causes), std::end(causes),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
    // Under 1% of its span exposed counts as hidden: timer granularity, not a cause.
    const double span_ms = r.completed_ms - r.ready_ms;
    r.reason = r.exposed_ms <= 0.01 * span_ms ? "hidden" : largest->second;
    out.push_back(std::move(r));
  }
  return out;
}

unsigned cores_per_rank(const Backend& backend) {
  const int on_host = backend.name() == "local" ? backend.world_size()
                                                : environment::launcher_local_size().value_or(1);
  return std::max(1u, std::thread::hardware_concurrency() / static_cast<unsigned>(on_host));
}

void print_communication_report(std::ostream& out, std::span<const CommunicationReport> reports) {
  char line[512];
  std::snprintf(line, sizeof line, "%-24s %5s %8s %8s %8s %8s %8s  %s\n", "communication", "#",
                "ready", "issued", "done", "flight", "exposed",
                "why exposed (ms since the step began)");
  out << line;
  for (const CommunicationReport& r : reports) {
    std::string why = r.reason;
    if (r.reason != "hidden") {
      char detail[160];
      std::snprintf(detail, sizeof detail,
                    " (order %.2f, wire %.2f, starved %.2f, own %.2f; cores busy %.2f of flight)",
                    r.waiting_for_order_ms, r.wire_busy_ms, r.starved_ms, r.own_transfer_ms,
                    r.cores_busy_ms);
      why += detail;
    }
    std::snprintf(line, sizeof line, "%-24s %5lld %8.2f %8.2f %8.2f %8.2f %8.2f  %s\n",
                  r.name.c_str(), static_cast<long long>(r.issue_index), r.ready_ms, r.issued_ms,
                  r.completed_ms, r.completed_ms - r.issued_ms, r.exposed_ms, why.c_str());
    out << line;
  }
}

}  // namespace loom
