// The automatic plan's search: every candidate bucketing built by the client as the step's real
// graph, given the durations the profiled runs measured, simulated (sim/), ranked, shortlisted,
// agreed on rank 0's and timed round-robin.
#include "loom/step_planner.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "invalid_argument.hpp"
#include "loom/error.hpp"
#include "loom/network_model.hpp"
#include "loom/overlap_metrics.hpp"
#include "loom/pinned_pool.hpp"
#include "loom/step_profile.hpp"
#include "loom/step_simulator.hpp"

namespace loom {

namespace {

// seconds = fixed + per_byte * bytes: least squares over measured nodes, both terms >= 0.
struct LinearCost {
  double fixed_s = 0;
  double per_byte_s = 0;
  double at(std::size_t bytes) const { return fixed_s + per_byte_s * static_cast<double>(bytes); }
};

LinearCost fit(const std::vector<std::pair<double, double>>& points) {  // (bytes, seconds)
  if (points.empty()) return {};
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (auto [x, y] : points) {
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  const double n = static_cast<double>(points.size());
  const double var = sxx - sx * sx / n;
  LinearCost cost;
  if (points.size() >= 2 && var > 0) {
    cost.per_byte_s = (sxy - sx * sy / n) / var;
    cost.fixed_s = (sy - cost.per_byte_s * sx) / n;
  }
  if (points.size() < 2 || var <= 0 || cost.per_byte_s < 0 || cost.fixed_s < 0) {
    // One size only, or a fit that goes negative: proportional to the bytes.
    cost.fixed_s = 0;
    cost.per_byte_s = sx > 0 ? sy / sx : 0;
  }
  return cost;
}

// The wall time of one profiled run: first start to last end.
double run_seconds(const std::vector<NodeTiming>& run) {
  std::int64_t first = std::numeric_limits<std::int64_t>::max(), last = 0;
  for (const NodeTiming& t : run) {
    if (t.start_ns == 0 && t.end_ns == 0) continue;
    first = std::min(first, t.start_ns);
    last = std::max(last, t.end_ns);
  }
  return last > first ? static_cast<double>(last - first) * 1e-9 : 0;
}

// The parts of a bucket whose cost is fitted per byte (the allreduce's comes from the wire).
enum Part : std::size_t { pack, unpack, update, parts };

// Per node id of `g`: which bucket and part it is, from the builder's tasks.
std::vector<std::optional<std::pair<std::size_t, Part>>> bucket_parts(const PlanGraph& g) {
  std::vector<std::optional<std::pair<std::size_t, Part>>> of(g.graph.size());
  auto mark = [&](const Task& t, std::size_t b, Part part) {
    if (t.valid() && t.id() < of.size()) of[t.id()] = std::pair{b, part};
  };
  for (std::size_t b = 0; b < g.buckets.size(); ++b) {
    mark(g.buckets[b].pack, b, pack);
    mark(g.buckets[b].unpack, b, unpack);
    if (b < g.updates.size()) mark(g.updates[b], b, update);
  }
  return of;
}

void check_plan_graph(const PlanGraph& g, const Bucketer& bucketer, const std::string& which) {
  if (g.buckets.size() != bucketer.buckets().size())
    throw Error(ErrorCode::internal, "search_plans: the " + which + " graph has " +
                                         std::to_string(g.buckets.size()) + " bucket chains for " +
                                         std::to_string(bucketer.buckets().size()) + " buckets");
  for (std::size_t b = 0; b < g.buckets.size(); ++b)
    if (!g.buckets[b].reduce.valid() || g.buckets[b].reduce.id() >= g.graph.size())
      throw Error(ErrorCode::internal, "search_plans: bucket " + std::to_string(b) + " of the " +
                                           which + " graph has no allreduce node");
}

}  // namespace

std::vector<TimedPlan> search_plans(const PlanSearch& search, const PlanInputs& inputs,
                                    const BucketerFactory& make_bucketer,
                                    const PlanGraphBuilder& build) {
  search.check("search_plans");
  if (!inputs.running || !inputs.bucketer || !make_bucketer || !build)
    throw_invalid_argument(
        "search_plans: the running graph, its Bucketer, a Bucketer factory and a graph "
        "builder are all needed");
  if (inputs.runs.empty() || inputs.runs.back().empty())
    throw_invalid_argument("search_plans needs a profiled run (ExecutorOptions::profile)");
  if (inputs.ranks < 1 || inputs.workers < 1)
    throw_invalid_argument("search_plans: ranks and workers must be >= 1 (got " +
                           std::to_string(inputs.ranks) + " and " + std::to_string(inputs.workers) +
                           ")");
  const PlanGraph& running = *inputs.running;
  const Bucketer& bucketer = *inputs.bucketer;
  check_plan_graph(running, bucketer, "running");
  const int workers = search.workers > 0 ? search.workers : inputs.workers;

  // The running plan as measured: its profile, its step and its wire.
  StepProfile current = profile_step(running.graph, inputs.runs);
  current.ranks = inputs.ranks;
  current.workers = workers;
  current.collectives_in_flight = inputs.collectives_in_flight;
  const double n_runs = static_cast<double>(inputs.runs.size());
  for (const auto& run : inputs.runs) {
    const OverlapMetrics overlap = measure_overlap(run);
    current.measured_step_s += run_seconds(run) / n_runs;
    current.measured_comm_s += overlap.comm_ms * 1e-3 / n_runs;
    current.measured_compute_s += overlap.compute_ms * 1e-3 / n_runs;
  }
  const NetworkModel network = inputs.ranks > 1 && current.measured_comm_s > 0
                                   ? NetworkModel::fitted(current, search.latency_s)
                                   : NetworkModel(default_tuning());
  SimulationOptions sim;
  sim.ranks = inputs.ranks;
  sim.workers = workers;
  sim.cores = search.cores;
  sim.comm_cpu = search.comm_cpu;

  // Each bucket's pack, unpack and update cost, per byte, from the running buckets.
  std::vector<std::vector<std::pair<double, double>>> measured(parts);
  const auto running_parts = bucket_parts(running);
  for (std::size_t id = 0; id < current.nodes.size(); ++id)
    if (const auto& part = running_parts[id])
      measured[part->second].push_back(
          {static_cast<double>(bucketer.buckets()[part->first].bytes()),
           current.nodes[id].duration_s});
  std::vector<LinearCost> cost(parts);
  for (std::size_t p = 0; p < parts; ++p) cost[p] = fit(measured[p]);

  // Candidates: the running bucketing, then the search's (PlanSearch::bucketings).
  struct Candidate {
    std::size_t cap, first;
    bool partition;
  };
  const BucketerOptions& running_options = bucketer.options();
  std::vector<Candidate> candidates{{running_options.bucket_cap_bytes,
                                     running_options.first_bucket_bytes,
                                     running_options.partition_large}};
  std::size_t largest = 0;
  for (std::size_t g = 0; g < bucketer.num_gradients(); ++g)
    largest = std::max(largest, bucketer.spec(g).count * dtype_size(bucketer.spec(g).dtype));
  for (const ReducerPlan& shape : search.bucketings(ReducerPlan{}, largest)) {
    const Candidate c{shape.bucket_cap_bytes, shape.first_bucket_bytes, shape.partition_large};
    if (std::none_of(candidates.begin(), candidates.end(), [&](const Candidate& x) {
          return x.cap == c.cap && x.first == c.first && x.partition == c.partition;
        }))
      candidates.push_back(c);
  }

  for (std::size_t b : inputs.issue_order)
    if (b >= bucketer.buckets().size())
      throw_invalid_argument("search_plans: the running issue order names bucket " +
                             std::to_string(b) + " of " +
                             std::to_string(bucketer.buckets().size()));

  PinnedPool pool;  // the candidates' bucket memory, one after another
  std::vector<TimedPlan> plans;
  TimedPlan as_running;  // the running plan as it runs, predicted like the candidates
  for (const Candidate& c : candidates) {
    BucketerOptions options = running_options;
    options.bucket_cap_bytes = c.cap;
    options.first_bucket_bytes = c.first;
    options.partition_large = c.partition;
    if (!options.pool) options.pool = &pool;
    const std::unique_ptr<Bucketer> candidate = make_bucketer(options);
    const PlanGraph g = build(*candidate, {});
    check_plan_graph(g, *candidate, "candidate's");
    const auto candidate_parts = bucket_parts(g);
    std::vector<std::size_t> bucket_of_reduce(g.graph.size(), SIZE_MAX);
    for (std::size_t b = 0; b < g.buckets.size(); ++b)
      bucket_of_reduce[g.buckets[b].reduce.id()] = b;

    StepProfile profile = profile_step(g.graph, inputs.runs);
    profile.ranks = inputs.ranks;
    profile.workers = workers;
    for (std::size_t id = 0; id < profile.nodes.size(); ++id) {
      ProfiledNode& node = profile.nodes[id];
      if (bucket_of_reduce[id] != SIZE_MAX) {
        node.issue_index = -1;  // the candidate's own order; its time comes from the wire
      } else if (const auto& part = candidate_parts[id]) {
        node.duration_s = cost[part->second].at(candidate->buckets()[part->first].bytes());
      }
      // Everything else (forward, backward, loss) was measured under the same names.
    }
    if (&c == &candidates.front()) {  // the running bucketing: first as it runs
      SimulationOptions own = sim;
      own.collectives_in_flight = inputs.collectives_in_flight;
      for (std::size_t b : inputs.issue_order) own.issue_order.push_back(g.buckets[b].reduce.id());
      as_running.plan.bucket_cap_bytes = c.cap;
      as_running.plan.first_bucket_bytes = c.first;
      as_running.plan.partition_large = c.partition;
      as_running.plan.collectives_in_flight = inputs.collectives_in_flight;
      as_running.plan.issue_order.assign(inputs.issue_order.begin(), inputs.issue_order.end());
      as_running.buckets = candidate->buckets().size();
      as_running.predicted_step_s = simulate(profile, network, own).step_s;
    }
    // The best issue order for each in-flight limit, so the shortlist can hold every limit.
    for (std::size_t in_flight = 0; in_flight <= search.max_in_flight; ++in_flight) {
      SimulationOptions start = sim;
      start.collectives_in_flight = in_flight;
      const Schedule s = best_order(profile, network, start);
      TimedPlan plan;
      plan.plan.bucket_cap_bytes = c.cap;
      plan.plan.first_bucket_bytes = c.first;
      plan.plan.partition_large = c.partition;
      plan.plan.collectives_in_flight = s.options.collectives_in_flight;
      plan.buckets = candidate->buckets().size();
      plan.predicted_step_s = s.prediction.step_s;
      for (std::size_t id :
           s.options.issue_order.empty() ? default_issue_order(profile) : s.options.issue_order)
        if (id < bucket_of_reduce.size() && bucket_of_reduce[id] != SIZE_MAX)
          plan.plan.issue_order.push_back(bucket_of_reduce[id]);
      if (plan.plan.issue_order.size() != plan.buckets)
        throw Error(ErrorCode::internal, "search_plans: the plan (" + describe(plan) + ") orders " +
                                             std::to_string(plan.plan.issue_order.size()) +
                                             " buckets");
      plans.push_back(std::move(plan));
    }
  }
  std::stable_sort(plans.begin(), plans.end(), [](const TimedPlan& a, const TimedPlan& b) {
    return a.predicted_step_s < b.predicted_step_s;
  });
  plans.insert(plans.begin(), std::move(as_running));
  return plans;
}

std::vector<TimedPlan> shortlist_plans(const std::vector<TimedPlan>& ranked, std::size_t keep) {
  std::vector<TimedPlan> out;
  if (ranked.empty() || keep == 0) return out;
  const ReducerPlan& running = ranked.front().plan;
  out.push_back(ranked.front());
  std::vector<bool> taken(ranked.size(), false);
  for (std::size_t i = 1; i < ranked.size(); ++i) taken[i] = same_plan(ranked[i].plan, running);
  // The best of each in-flight limit the running plan does not already stand for.
  for (std::size_t i = 1; i < ranked.size() && out.size() < keep; ++i)
    if (!taken[i] && std::none_of(out.begin() + 1, out.end(), [&](const TimedPlan& p) {
          return p.plan.collectives_in_flight == ranked[i].plan.collectives_in_flight;
        })) {
      out.push_back(ranked[i]);
      taken[i] = true;
    }
  for (std::size_t i = 1; i < ranked.size() && out.size() < keep; ++i)
    if (!taken[i]) out.push_back(ranked[i]);
  return out;
}

std::vector<TimedPlan> agree_on_plans(Backend& backend, const std::vector<TimedPlan>& mine,
                                      std::chrono::nanoseconds limit) {
  // One message: the count, then per plan its encoding (encode_plan), its bucket count, its
  // prediction and its measurement (bit patterns).
  std::vector<std::int64_t> wire{static_cast<std::int64_t>(mine.size())};
  for (const TimedPlan& timed : mine) {
    encode_plan(timed.plan, wire);
    wire.insert(wire.end(), {static_cast<std::int64_t>(timed.buckets),
                             std::bit_cast<std::int64_t>(timed.predicted_step_s),
                             std::bit_cast<std::int64_t>(timed.measured_step_s)});
  }
  const std::vector<std::int64_t> root = backend.agree_on_root(
      "agree_on_plans",
      backend.rank() == 0 ? std::span<const std::int64_t>(wire) : std::span<const std::int64_t>(),
      limit, [&] { return "agree_on_plans on rank " + std::to_string(backend.rank()); });
  std::vector<TimedPlan> plans;
  if (root.empty()) return plans;
  PlanReader read(root, "agree_on_plans on rank " + std::to_string(backend.rank()));
  const std::int64_t count = read.next();
  for (std::int64_t i = 0; i < count; ++i) {
    TimedPlan timed;
    timed.plan = read.plan(ReducerPlan{});
    timed.buckets = static_cast<std::size_t>(read.next());
    timed.predicted_step_s = read.next_double();
    timed.measured_step_s = read.next_double();
    plans.push_back(std::move(timed));
  }
  return plans;
}

}  // namespace loom
