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

#include "loom/error.hpp"
#include "loom/network_model.hpp"
#include "loom/overlap_metrics.hpp"
#include "loom/pinned_pool.hpp"
#include "loom/step_profile.hpp"
#include "loom/step_simulator.hpp"

namespace loom {

namespace {

[[noreturn]] void invalid(const std::string& what) {
  throw Error(ErrorCode::invalid_argument, what);
}

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

std::string bucketing_text(std::size_t cap, std::size_t first, bool split) {
  return "cap " + std::to_string(cap >> 10) + " KiB, first " + std::to_string(first >> 10) +
         " KiB" + (split ? ", split" : "");
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

int PlanSearch::runs_to_decide() const {
  const int timed = shortlist > 1 ? static_cast<int>(shortlist) * std::max(2, trial_runs) : 0;
  return std::max(1, profile_runs) + timed;
}

void PlanSearch::check(const std::string& who) const {
  const auto bad = [&](const std::string& what) { invalid(who + ": " + what); };
  if (caps_bytes.empty()) bad("PlanSearch::caps_bytes is empty");
  for (std::size_t cap : caps_bytes)
    if (cap == 0) bad("bucket caps must be > 0 (PlanSearch::caps_bytes holds 0)");
  for (std::size_t first : first_bucket_bytes)
    if (first == 0) bad("first-bucket sizes must be > 0 (PlanSearch::first_bucket_bytes holds 0)");
  if (profile_runs < 1 || trial_runs < 2)
    bad("PlanSearch needs profile_runs >= 1 and trial_runs >= 2 (got " +
        std::to_string(profile_runs) + " and " + std::to_string(trial_runs) + ")");
  if (latency_s < 0 || cores < 0 || comm_cpu < 0 || workers < 0)
    bad("PlanSearch's latency_s, cores, comm_cpu and workers must be >= 0");
}

std::string describe(const StepPlan& plan) {
  return bucketing_text(plan.cap_bytes, plan.first_bucket_bytes, plan.split_large) + ", " +
         std::to_string(plan.buckets) + " buckets, in flight " +
         (plan.collectives_in_flight == 0 ? std::string("unlimited")
                                          : std::to_string(plan.collectives_in_flight));
}

std::vector<StepPlan> search_plans(const PlanSearch& search, const PlanInputs& inputs,
                                   const BucketerFactory& make_bucketer,
                                   const PlanGraphBuilder& build) {
  search.check("search_plans");
  if (!inputs.running || !inputs.bucketer || !make_bucketer || !build)
    invalid(
        "search_plans: the running graph, its Bucketer, a Bucketer factory and a graph "
        "builder are all needed");
  if (inputs.runs.empty() || inputs.runs.back().empty())
    invalid("search_plans needs a profiled run (ExecutorOptions::profile)");
  if (inputs.ranks < 1 || inputs.workers < 1)
    invalid("search_plans: ranks and workers must be >= 1 (got " + std::to_string(inputs.ranks) +
            " and " + std::to_string(inputs.workers) + ")");
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

  // Candidates: the running bucketing, then every cap x first bucket (<= cap) x split.
  struct Candidate {
    std::size_t cap, first;
    bool split;
  };
  const BucketerOptions& running_options = bucketer.options();
  std::vector<Candidate> candidates{
      {running_options.cap_bytes, running_options.first_bucket_bytes, running_options.split_large}};
  for (std::size_t cap : search.caps_bytes) {
    std::vector<std::size_t> firsts{cap};
    for (std::size_t f : search.first_bucket_bytes)
      if (f < cap) firsts.push_back(f);
    for (std::size_t first : firsts)
      for (bool split : {false, true})
        if ((!split || search.try_split) &&
            std::none_of(candidates.begin(), candidates.end(), [&](const Candidate& x) {
              return x.cap == cap && x.first == first && x.split == split;
            }))
          candidates.push_back({cap, first, split});
  }

  PinnedPool pool;  // the candidates' bucket memory, one after another
  std::vector<StepPlan> plans;
  for (const Candidate& c : candidates) {
    BucketerOptions options = running_options;
    options.cap_bytes = c.cap;
    options.first_bucket_bytes = c.first;
    options.split_large = c.split;
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
    // The best issue order for each in-flight limit, so the shortlist can hold every limit.
    for (std::size_t in_flight = 0; in_flight <= search.max_in_flight; ++in_flight) {
      SimulationOptions start = sim;
      start.collectives_in_flight = in_flight;
      const Schedule s = best_order(profile, network, start);
      StepPlan plan;
      plan.cap_bytes = c.cap;
      plan.first_bucket_bytes = c.first;
      plan.split_large = c.split;
      plan.collectives_in_flight = s.options.collectives_in_flight;
      plan.buckets = candidate->buckets().size();
      plan.predicted_step_s = s.prediction.step_s;
      for (std::size_t id :
           s.options.issue_order.empty() ? default_issue_order(profile) : s.options.issue_order)
        if (id < bucket_of_reduce.size() && bucket_of_reduce[id] != SIZE_MAX)
          plan.issue_order.push_back(bucket_of_reduce[id]);
      if (plan.issue_order.size() != plan.buckets)
        throw Error(ErrorCode::internal, "search_plans: the plan (" + describe(plan) + ") orders " +
                                             std::to_string(plan.issue_order.size()) + " buckets");
      plans.push_back(std::move(plan));
    }
  }
  std::stable_sort(plans.begin(), plans.end(), [](const StepPlan& a, const StepPlan& b) {
    return a.predicted_step_s < b.predicted_step_s;
  });
  return plans;
}

std::vector<StepPlan> shortlist_plans(const std::vector<StepPlan>& ranked, std::size_t keep) {
  std::vector<StepPlan> out;
  std::vector<bool> taken(ranked.size(), false);
  for (std::size_t i = 0; i < ranked.size() && out.size() < keep; ++i)
    if (std::none_of(out.begin(), out.end(), [&](const StepPlan& p) {
          return p.collectives_in_flight == ranked[i].collectives_in_flight;
        })) {
      out.push_back(ranked[i]);
      taken[i] = true;
    }
  for (std::size_t i = 0; i < ranked.size() && out.size() < keep; ++i)
    if (!taken[i]) out.push_back(ranked[i]);
  return out;
}

std::vector<StepPlan> agree_on_plans(Backend& backend, const std::vector<StepPlan>& mine,
                                     std::chrono::nanoseconds limit) {
  // One message: the count, then per plan a fixed header (so the order's length is known), its
  // prediction and measurement (bit patterns) and its order.
  std::vector<std::int64_t> wire{static_cast<std::int64_t>(mine.size())};
  for (const StepPlan& plan : mine) {
    wire.insert(wire.end(),
                {static_cast<std::int64_t>(plan.cap_bytes),
                 static_cast<std::int64_t>(plan.first_bucket_bytes), plan.split_large ? 1 : 0,
                 static_cast<std::int64_t>(plan.collectives_in_flight),
                 static_cast<std::int64_t>(plan.buckets),
                 static_cast<std::int64_t>(plan.issue_order.size()),
                 std::bit_cast<std::int64_t>(plan.predicted_step_s),
                 std::bit_cast<std::int64_t>(plan.measured_step_s)});
    wire.insert(wire.end(), plan.issue_order.begin(), plan.issue_order.end());
  }
  const std::vector<std::int64_t> root = backend.agree_on_root(
      "agree_on_plans",
      backend.rank() == 0 ? std::span<const std::int64_t>(wire) : std::span<const std::int64_t>(),
      limit, [&] { return "agree_on_plans on rank " + std::to_string(backend.rank()); });
  std::vector<StepPlan> plans;
  std::size_t at = 0;
  const auto next = [&] {
    if (at >= root.size())
      throw Error(ErrorCode::mismatch, "agree_on_plans on rank " + std::to_string(backend.rank()) +
                                           ": rank 0's plans end after " + std::to_string(at) +
                                           " values");
    return root[at++];
  };
  const std::int64_t count = root.empty() ? 0 : next();
  for (std::int64_t i = 0; i < count; ++i) {
    StepPlan plan;
    plan.cap_bytes = static_cast<std::size_t>(next());
    plan.first_bucket_bytes = static_cast<std::size_t>(next());
    plan.split_large = next() != 0;
    plan.collectives_in_flight = static_cast<std::size_t>(next());
    plan.buckets = static_cast<std::size_t>(next());
    const std::int64_t order = next();
    plan.predicted_step_s = std::bit_cast<double>(next());
    plan.measured_step_s = std::bit_cast<double>(next());
    for (std::int64_t k = 0; k < order; ++k)
      plan.issue_order.push_back(static_cast<std::size_t>(next()));
    plans.push_back(std::move(plan));
  }
  return plans;
}

PlanTrials::PlanTrials(std::size_t plans, int rounds)
    : _runs_s(plans), _rounds(static_cast<std::size_t>(std::max(0, rounds))) {
  if (plans == 0) invalid("PlanTrials: an empty shortlist");
  if (rounds < 2)
    invalid("PlanTrials: at least 2 rounds (the first is not counted), got " +
            std::to_string(rounds));
}

std::size_t PlanTrials::record(double run_s) {
  if (done()) invalid("PlanTrials::record: every plan already ran its rounds");
  if (!std::isfinite(run_s) || run_s < 0)
    invalid("PlanTrials::record: plan " + std::to_string(_current) + "'s run took " +
            std::to_string(run_s) + " s (a time is finite and not negative)");
  _runs_s[_current].push_back(run_s);
  _current = (_current + 1) % _runs_s.size();
  return _current;
}

bool PlanTrials::done() const noexcept {
  return _runs_s.back().size() >= _rounds;
}

std::vector<double> PlanTrials::steps_s() const {
  if (!done()) invalid("PlanTrials::steps_s before every plan ran its rounds");
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t h = v.size() / 2;
    return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
  };
  const std::vector<double>& first = _runs_s.front();
  const double base = median({first.begin() + 1, first.end()});
  std::vector<double> out{base};
  for (std::size_t k = 1; k < _runs_s.size(); ++k) {
    std::vector<double> ratios;
    for (std::size_t r = 1; r < _rounds; ++r)
      // A run of 0 s (a clock too coarse for the step) cannot be a denominator.
      ratios.push_back(first[r] > 0 ? _runs_s[k][r] / first[r] : 1.0);
    out.push_back(base * median(std::move(ratios)));
  }
  return out;
}

std::size_t PlanTrials::fastest(std::span<const double> seconds) {
  if (seconds.empty()) invalid("PlanTrials::fastest of no plans");
  return static_cast<std::size_t>(std::min_element(seconds.begin(), seconds.end()) -
                                  seconds.begin());
}

}  // namespace loom
