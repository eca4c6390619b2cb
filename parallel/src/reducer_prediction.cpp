// Predicting a GradientReducer's step: profiled steps measured on the client's compute clock,
// each plan's step built as a StepProfile and simulated, the automatic plan agreed from rank 0.
#include "loom/reducer_prediction.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "loom/error.hpp"
#include "loom/step_planner.hpp"

namespace loom {

namespace {

[[noreturn]] void invalid(const std::string& message) {
  throw Error(ErrorCode::invalid_argument, message);
}

using Span = ClientTimeline::Span;

// The client's compute clock: time with the spans it spent applying updates or waiting for the
// reducer taken out.
class ComputeClock {
 public:
  explicit ComputeClock(std::vector<Span> stopped) {
    std::sort(stopped.begin(), stopped.end(),
              [](const Span& a, const Span& b) { return a.start_s < b.start_s; });
    for (const Span& s : stopped) {
      if (!(s.end_s > s.start_s)) continue;
      if (!_merged.empty() && s.start_s <= _merged.back().end_s)
        _merged.back().end_s = std::max(_merged.back().end_s, s.end_s);
      else
        _merged.push_back(s);
    }
  }
  double at(double t) const {
    double stopped = 0;
    for (const Span& s : _merged) {
      if (s.start_s >= t) break;
      stopped += std::min(s.end_s, t) - s.start_s;
    }
    return t - stopped;
  }

 private:
  std::vector<Span> _merged;
};

double union_length(std::vector<Span> spans) {
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.start_s < b.start_s; });
  double total = 0, start = 0, end = -1;
  for (const Span& s : spans) {
    if (!(s.end_s > s.start_s)) continue;
    if (s.start_s > end) {
      if (end > start) total += end - start;
      start = s.start_s;
      end = s.end_s;
    } else {
      end = std::max(end, s.end_s);
    }
  }
  if (end > start) total += end - start;
  return total;
}

// Least squares of y on the features of each row (at most 3), by the normal equations.
std::optional<std::array<double, 3>> least_squares(const std::vector<std::array<double, 3>>& x,
                                                   const std::vector<double>& y,
                                                   std::size_t features) {
  double m[3][4] = {};
  for (std::size_t r = 0; r < x.size(); ++r)
    for (std::size_t i = 0; i < features; ++i) {
      for (std::size_t j = 0; j < features; ++j) m[i][j] += x[r][i] * x[r][j];
      m[i][3] += x[r][i] * y[r];
    }
  for (std::size_t c = 0; c < features; ++c) {
    std::size_t pivot = c;
    for (std::size_t r = c + 1; r < features; ++r)
      if (std::abs(m[r][c]) > std::abs(m[pivot][c])) pivot = r;
    if (std::abs(m[pivot][c]) < 1e-12 * std::max(1.0, std::abs(m[c][c]))) return std::nullopt;
    for (std::size_t j = 0; j < 4; ++j) std::swap(m[c][j], m[pivot][j]);
    for (std::size_t r = 0; r < features; ++r) {
      if (r == c) continue;
      const double f = m[r][c] / m[c][c];
      for (std::size_t j = c; j < 4; ++j) m[r][j] -= f * m[c][j];
    }
  }
  std::array<double, 3> out{};
  for (std::size_t i = 0; i < features; ++i) out[i] = m[i][3] / m[i][i];
  return out;
}

// cost = a + b x + c y over samples (x, y, seconds): the fullest model whose coefficients are
// all >= 0 (a fixed cost per call, per tensor, per element), else proportional to x + y, else
// the mean.
LinearCost fit_cost(const std::vector<std::array<double, 3>>& samples) {
  LinearCost cost;
  if (samples.empty()) return cost;
  std::vector<double> y;
  for (const auto& s : samples) y.push_back(s[2]);
  const auto rows = [&](auto make) {
    std::vector<std::array<double, 3>> x;
    for (const auto& s : samples) x.push_back(make(s));
    return x;
  };
  const auto nonnegative = [](const std::array<double, 3>& c, std::size_t k) {
    for (std::size_t i = 0; i < k; ++i)
      if (!(c[i] >= 0)) return false;
    return true;
  };
  if (auto c = least_squares(rows([](const auto& s) {
                               return std::array<double, 3>{1, s[0], s[1]};
                             }),
                             y, 3);
      c && nonnegative(*c, 3))
    return {(*c)[0], (*c)[1], (*c)[2]};
  if (auto c = least_squares(rows([](const auto& s) {
                               return std::array<double, 3>{1, s[1], 0};
                             }),
                             y, 2);
      c && nonnegative(*c, 2))
    return {(*c)[0], 0, (*c)[1]};
  if (auto c = least_squares(rows([](const auto& s) {
                               return std::array<double, 3>{1, s[0], 0};
                             }),
                             y, 2);
      c && nonnegative(*c, 2))
    return {(*c)[0], (*c)[1], 0};
  double sum = 0;
  for (double v : y) sum += v;
  cost.a = sum / static_cast<double>(y.size());
  return cost;
}

double seconds(std::int64_t ns) {
  return static_cast<double>(ns) * 1e-9;
}

std::vector<std::string> module_names(const ClientTimeline& t) {
  std::vector<std::string> out;
  for (const auto& m : t.forward) out.push_back(m.module);
  return out;
}

std::vector<GradientSpec> gradient_specs(const GradientReducer& reducer) {
  std::vector<GradientSpec> specs;
  for (std::size_t p = 0; p < reducer.num_parameters(); ++p) {
    const ParameterSpec& s = reducer.parameter(p);
    specs.push_back({s.name, s.count, s.dtype, Device::cpu(), {}});
  }
  return specs;
}

std::unique_ptr<Bucketer> make_bucketer(const GradientReducer& reducer, const ReducerPlan& plan) {
  if (plan.bucket_cap_bytes == 0 || plan.first_bucket_bytes == 0)
    invalid("predict_reducer_step: bucket_cap_bytes and first_bucket_bytes must be > 0 (" +
            describe(plan) + ")");
  BucketerOptions options;
  options.cap_bytes = plan.bucket_cap_bytes;
  options.first_bucket_bytes = plan.first_bucket_bytes;
  options.split_large = plan.partition_large;
  options.compression = plan.compression;
  options.average = false;
  auto bucketer = std::make_unique<Bucketer>(gradient_specs(reducer), options);
  if (!plan.ready_order.empty()) bucketer->rebuild(plan.ready_order);
  return bucketer;
}

std::vector<ParameterSpec> parameters_of(const GradientReducer& reducer) {
  std::vector<ParameterSpec> out;
  for (std::size_t p = 0; p < reducer.num_parameters(); ++p) out.push_back(reducer.parameter(p));
  return out;
}

// A plan's step as the simulator reads it, and the collectives' issue order (node ids).
struct BuiltStep {
  StepProfile profile;
  std::vector<std::size_t> issue;  // node ids
  std::size_t buckets = 0;
  double backward_s = 0, forward_s = 0, other_s = 0, update_s = 0, busy_s = 0;
};

BuiltStep build_step(const GradientReducer& reducer, const ReducerMeasurements& m,
                     const ReducerPlan& plan, Bucketer& bucketer) {
  const std::size_t n = reducer.num_parameters();
  if (m.ready_s.size() != n)
    invalid("predict_reducer_step: the measurements hold " + std::to_string(m.ready_s.size()) +
            " gradients for a reducer of " + std::to_string(n));
  const std::vector<ParameterSpec> parameters = parameters_of(reducer);
  // Priorities on the client's one thread: the forward goes on unless a module needs an
  // update (the pre-hooks apply only their own), updates go before more backward (the
  // gradient hooks apply whatever landed); the casts run on loom's workers as soon as ready.
  constexpr int client_priority = 0, update_priority = 1, forward_priority = 2, cast_priority = 3;

  Graph g;
  std::vector<Task> grads;
  for (const ParameterSpec& p : parameters)
    grads.push_back(g.external("grad." + p.name, {.group = p.module}));
  std::vector<std::size_t> by_ready(n);
  std::iota(by_ready.begin(), by_ready.end(), 0);
  std::stable_sort(by_ready.begin(), by_ready.end(),
                   [&](std::size_t a, std::size_t b) { return m.ready_s[a] < m.ready_s[b]; });
  for (std::size_t k = 1; k < n; ++k) g.add_edge(grads[by_ready[k - 1]], grads[by_ready[k]]);

  AttachOptions attach;
  attach.order = BucketOrder::bucket;
  attach.issue_order = planned_issue_order(bucketer.buckets(), parameters, plan);
  // The graph is only read (profile_step): its nodes, which would use the buckets' memory,
  // never run.
  std::vector<BucketTasks> buckets = bucketer.attach(g, grads, std::max(1, m.ranks), attach);
  const UpdateGroups groups = make_update_groups(bucketer, attach.issue_order);

  const Task after_backward = g.compute("client.after_backward", [] {});
  g.add_edge(grads[by_ready.back()], after_backward);
  std::vector<std::int32_t> usage(n, 0);
  Task usage_reduce;
  if (plan.track_usage) {
    usage_reduce = g.allreduce("usage.allreduce", Buffer::of(std::span(usage)), ReduceOp::sum,
                               {.group = "usage"});
    g.add_edge(grads[by_ready.back()], usage_reduce);
  }
  std::vector<Task> updates;
  std::vector<double> update_cost;
  for (std::size_t k = 0; k < groups.parameters.size(); ++k) {
    const std::string bucket = "bucket" + std::to_string(groups.buckets[k].back());
    Task u = g.external(bucket + ".update", {.group = bucket});
    for (std::size_t b : groups.buckets[k]) buckets[b].done().precede(u);
    if (usage_reduce.valid()) usage_reduce.precede(u);
    double elements = 0;
    for (std::size_t p : groups.parameters[k]) elements += static_cast<double>(parameters[p].count);
    update_cost.push_back(
        std::max(0.0, m.update.at(static_cast<double>(groups.parameters[k].size()), elements)));
    updates.push_back(u);
  }
  Task previous = after_backward;
  std::vector<Task> forward;
  for (std::size_t j = 0; j < m.forward.size(); ++j) {
    const ForwardPart& part = m.forward[j];
    Task f = g.compute("forward." + std::to_string(j) + "." +
                           (part.module.empty() ? std::string("(model)") : part.module),
                       [] {});
    g.add_edge(previous, f);
    std::vector<char> needed(updates.size(), 0);
    for (std::size_t p : part.parameters) {
      if (p >= n)
        invalid("predict_reducer_step: forward module '" + part.module + "' names parameter #" +
                std::to_string(p) + " of " + std::to_string(n));
      needed[groups.group_of[p]] = 1;
    }
    for (std::size_t k = 0; k < updates.size(); ++k)
      if (needed[k]) g.add_edge(updates[k], f);
    forward.push_back(f);
    previous = f;
  }
  const Task after_forward = g.compute("client.after_forward", [] {});
  g.add_edge(previous, after_forward);
  for (const Task& u : updates) g.add_edge(u, after_forward);

  BuiltStep out;
  out.buckets = bucketer.buckets().size();
  out.profile = profile_step(g, {});
  out.profile.ranks = std::max(1, m.ranks);
  out.profile.workers = 1;
  out.profile.collectives_in_flight = plan.collectives_in_flight;
  out.profile.label = "GradientReducer step, " + describe(plan);
  std::vector<ProfiledNode>& nodes = out.profile.nodes;
  auto set = [&](const Task& t, double duration, int priority) {
    ProfiledNode& node = nodes[t.id()];
    node.kind = NodeKind::compute;
    node.duration_s = std::max(0.0, duration);
    node.priority = priority;
    out.busy_s += node.duration_s;
  };
  double before = 0;
  for (std::size_t p : by_ready) {
    set(grads[p], m.ready_s[p] - before, client_priority);
    out.backward_s += nodes[grads[p].id()].duration_s;
    before = std::max(before, m.ready_s[p]);
  }
  set(after_backward, m.after_backward_s, client_priority);
  set(after_forward, m.after_forward_s, client_priority);
  out.other_s = m.after_backward_s + m.after_forward_s;
  for (std::size_t j = 0; j < forward.size(); ++j) {
    set(forward[j], m.forward[j].duration_s, forward_priority);
    out.forward_s += m.forward[j].duration_s;
  }
  for (std::size_t k = 0; k < updates.size(); ++k) {
    set(updates[k], update_cost[k], update_priority);
    out.update_s += update_cost[k];
  }
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const double bytes = static_cast<double>(bucketer.buckets()[b].bytes());
    if (buckets[b].pack.valid()) set(buckets[b].pack, m.pack.at(bytes), cast_priority);
    if (buckets[b].unpack.valid()) set(buckets[b].unpack, m.unpack.at(bytes), cast_priority);
  }
  for (std::size_t b : attach.issue_order) out.issue.push_back(buckets[b].reduce.id());
  if (usage_reduce.valid()) out.issue.push_back(usage_reduce.id());
  return out;
}

NetworkModel network_of(const ReducerMeasurements& m) {
  if (m.ranks > 1 && m.link_bits_per_s > 0)
    return NetworkModel::from_link(m.link_bits_per_s, m.latency_s);
  return NetworkModel(default_tuning());
}

ReducerPrediction simulate_step(const ReducerMeasurements& m, const ReducerPlan& plan,
                                BuiltStep step) {
  const NetworkModel network = network_of(m);
  SimulationOptions options;
  options.ranks = std::max(1, m.ranks);
  options.workers = 1;
  options.collectives_in_flight = plan.collectives_in_flight;
  options.issue_order = step.issue;
  ReducerPrediction out;
  out.simulated = simulate(step.profile, network, options);
  out.plan = plan;
  out.buckets = step.buckets;
  out.step_s = out.simulated.step_s;
  out.measured_step_s = m.step_s;
  out.backward_s = step.backward_s;
  out.forward_s = step.forward_s;
  out.other_s = step.other_s;
  out.update_s = step.update_s;
  for (std::size_t id : step.issue) {
    const ProfiledNode& node = step.profile.nodes[id];
    out.wire_s += network.collective(node.op, node.bytes, options.ranks).seconds;
  }
  out.comm_s = out.simulated.comm_s;
  out.exposed_s = out.simulated.exposed_s;
  out.wait_s = std::max(0.0, out.step_s - step.busy_s);
  out.link_bits_per_s = m.ranks > 1 ? 8.0 / network.tuning().cost.beta_s_per_byte : 0;
  out.profile = std::move(step.profile);
  return out;
}

// A plan as rank 0 sends it: the fields a search varies (its orders and compression are the
// reducer's own, the same on every rank).
constexpr std::size_t plan_fields = 6;

void encode_plan(const ReducerPlan& plan, std::vector<std::int64_t>& out) {
  out.push_back(static_cast<std::int64_t>(plan.bucket_cap_bytes));
  out.push_back(static_cast<std::int64_t>(plan.first_bucket_bytes));
  out.push_back(plan.partition_large ? 1 : 0);
  out.push_back(static_cast<std::int64_t>(plan.collectives_in_flight));
  out.push_back(static_cast<std::int64_t>(plan.priority));
  out.push_back(std::bit_cast<std::int64_t>(plan.wire_ratio));
}

// The reducer's plan with the fields at `at` (plan_fields of them).
ReducerPlan decode_plan(const GradientReducer& reducer, const std::int64_t* at) {
  ReducerPlan plan = reducer.plan();
  plan.bucket_cap_bytes = static_cast<std::size_t>(at[0]);
  plan.first_bucket_bytes = static_cast<std::size_t>(at[1]);
  plan.partition_large = at[2] != 0;
  plan.collectives_in_flight = static_cast<std::size_t>(at[3]);
  plan.priority = static_cast<IssuePriority>(at[4]);
  plan.wire_ratio = std::bit_cast<double>(at[5]);
  plan.issue_order.clear();
  return plan;
}

bool same_plan(const ReducerPlan& a, const ReducerPlan& b) {
  return a.bucket_cap_bytes == b.bucket_cap_bytes && a.first_bucket_bytes == b.first_bucket_bytes &&
         a.partition_large == b.partition_large &&
         a.collectives_in_flight == b.collectives_in_flight && a.priority == b.priority &&
         (a.priority != IssuePriority::forward || a.wire_ratio == b.wire_ratio) &&
         a.issue_order == b.issue_order;
}

std::chrono::nanoseconds agreement_limit(const GradientReducer& reducer) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(*reducer.executor_options().timeout);
}

}  // namespace

ReducerMeasurements measure_reducer_steps(const GradientReducer& reducer,
                                          std::span<const ReducerStepRecord> steps,
                                          double latency_s) {
  const std::size_t n = reducer.num_parameters();
  if (steps.empty())
    invalid(
        "measure_reducer_steps: no profiled step (a step is recorded once the next one "
        "begins; profiling must be on: ExecutorOptions::profile or LOOM_TRACE)");
  if (!(latency_s >= 0)) invalid("measure_reducer_steps: latency_s must be >= 0");
  const std::vector<std::string> reference = module_names(steps.back().client);
  if (reference.empty())
    invalid(
        "measure_reducer_steps: the last recorded step has no forward (no forward ran "
        "between its backward and the next one)");
  std::map<std::string, std::size_t, std::less<>> index;
  for (std::size_t p = 0; p < n; ++p) index["grad." + reducer.parameter(p).name] = p;

  ReducerMeasurements m;
  m.ranks = reducer.backend().world_size();
  m.latency_s = latency_s;
  m.ready_s.assign(n, 0);
  m.forward.resize(reference.size());
  for (std::size_t j = 0; j < reference.size(); ++j) {
    m.forward[j].module = reference[j];
    m.forward[j].parameters = steps.back().client.forward[j].parameters;
  }
  // Steps whose period is over twice the median had something else between them and the next
  // step (an evaluation, a checkpoint, another model's steps): left out.
  std::vector<double> periods;
  for (const ReducerStepRecord& step : steps)
    if (module_names(step.client) == reference) periods.push_back(step.client.end_s);
  std::nth_element(periods.begin(),
                   periods.begin() + static_cast<std::ptrdiff_t>(periods.size() / 2),
                   periods.end());
  const double longest = 2 * periods[periods.size() / 2];
  std::vector<std::array<double, 3>> update_samples;
  double pack_s = 0, unpack_s = 0, pack_bytes = 0, unpack_bytes = 0;
  std::size_t used = 0;
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const ReducerStepRecord& step = steps[s];
    const ClientTimeline& t = step.client;
    const std::string which =
        "measure_reducer_steps: step #" + std::to_string(s) + " of " + std::to_string(steps.size());
    if (module_names(t) != reference) continue;  // another forward (evaluation, a changed model)
    if (t.end_s > longest) continue;
    if (step.run.empty())
      invalid(which +
              " has no profiled run (profiling is off: ExecutorOptions::profile or "
              "LOOM_TRACE)");
    if (!(t.end_s > 0)) invalid(which + " has no end (end_s " + std::to_string(t.end_s) + ")");
    std::vector<Span> stopped;
    for (const auto& [k, span] : t.updates) {
      if (k >= reducer.num_update_groups())
        invalid(which + " applied update group #" + std::to_string(k) + " of " +
                std::to_string(reducer.num_update_groups()) +
                " (was it recorded before a replan?)");
      stopped.push_back(span);
      double elements = 0;
      const std::vector<std::size_t>& group = reducer.update_group(k);
      for (std::size_t p : group) elements += static_cast<double>(reducer.parameter(p).count);
      update_samples.push_back(
          {static_cast<double>(group.size()), elements, std::max(0.0, span.end_s - span.start_s)});
      m.update_s += span.end_s - span.start_s;
    }
    for (const Span& w : t.waits) {
      stopped.push_back(w);
      m.wait_s += std::max(0.0, w.end_s - w.start_s);
    }
    const ComputeClock clock(stopped);

    std::vector<double> arrival(n, -1);
    std::vector<Span> comm;
    for (const NodeTiming& timing : step.run) {
      if (timing.kind == NodeKind::collective) {
        comm.push_back({seconds(timing.start_ns), seconds(timing.end_ns)});
        continue;
      }
      const bool is_pack = timing.name.ends_with(".pack");
      if (is_pack || timing.name.ends_with(".unpack")) {
        // "bucket<b>.pack": the reducer's own names.
        const std::size_t dot = timing.name.find('.');
        std::size_t b = reducer.buckets().size();
        try {
          b = std::stoul(timing.name.substr(6, dot - 6));
        } catch (const std::exception&) {
        }
        if (b < reducer.buckets().size()) {
          const double bytes = static_cast<double>(reducer.buckets()[b].bytes());
          (is_pack ? pack_s : unpack_s) += seconds(timing.end_ns - timing.start_ns);
          (is_pack ? pack_bytes : unpack_bytes) += bytes;
        }
        continue;
      }
      if (auto it = index.find(timing.name); it != index.end())
        arrival[it->second] = seconds(timing.end_ns);
    }
    if (!step.handed_over_s.empty()) {
      if (step.handed_over_s.size() != n)
        invalid(which + " has " + std::to_string(step.handed_over_s.size()) +
                " hand-over times for " + std::to_string(n) + " parameters");
      arrival = step.handed_over_s;
    }
    for (std::size_t p = 0; p < n; ++p)
      if (arrival[p] < 0)
        invalid(which + ": the gradient of '" + reducer.parameter(p).name +
                "' has no time in the run (was the step finished?)");
    double last = 0;
    for (std::size_t p = 0; p < n; ++p) {
      const double c = clock.at(arrival[p]);
      m.ready_s[p] += c;
      last = std::max(last, c);
    }
    const double forward_start = clock.at(t.forward.front().entered_s);
    m.after_backward_s += std::max(0.0, forward_start - last);
    for (std::size_t j = 0; j < t.forward.size(); ++j) {
      const double from = clock.at(t.forward[j].entered_s);
      const double to =
          clock.at(j + 1 < t.forward.size() ? t.forward[j + 1].entered_s : t.forward_end_s);
      m.forward[j].duration_s += std::max(0.0, to - from);
    }
    m.after_forward_s += std::max(0.0, clock.at(t.end_s) - clock.at(t.forward_end_s));
    m.step_s += t.end_s;
    m.comm_s += union_length(std::move(comm));
    ++used;
  }
  if (used == 0) invalid("measure_reducer_steps: no step has the last step's forward");
  const double k = static_cast<double>(used);
  for (double& r : m.ready_s) r /= k;
  for (ForwardPart& f : m.forward) f.duration_s /= k;
  m.after_backward_s /= k;
  m.after_forward_s /= k;
  m.step_s /= k;
  m.wait_s /= k;
  m.update_s /= k;
  m.comm_s /= k;
  m.steps = used;
  m.update = fit_cost(update_samples);
  if (pack_bytes > 0) m.pack.c = pack_s / pack_bytes;
  if (unpack_bytes > 0) m.unpack.c = unpack_s / unpack_bytes;

  // The wire: the running plan's collectives fitted to the communication measured.
  if (m.ranks > 1 && m.comm_s > 0) {
    const std::unique_ptr<Bucketer> bucketer = make_bucketer(reducer, reducer.plan());
    BuiltStep current = build_step(reducer, m, reducer.plan(), *bucketer);
    current.profile.measured_comm_s = m.comm_s;
    current.profile.measured_step_s = m.step_s;
    current.profile.measured_compute_s = std::max(0.0, m.step_s - m.wait_s);
    const NetworkModel fitted = NetworkModel::fitted(current.profile, latency_s);
    m.link_bits_per_s = 8.0 / fitted.tuning().cost.beta_s_per_byte;
  }
  return m;
}

ReducerPrediction predict_reducer_step(const GradientReducer& reducer,
                                       const ReducerMeasurements& measured,
                                       const ReducerPlan& plan) {
  const std::unique_ptr<Bucketer> bucketer = make_bucketer(reducer, plan);
  return simulate_step(measured, plan, build_step(reducer, measured, plan, *bucketer));
}

std::vector<ReducerPrediction> rank_plans(const GradientReducer& reducer,
                                          const ReducerMeasurements& measured,
                                          const PlanSearchSpace& space) {
  const ReducerPlan& base = reducer.plan();
  std::vector<ReducerPrediction> out;
  out.push_back(predict_reducer_step(reducer, measured, base));
  out.front().measured_step_s = measured.step_s;

  // IssuePriority::forward's model: the wire of every gradient over the backward.
  std::size_t largest = 0, total = 0;
  for (std::size_t p = 0; p < reducer.num_parameters(); ++p) {
    const ParameterSpec& s = reducer.parameter(p);
    largest = std::max(largest, s.count * dtype_size(s.dtype));
    total += s.count * dtype_size(s.dtype);
  }
  double backward = 0;
  for (double r : measured.ready_s) backward = std::max(backward, r);
  const double wire = network_of(measured)
                          .collective(Collective::allreduce, total, std::max(1, measured.ranks))
                          .seconds;
  const double wire_ratio = backward > 0 && wire > 0 ? wire / backward : 1.0;

  for (std::size_t cap : space.caps_bytes) {
    if (cap == 0) invalid("rank_plans: a bucket cap of 0 bytes");
    std::vector<std::size_t> firsts{cap};
    for (std::size_t f : space.first_bucket_bytes)
      if (f > 0 && f < cap) firsts.push_back(f);
    for (std::size_t first : firsts)
      for (bool partition : {false, true}) {
        // Partitioning changes nothing when no gradient exceeds the cap.
        if (partition && (!space.try_partition || largest <= cap)) continue;
        ReducerPlan shape = base;
        shape.bucket_cap_bytes = cap;
        shape.first_bucket_bytes = first;
        shape.partition_large = partition;
        shape.issue_order.clear();
        const std::unique_ptr<Bucketer> bucketer = make_bucketer(reducer, shape);
        for (std::size_t in_flight = 0; in_flight <= space.max_in_flight; ++in_flight)
          for (IssuePriority priority : {IssuePriority::ready, IssuePriority::forward}) {
            if (priority == IssuePriority::forward &&
                (in_flight == 0 || !space.try_forward_priority))
              continue;
            ReducerPlan plan = shape;
            plan.collectives_in_flight = in_flight;
            plan.priority = priority;
            plan.wire_ratio = priority == IssuePriority::forward ? wire_ratio : base.wire_ratio;
            out.push_back(
                simulate_step(measured, plan, build_step(reducer, measured, plan, *bucketer)));
          }
      }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const ReducerPrediction& a, const ReducerPrediction& b) {
                     return a.step_s < b.step_s * (1 - 1e-9);
                   });
  return out;
}

namespace {

// What rank 0 predicts from the profiled steps, on every rank: rank 0 measures the steps,
// ranks the plans and predicts the running one, and `encode` turns that into the values every
// rank receives (Backend::agree_on_root, `name`, within agreement_limit). `valid` checks their
// shape on every rank; where rank 0 failed, it rethrows its own error and the other ranks get
// invalid_argument naming `who` (the plan is left unchanged everywhere).
std::vector<std::int64_t> predicted_on_rank_zero(
    GradientReducer& reducer, std::span<const ReducerStepRecord> steps,
    const PlanSearchSpace& space, std::string_view name, std::string_view who,
    const std::function<void(const ReducerMeasurements&, const std::vector<ReducerPrediction>&,
                             const ReducerPrediction&, std::vector<std::int64_t>&)>& encode,
    const std::function<bool(const std::vector<std::int64_t>&)>& valid) {
  Backend& backend = reducer.backend();
  const std::string who_here = std::string(who) + " on rank " + std::to_string(backend.rank());
  std::vector<std::int64_t> mine;  // empty elsewhere and on rank 0's failure
  std::optional<Error> failure;
  if (backend.rank() == 0) {
    try {
      const ReducerMeasurements measured = measure_reducer_steps(reducer, steps);
      const std::vector<ReducerPrediction> ranked = rank_plans(reducer, measured, space);
      const ReducerPrediction current = predict_reducer_step(reducer, measured, reducer.plan());
      encode(measured, ranked, current, mine);
    } catch (const Error& e) {
      failure = e;
      mine.clear();
    }
  }
  std::vector<std::int64_t> zero =
      backend.agree_on_root(name, mine, agreement_limit(reducer), [&] { return who_here; });
  if (!valid(zero)) {
    if (failure) throw *failure;
    invalid(who_here +
            ": rank 0 could not predict the plans (its error says why); the plan is unchanged");
  }
  return zero;
}

}  // namespace

AutomaticPlan plan_automatically(GradientReducer& reducer, std::span<const ReducerStepRecord> steps,
                                 const PlanSearchSpace& space) {
  if (reducer.in_step()) invalid("plan_automatically: a step is in progress (finish() it first)");
  // The plan, the candidates' count, three predictions and whether the plan changes.
  const std::vector<std::int64_t> zero = predicted_on_rank_zero(
      reducer, steps, space, "GradientReducer::plan_automatically", "plan_automatically",
      [](const ReducerMeasurements& measured, const std::vector<ReducerPrediction>& ranked,
         const ReducerPrediction& running, std::vector<std::int64_t>& out) {
        const double current = running.step_s;
        // A plan replaces the running one only if it is predicted faster by more than the
        // prediction misses the running plan's measured step.
        const double doubt = std::abs(current - measured.step_s);
        const bool change = ranked.front().step_s < current - doubt;
        encode_plan(change ? ranked.front().plan : running.plan, out);
        out.push_back(static_cast<std::int64_t>(ranked.size()));
        out.push_back(std::bit_cast<std::int64_t>(change ? ranked.front().step_s : current));
        out.push_back(std::bit_cast<std::int64_t>(current));
        out.push_back(std::bit_cast<std::int64_t>(measured.step_s));
        out.push_back(change ? 1 : 0);
      },
      [](const std::vector<std::int64_t>& zero) { return zero.size() == plan_fields + 5; });
  const ReducerPlan plan = decode_plan(reducer, zero.data());
  const std::int64_t* tail = zero.data() + plan_fields;
  AutomaticPlan chosen;
  chosen.candidates = static_cast<std::size_t>(tail[0]);
  chosen.predicted_step_s = std::bit_cast<double>(tail[1]);
  chosen.current_predicted_step_s = std::bit_cast<double>(tail[2]);
  chosen.measured_step_s = std::bit_cast<double>(tail[3]);
  chosen.changed = tail[4] != 0;
  if (chosen.changed) reducer.replan(plan);
  chosen.plan = reducer.plan();
  return chosen;
}

ReducerShortlist shortlist_reducer_plans(GradientReducer& reducer,
                                         std::span<const ReducerStepRecord> steps,
                                         const PlanSearchSpace& space, std::size_t keep) {
  if (keep == 0) invalid("shortlist_reducer_plans: keep must be at least 1 (the running plan)");
  if (!(space.shortlist_margin >= 1.0) || !std::isfinite(space.shortlist_margin))
    invalid("shortlist_reducer_plans: shortlist_margin must be a finite factor >= 1, not " +
            std::to_string(space.shortlist_margin));
  const double margin = space.shortlist_margin;
  if (reducer.in_step())
    invalid("shortlist_reducer_plans: a step is in progress (finish() it first)");
  constexpr std::size_t per_plan = plan_fields + 1;
  // Rank 0's candidates' count, the running plan's measured step, then per plan its fields and
  // its prediction.
  const std::vector<std::int64_t> zero = predicted_on_rank_zero(
      reducer, steps, space, "GradientReducer::shortlist_plans", "shortlist_reducer_plans",
      [keep, margin](const ReducerMeasurements& measured,
                     const std::vector<ReducerPrediction>& ranked,
                     const ReducerPrediction& current, std::vector<std::int64_t>& out) {
        std::vector<const ReducerPrediction*> picked{&current};
        for (const ReducerPrediction& p : ranked) {
          if (picked.size() >= keep || !(p.step_s < current.step_s * margin)) break;
          const bool twin = std::any_of(picked.begin(), picked.end(), [&](const auto* q) {
            return same_plan(q->plan, p.plan) ||
                   (q->buckets == p.buckets && std::abs(q->step_s - p.step_s) <= 1e-9 * q->step_s);
          });
          if (!twin) picked.push_back(&p);
        }
        out.push_back(static_cast<std::int64_t>(ranked.size()));
        out.push_back(std::bit_cast<std::int64_t>(measured.step_s));
        for (const ReducerPrediction* p : picked) {
          encode_plan(p->plan, out);
          out.push_back(std::bit_cast<std::int64_t>(p->step_s));
        }
      },
      [](const std::vector<std::int64_t>& zero) {
        return zero.size() >= 2 + per_plan && (zero.size() - 2) % per_plan == 0;
      });
  ReducerShortlist out;
  out.candidates = static_cast<std::size_t>(zero[0]);
  out.measured_step_s = std::bit_cast<double>(zero[1]);
  for (std::size_t at = 2; at < zero.size(); at += per_plan) {
    TimedPlan t;
    t.plan = decode_plan(reducer, zero.data() + at);
    t.predicted_step_s = std::bit_cast<double>(zero[at + plan_fields]);
    out.plans.push_back(std::move(t));
  }
  // The running plan keeps its own orders (a planned issue order is not sent).
  out.plans.front().plan = reducer.plan();
  return out;
}

AutomaticPlan decide_reducer_plan(GradientReducer& reducer, const ReducerShortlist& shortlist,
                                  std::span<const double> measured_s) {
  Backend& backend = reducer.backend();
  const std::string who = "decide_reducer_plan on rank " + std::to_string(backend.rank());
  if (reducer.in_step()) invalid(who + ": a step is in progress (finish() it first)");
  if (shortlist.plans.empty()) invalid(who + ": an empty shortlist");
  if (measured_s.size() != shortlist.plans.size())
    invalid(who + ": " + std::to_string(measured_s.size()) + " measurements for " +
            std::to_string(shortlist.plans.size()) + " shortlisted plans");
  std::vector<std::int64_t> mine;
  for (double v : measured_s) {
    if (!std::isfinite(v) || v < 0)
      invalid(who + ": a plan's measured step is " + std::to_string(v) + " s");
    mine.push_back(std::bit_cast<std::int64_t>(v));
  }
  const std::vector<std::int64_t> zero = backend.agree_on_root(
      "GradientReducer::decide_plan", mine, agreement_limit(reducer),
      [&] { return "decide_reducer_plan on rank " + std::to_string(backend.rank()); },
      /*same_length=*/true);
  AutomaticPlan chosen;
  chosen.candidates = shortlist.candidates;
  chosen.measured_step_s = shortlist.measured_step_s;
  chosen.current_predicted_step_s = shortlist.plans.front().predicted_step_s;
  std::vector<double> agreed;
  for (std::size_t k = 0; k < zero.size(); ++k) {
    TimedPlan t = shortlist.plans[k];
    t.measured_step_s = std::bit_cast<double>(zero[k]);
    agreed.push_back(t.measured_step_s);
    chosen.timed.push_back(std::move(t));
  }
  const std::size_t fastest = PlanTrials::fastest(agreed);
  const TimedPlan& best = chosen.timed[fastest];
  chosen.predicted_step_s = best.predicted_step_s;
  chosen.changed = fastest != 0;  // the replaced plan is the shortlist's first
  if (!same_plan(best.plan, reducer.plan())) reducer.replan(best.plan);
  chosen.plan = reducer.plan();
  return chosen;
}

}  // namespace loom
