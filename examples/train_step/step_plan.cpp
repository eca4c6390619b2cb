// TrainStep's automatic plan: every candidate bucketing is built as the step's real graph,
// given the durations the profiled runs measured, and simulated (sim/); rank 0's best plan is
// then run on every rank.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include "loom/error.hpp"
#include "loom/network_model.hpp"
#include "loom/overlap_metrics.hpp"
#include "loom/pinned_pool.hpp"
#include "loom/step_profile.hpp"
#include "loom/step_simulator.hpp"
#include "train_step.hpp"

namespace loom::examples {

namespace {

// "bucket<b>.<part>" (the Bucketer's and the update's node names): b and part.
std::optional<std::pair<std::size_t, std::string_view>> bucket_node(std::string_view name) {
  constexpr std::string_view prefix = "bucket";
  if (!name.starts_with(prefix)) return std::nullopt;
  const std::size_t dot = name.find('.');
  if (dot == std::string_view::npos || dot == prefix.size()) return std::nullopt;
  std::size_t b = 0;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + dot;
  const auto [ptr, ec] = std::from_chars(first, last, b);
  if (ec != std::errc{} || ptr != last) return std::nullopt;
  return std::pair{b, name.substr(dot + 1)};
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

}  // namespace

int PlanSearch::runs_to_decide() const {
  const int timed = shortlist > 1 ? static_cast<int>(shortlist) * std::max(2, trial_runs) : 0;
  return std::max(1, profile_runs) + timed;
}

std::string describe(const StepPlan& plan) {
  return bucketing_text(plan.cap_bytes, plan.first_bucket_bytes, plan.split_large) + ", " +
         std::to_string(plan.buckets) + " buckets, in flight " +
         (plan.collectives_in_flight == 0 ? std::string("unlimited")
                                          : std::to_string(plan.collectives_in_flight));
}

namespace {

// The shortlist: the best predicted plan of each in-flight limit, then the next best overall.
std::vector<StepPlan> shortlist(const std::vector<StepPlan>& ranked, std::size_t keep) {
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

}  // namespace

std::vector<StepPlan> TrainStep::search_plans(std::span<const std::vector<NodeTiming>> runs,
                                              const PlanSearch& search) {
  const int ranks = _backend.world_size();
  const int workers =
      search.workers > 0
          ? search.workers
          : static_cast<int>(std::min<std::size_t>(
                tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism),
                static_cast<std::size_t>(tbb::this_task_arena::max_concurrency())));

  // The running plan as measured: its profile, its step and its wire.
  StepProfile current = profile_step(_graph, runs);
  current.ranks = ranks;
  current.workers = workers;
  current.collectives_in_flight = executor_options().collectives_in_flight;
  const double n_runs = static_cast<double>(runs.size());
  for (const auto& run : runs) {
    const OverlapMetrics overlap = measure_overlap(run);
    current.measured_step_s += run_seconds(run) / n_runs;
    current.measured_comm_s += overlap.comm_ms * 1e-3 / n_runs;
    current.measured_compute_s += overlap.compute_ms * 1e-3 / n_runs;
  }
  const NetworkModel network = ranks > 1 && current.measured_comm_s > 0
                                   ? NetworkModel::fitted(current, search.latency_s)
                                   : NetworkModel(default_tuning());
  SimulationOptions sim;
  sim.ranks = ranks;
  sim.workers = workers;
  sim.cores = search.cores;
  sim.comm_cpu = search.comm_cpu;

  // Each bucket's pack, unpack and update cost, per byte, from the running buckets.
  std::map<std::string, std::vector<std::pair<double, double>>, std::less<>> measured;
  for (const ProfiledNode& node : current.nodes)
    if (const auto part = bucket_node(node.name);
        part && part->second != "allreduce" && part->first < _bucketer->buckets().size())
      measured[std::string(part->second)].push_back(
          {static_cast<double>(_bucketer->buckets()[part->first].bytes()), node.duration_s});
  std::map<std::string, LinearCost, std::less<>> cost;
  for (const auto& [part, points] : measured) cost[part] = fit(points);

  // Candidates: the running bucketing, then every cap x first bucket (<= cap) x split.
  struct Candidate {
    std::size_t cap, first;
    bool split;
  };
  std::vector<Candidate> candidates{{_bucketer->options().cap_bytes,
                                     _bucketer->options().first_bucket_bytes,
                                     _bucketer->options().split_large}};
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
    BucketerOptions options = _config.bucketing;
    options.cap_bytes = c.cap;
    options.first_bucket_bytes = c.first;
    options.split_large = c.split;
    if (!options.pool) options.pool = &pool;
    std::unique_ptr<Bucketer> candidate = make_bucketer(options);
    // The step's own graph builder, on the candidate's buckets in their ready order.
    std::swap(_bucketer, candidate);
    std::vector<std::size_t> order = std::exchange(_issue_order, {});
    Graph graph;
    try {
      graph = build_graph();
    } catch (...) {
      std::swap(_bucketer, candidate);
      _issue_order = std::move(order);
      throw;
    }
    std::swap(_bucketer, candidate);
    _issue_order = std::move(order);

    StepProfile profile = profile_step(graph, runs);
    profile.ranks = ranks;
    profile.workers = workers;
    for (ProfiledNode& node : profile.nodes) {
      const auto part = bucket_node(node.name);
      if (!part) continue;  // forward, backward, loss: measured under the same names
      if (part->second == "allreduce") {
        node.issue_index = -1;  // the candidate's own order; its time comes from the wire
      } else {
        const auto it = cost.find(part->second);
        node.duration_s =
            it == cost.end() ? 0 : it->second.at(candidate->buckets()[part->first].bytes());
      }
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
        if (const auto part = bucket_node(profile.nodes[id].name);
            part && part->second == "allreduce")
          plan.issue_order.push_back(part->first);
      if (plan.issue_order.size() != plan.buckets)
        throw Error(ErrorCode::internal, "TrainStep::plan_automatically: the plan (" +
                                             describe(plan) + ") orders " +
                                             std::to_string(plan.issue_order.size()) + " buckets");
      plans.push_back(std::move(plan));
    }
  }
  std::stable_sort(plans.begin(), plans.end(), [](const StepPlan& a, const StepPlan& b) {
    return a.predicted_step_s < b.predicted_step_s;
  });
  return plans;
}

std::vector<StepPlan> TrainStep::agree_on_plans(const std::vector<StepPlan>& mine) {
  // Rank 0's count first (0: its search failed), then per plan a fixed-size header (so every
  // rank knows the order's length), its prediction and measurement, and its order.
  std::int64_t count = static_cast<std::int64_t>(mine.size());
  _backend.broadcast(Buffer(&count, 1, DType::int64), 0);
  std::vector<StepPlan> plans(static_cast<std::size_t>(std::max<std::int64_t>(0, count)));
  for (std::size_t i = 0; i < plans.size(); ++i) {
    StepPlan& plan = plans[i];
    if (_backend.rank() == 0) plan = mine[i];
    std::int64_t header[5] = {static_cast<std::int64_t>(plan.cap_bytes),
                              static_cast<std::int64_t>(plan.first_bucket_bytes),
                              plan.split_large ? 1 : 0,
                              static_cast<std::int64_t>(plan.collectives_in_flight),
                              static_cast<std::int64_t>(plan.buckets)};
    double figures[2] = {plan.predicted_step_s, plan.measured_step_s};
    _backend.broadcast(Buffer(header, 5, DType::int64), 0);
    _backend.broadcast(Buffer(figures, 2, DType::float64), 0);
    plan.cap_bytes = static_cast<std::size_t>(header[0]);
    plan.first_bucket_bytes = static_cast<std::size_t>(header[1]);
    plan.split_large = header[2] != 0;
    plan.collectives_in_flight = static_cast<std::size_t>(header[3]);
    plan.buckets = static_cast<std::size_t>(header[4]);
    plan.predicted_step_s = figures[0];
    plan.measured_step_s = figures[1];
    std::vector<std::int64_t> order(plan.buckets);
    for (std::size_t k = 0; k < plan.issue_order.size() && k < order.size(); ++k)
      order[k] = static_cast<std::int64_t>(plan.issue_order[k]);
    _backend.broadcast(Buffer::of(std::span(order)), 0);
    plan.issue_order.assign(order.begin(), order.end());
  }
  return plans;
}

std::vector<StepPlan> TrainStep::predict_plans(const PlanSearch& search, std::size_t keep) {
  if (_config.mode != OverlapMode::loom)
    throw Error(ErrorCode::invalid_argument,
                "TrainStep::plan_automatically plans loom mode's step; this step runs " +
                    std::string(to_string(_config.mode)) + " mode");
  // Checked on every rank, so a bad search is the same named error everywhere.
  const auto bad = [](const std::string& what) {
    throw Error(ErrorCode::invalid_argument, "TrainStep::plan_automatically: " + what);
  };
  if (search.caps_bytes.empty()) bad("PlanSearch::caps_bytes is empty");
  for (std::size_t cap : search.caps_bytes)
    if (cap == 0) bad("bucket caps must be > 0 (PlanSearch::caps_bytes holds 0)");
  for (std::size_t first : search.first_bucket_bytes)
    if (first == 0) bad("first-bucket sizes must be > 0 (PlanSearch::first_bucket_bytes holds 0)");
  if (search.profile_runs < 1 || search.trial_runs < 2)
    bad("PlanSearch needs profile_runs >= 1 and trial_runs >= 2 (got " +
        std::to_string(search.profile_runs) + " and " + std::to_string(search.trial_runs) + ")");
  if (search.latency_s < 0 || search.cores < 0 || search.comm_cpu < 0 || search.workers < 0)
    bad("PlanSearch's latency_s, cores, comm_cpu and workers must be >= 0");
  std::vector<std::vector<NodeTiming>> runs = _auto.runs;
  if (runs.empty()) runs.push_back(_executor->last_run());
  if (runs.back().empty())
    throw Error(ErrorCode::invalid_argument,
                "TrainStep::plan_automatically needs a profiled run first "
                "(ExecutorOptions::profile)");
  std::vector<StepPlan> mine;  // empty tells the other ranks that rank 0 failed
  std::string failure;
  if (_backend.rank() == 0) {
    try {
      mine = shortlist(search_plans(runs, search), std::max<std::size_t>(1, keep));
    } catch (const std::exception& e) {
      failure = e.what();
      mine.clear();
    }
  }
  std::vector<StepPlan> plans = agree_on_plans(mine);
  if (!failure.empty()) throw Error(ErrorCode::internal, failure);
  if (plans.empty())
    throw Error(ErrorCode::peer_failed, "TrainStep::plan_automatically on rank " +
                                            std::to_string(_backend.rank()) +
                                            ": rank 0 could not make a plan");
  return plans;
}

void TrainStep::apply_plan(StepPlan plan) {
  BucketerOptions options = _config.bucketing;
  options.cap_bytes = plan.cap_bytes;
  options.first_bucket_bytes = plan.first_bucket_bytes;
  options.split_large = plan.split_large;
  std::unique_ptr<Bucketer> bucketer = make_bucketer(options);
  if (bucketer->buckets().size() != plan.buckets)
    throw Error(ErrorCode::mismatch,
                "TrainStep::plan_automatically on rank " + std::to_string(_backend.rank()) +
                    ": rank 0's plan (" + describe(plan) + ") has " + std::to_string(plan.buckets) +
                    " buckets, this rank's model " + std::to_string(bucketer->buckets().size()));
  _bucketer = std::move(bucketer);
  _issue_order = plan.issue_order;
  _plan = std::move(plan);
  compile();
}

const StepPlan& TrainStep::plan_automatically(const PlanSearch& search) {
  apply_plan(predict_plans(search, 1).front());
  return *_plan;
}

void TrainStep::swap_compiled(Compiled& other) {
  std::swap(_bucketer, other.bucketer);
  std::swap(_executor, other.executor);
  std::swap(_graph, other.graph);
  std::swap(_issue_order, other.issue_order);
  std::swap(_plan, other.plan);
}

void TrainStep::advance_automatic_plan(double run_s) {
  const PlanSearch& search = *_config.automatic_plan;
  AutomaticPlan& a = _auto;
  if (a.shortlist.empty()) {
    // Profiling the configured buckets.
    a.runs.push_back(_executor->last_run());
    if (a.runs.size() < static_cast<std::size_t>(std::max(1, search.profile_runs))) return;
    a.shortlist = predict_plans(search, search.shortlist);
    a.runs.clear();
    if (a.shortlist.size() == 1) {  // nothing to time
      a.tried = a.shortlist;
      a.shortlist.clear();
      a.decided = true;
      apply_plan(a.tried.front());
      return;
    }
    // Every shortlisted plan compiled once and kept: they then run in turn without
    // recompiling, each on its own warm bucket memory.
    a.compiled.resize(a.shortlist.size());
    for (std::size_t k = 0; k < a.shortlist.size(); ++k) {
      apply_plan(a.shortlist[k]);
      swap_compiled(a.compiled[k]);
    }
    a.runs_s.assign(a.shortlist.size(), {});
    a.current = 0;
    swap_compiled(a.compiled[0]);
    return;
  }
  a.runs_s[a.current].push_back(run_s);
  const std::size_t next = (a.current + 1) % a.shortlist.size();
  const std::size_t rounds = static_cast<std::size_t>(std::max(2, search.trial_runs));
  if (next != 0 || a.runs_s[a.current].size() < rounds) {
    swap_compiled(a.compiled[a.current]);
    swap_compiled(a.compiled[next]);
    a.current = next;
    return;
  }
  // Every plan ran `rounds` times: the median of each one's runs after its first.
  for (std::size_t k = 0; k < a.shortlist.size(); ++k) {
    std::vector<double> v(a.runs_s[k].begin() + 1, a.runs_s[k].end());
    std::sort(v.begin(), v.end());
    const std::size_t h = v.size() / 2;
    a.shortlist[k].measured_step_s = v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
  }
  // Rank 0's measurements decide (and are what every rank reports).
  a.tried = agree_on_plans(a.shortlist);
  const std::size_t fastest =
      static_cast<std::size_t>(std::min_element(a.tried.begin(), a.tried.end(),
                                                [](const StepPlan& x, const StepPlan& y) {
                                                  return x.measured_step_s < y.measured_step_s;
                                                }) -
                               a.tried.begin());
  if (fastest != a.current) {
    swap_compiled(a.compiled[a.current]);
    swap_compiled(a.compiled[fastest]);
  }
  _plan = a.tried[fastest];  // with rank 0's measurement
  a.compiled.clear();
  a.shortlist.clear();
  a.runs_s.clear();
  a.decided = true;
  // Profiling was for the search: without it asked for, the plan runs unprofiled (compiling
  // is collective; every rank decides in the same run).
  if (!_config.executor.resolved().profile.value_or(false)) compile();
}

}  // namespace loom::examples
