// StepSimulator: a discrete-event replay of one step: workers by priority, a wire shared
// equally by the collectives in flight, issue in a fixed order.
#include "loom/step_simulator.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <string>

#include "loom/error.hpp"

namespace loom {

namespace {

// Length of the union of intervals.
double union_length(std::vector<std::pair<double, double>> spans) {
  std::sort(spans.begin(), spans.end());
  double total = 0, start = 0, end = -1;
  for (const auto& [s, e] : spans) {
    if (e <= s) continue;
    if (s > end) {
      if (end > start) total += end - start;
      start = s;
      end = e;
    } else {
      end = std::max(end, e);
    }
  }
  if (end > start) total += end - start;
  return total;
}

std::vector<std::vector<std::size_t>> successors_of(const StepProfile& p) {
  std::vector<std::vector<std::size_t>> succ(p.nodes.size());
  for (const auto& [from, to] : p.edges) succ[from].push_back(to);
  return succ;
}

}  // namespace

std::vector<std::size_t> default_issue_order(const StepProfile& profile) {
  std::vector<std::size_t> comm;
  for (std::size_t id = 0; id < profile.nodes.size(); ++id)
    if (communicates(profile.nodes[id].kind)) comm.push_back(id);
  const bool indexed = !comm.empty() && std::all_of(comm.begin(), comm.end(), [&](std::size_t id) {
    return profile.nodes[id].issue_index >= 0;
  });
  if (indexed) {
    std::stable_sort(comm.begin(), comm.end(), [&](std::size_t a, std::size_t b) {
      return profile.nodes[a].issue_index < profile.nodes[b].issue_index;
    });
    return comm;
  }
  // Kahn's algorithm taking the highest priority, then the lowest id, among ready nodes.
  const auto succ = successors_of(profile);
  std::vector<int> indegree(profile.nodes.size(), 0);
  for (const auto& e : profile.edges) ++indegree[e.second];
  auto later = [&](std::size_t a, std::size_t b) {
    const int pa = profile.nodes[a].priority, pb = profile.nodes[b].priority;
    return pa != pb ? pa < pb : a > b;
  };
  std::priority_queue<std::size_t, std::vector<std::size_t>, decltype(later)> ready(later);
  for (std::size_t id = 0; id < indegree.size(); ++id)
    if (indegree[id] == 0) ready.push(id);
  std::vector<std::size_t> order;
  while (!ready.empty()) {
    const std::size_t id = ready.top();
    ready.pop();
    if (communicates(profile.nodes[id].kind)) order.push_back(id);
    for (std::size_t s : succ[id])
      if (--indegree[s] == 0) ready.push(s);
  }
  return order;
}

Prediction simulate(const StepProfile& profile, const NetworkModel& network,
                    const SimulationOptions& options) {
  const std::size_t n = profile.nodes.size();
  if (options.workers < 1 || options.ranks < 1)
    throw Error(ErrorCode::invalid_argument, "simulate: workers and ranks must be >= 1");
  const auto succ = successors_of(profile);
  std::vector<int> indegree(n, 0);
  for (const auto& e : profile.edges) ++indegree[e.second];

  const std::vector<std::size_t> order =
      options.issue_order.empty() ? default_issue_order(profile) : options.issue_order;
  std::vector<char> listed(n, 0);
  for (std::size_t i = 0; i < order.size(); ++i) {
    const std::size_t id = order[i];
    const std::string entry = "simulate: issue order entry " + std::to_string(i) + " (node ";
    if (id >= n)
      throw Error(ErrorCode::invalid_argument, entry + std::to_string(id) +
                                                   ") is out of range: the step has " +
                                                   std::to_string(n) + " nodes");
    if (!communicates(profile.nodes[id].kind))
      throw Error(ErrorCode::invalid_argument,
                  entry + "'" + profile.nodes[id].name + "') is not a communication node");
    if (listed[id])
      throw Error(ErrorCode::invalid_argument,
                  entry + "'" + profile.nodes[id].name + "') repeats an earlier entry");
    listed[id] = 1;
  }
  for (std::size_t id = 0; id < n; ++id)
    if (communicates(profile.nodes[id].kind) && !listed[id])
      throw Error(ErrorCode::invalid_argument,
                  "simulate: the issue order lacks '" + profile.nodes[id].name + "'");

  Prediction out;
  out.nodes.resize(n);
  // Each communication node's time alone on the wire.
  std::vector<double> alone(n, 0);
  for (std::size_t id = 0; id < n; ++id) {
    const ProfiledNode& node = profile.nodes[id];
    if (node.kind == NodeKind::collective) {
      const CollectiveCost c = network.collective(node.op, node.bytes, options.ranks);
      alone[id] = c.seconds;
      out.nodes[id].algorithm = std::string(to_string(c.algorithm));
    } else if (communicates(node.kind)) {
      alone[id] = options.ranks > 1 ? network.point_to_point(node.bytes) : 0;
    } else {
      alone[id] = node.duration_s;
    }
  }

  auto later = [&](std::size_t a, std::size_t b) {
    const int pa = profile.nodes[a].priority, pb = profile.nodes[b].priority;
    return pa != pb ? pa < pb : a > b;
  };
  std::priority_queue<std::size_t, std::vector<std::size_t>, decltype(later)> ready(later);
  std::vector<char> arrived(n, 0);
  std::size_t done = 0, next_issue = 0;
  std::vector<std::pair<std::size_t, double>> running;  // (id, remaining seconds of work)
  std::vector<std::pair<std::size_t, double>> wire;     // (id, remaining alone-seconds)
  int free_workers = options.workers;
  const double cores = options.cores > 0 ? options.cores : options.workers;
  if (options.comm_cpu < 0)
    throw Error(ErrorCode::invalid_argument, "simulate: comm_cpu must be >= 0");
  double now = 0;

  auto release = [&](std::size_t id) {
    ++done;
    out.nodes[id].end_s = now;
    for (std::size_t s : succ[id])
      if (--indegree[s] == 0) {
        if (communicates(profile.nodes[s].kind))
          arrived[s] = 1;
        else
          ready.push(s);
      }
  };
  for (std::size_t id = 0; id < n; ++id)
    if (indegree[id] == 0) {
      if (communicates(profile.nodes[id].kind))
        arrived[id] = 1;
      else
        ready.push(id);
    }

  for (;;) {
    while (free_workers > 0 && !ready.empty()) {
      const std::size_t id = ready.top();
      ready.pop();
      out.nodes[id].start_s = now;
      running.emplace_back(id, alone[id]);
      --free_workers;
    }
    while (next_issue < order.size() && arrived[order[next_issue]] &&
           (options.collectives_in_flight == 0 || wire.size() < options.collectives_in_flight)) {
      const std::size_t id = order[next_issue++];
      out.nodes[id].start_s = now;
      wire.emplace_back(id, alone[id]);
    }
    if (running.empty() && wire.empty()) break;
    // Everything runs at `rate` of its own speed while the CPU is oversubscribed.
    const double demand =
        static_cast<double>(running.size()) + (wire.empty() ? 0.0 : options.comm_cpu);
    const double rate = demand > cores ? cores / demand : 1.0;
    // The next event: a compute node ending, or the collective with the least work left
    // finishing at 1/k of its speed.
    const double k = static_cast<double>(wire.size());
    double step = std::numeric_limits<double>::infinity();
    for (const auto& r : running) step = std::min(step, r.second / rate);
    for (const auto& w : wire) step = std::min(step, w.second * k / rate);
    step = std::max(step, 0.0);
    now += step;
    for (auto& r : running) r.second -= step * rate;
    for (auto& w : wire) w.second -= step * rate / k;
    // Ends within a relative epsilon count as simultaneous (floating point).
    const double eps = 1e-12 * std::max(1.0, now);
    std::vector<std::size_t> finished;
    std::erase_if(running, [&](const auto& r) {
      if (r.second > eps) return false;
      finished.push_back(r.first);
      return true;
    });
    free_workers += static_cast<int>(finished.size());
    std::erase_if(wire, [&](const auto& w) {
      if (w.second > eps) return false;
      finished.push_back(w.first);
      return true;
    });
    std::sort(finished.begin(), finished.end());
    for (std::size_t id : finished) release(id);
  }
  if (done != n) {
    std::string stuck = next_issue < order.size() ? profile.nodes[order[next_issue]].name : "?";
    throw Error(ErrorCode::invalid_argument,
                "simulate: the step cannot complete with this issue order ('" + stuck +
                    "' is next to issue but waits on a node that waits on a later collective)");
  }

  std::vector<std::pair<double, double>> compute, comm, both;
  for (std::size_t id = 0; id < n; ++id) {
    const auto span = std::make_pair(out.nodes[id].start_s, out.nodes[id].end_s);
    (communicates(profile.nodes[id].kind) ? comm : compute).push_back(span);
    both.push_back(span);
  }
  out.step_s = now;
  out.compute_s = union_length(compute);
  out.comm_s = union_length(comm);
  out.hidden_s = out.compute_s + out.comm_s - union_length(both);
  out.exposed_s = out.comm_s - out.hidden_s;

  // Longest path, nodes at their alone times, in a topological order.
  std::vector<int> indeg(n, 0);
  for (const auto& e : profile.edges) ++indeg[e.second];
  std::vector<double> finish(n, 0);
  std::vector<std::size_t> queue;
  for (std::size_t id = 0; id < n; ++id)
    if (indeg[id] == 0) queue.push_back(id);
  std::vector<double> begin(n, 0);
  for (std::size_t q = 0; q < queue.size(); ++q) {
    const std::size_t id = queue[q];
    finish[id] = begin[id] + alone[id];
    out.critical_path_s = std::max(out.critical_path_s, finish[id]);
    for (std::size_t s : succ[id]) {
      begin[s] = std::max(begin[s], finish[id]);
      if (--indeg[s] == 0) queue.push_back(s);
    }
  }
  return out;
}

Schedule best_order(const StepProfile& profile, const NetworkModel& network,
                    const SimulationOptions& start) {
  SimulationOptions options = start;
  if (options.issue_order.empty()) options.issue_order = default_issue_order(profile);
  // A move must beat the best by more than rounding to count.
  auto better = [](double a, double b) { return a < b * (1 - 1e-9); };
  double current = simulate(profile, network, options).step_s;
  bool improved = true;
  for (int round = 0; improved && round < 20; ++round) {
    improved = false;
    const std::size_t m = options.issue_order.size();
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < m; ++j) {
        if (i == j) continue;
        SimulationOptions trial = options;
        auto& o = trial.issue_order;
        const std::size_t id = o[i];
        o.erase(o.begin() + static_cast<std::ptrdiff_t>(i));
        o.insert(o.begin() + static_cast<std::ptrdiff_t>(j), id);
        double step;
        try {
          step = simulate(profile, network, trial).step_s;
        } catch (const Error&) {
          continue;  // against the edges: cannot complete
        }
        if (better(step, current)) {
          current = step;
          options = std::move(trial);
          improved = true;
        }
      }
  }
  return {options, simulate(profile, network, options)};
}

Schedule best_schedule(const StepProfile& profile, const NetworkModel& network,
                       const SimulationOptions& start, std::size_t max_in_flight) {
  Schedule best{start, simulate(profile, network, start)};
  if (best.options.issue_order.empty()) best.options.issue_order = default_issue_order(profile);
  const std::vector<std::size_t> first_order = best.options.issue_order;
  for (std::size_t window = 0; window <= max_in_flight; ++window) {
    SimulationOptions options = start;
    options.collectives_in_flight = window;
    options.issue_order = first_order;
    Schedule found = best_order(profile, network, options);
    if (found.prediction.step_s < best.prediction.step_s * (1 - 1e-9)) best = std::move(found);
  }
  return best;
}

}  // namespace loom
