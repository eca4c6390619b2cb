// Predicting a GradientReducer's step: a plan's step built from the measurements as a
// StepProfile (the client's compute as one chain, the plan's buckets in its issue order, an
// update node per update group) and simulated on the fitted wire; every plan of a search ranked.
#include "loom/reducer_prediction.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <string>

#include "bytes_text.hpp"
#include "invalid_argument.hpp"
#include "loom/network_model.hpp"
#include "loom/pinned_pool.hpp"
#include "loom/step_simulator.hpp"
#include "reducer_step_model.hpp"

namespace loom {

namespace {

std::vector<ParameterSpec> parameters_of(const GradientReducer& reducer) {
  std::vector<ParameterSpec> out;
  for (std::size_t p = 0; p < reducer.num_parameters(); ++p) out.push_back(reducer.parameter(p));
  return out;
}

std::size_t pages(std::size_t bytes) {
  constexpr std::size_t page = 4096;
  return (bytes + page - 1) / page * page;
}

// `plan`'s memory over `buckets` (its bucketing, padded when sharded): the gradients' memory
// counting the buckets for which `resident` holds.
PlanMemory memory_of(const GradientReducer& reducer, const ReducerPlan& plan,
                     const PlanSearch& search, const std::vector<Bucket>& buckets,
                     const std::vector<char>& resident) {
  const bool sharded = plan.shard != ShardLevel::none;
  const std::size_t world = static_cast<std::size_t>(std::max(1, reducer.backend().world_size()));
  PlanMemory m;
  std::map<DType, std::size_t> arena;  // per dtype: the buckets' bytes (padded when sharded)
  std::size_t elements = 0, shard_bytes = 0, resident_bytes = 0, wires = 0;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const Bucket& bucket = buckets[b];
    const std::size_t bytes = bucket.padded_count * dtype_size(bucket.dtype);
    arena[bucket.dtype] += bytes;
    if (resident.empty() || resident[b]) resident_bytes += bytes;
    shard_bytes += bytes / world;
    elements += sharded ? bucket.padded_count / world : bucket.count;
    if (plan.compression != Compression::none)  // the 16-bit wire, from the pool
      wires += PinnedPool::size_class(bucket.padded_count * 2);
  }
  std::size_t parameter_bytes = 0;
  for (std::size_t p = 0; p < reducer.num_parameters(); ++p)
    parameter_bytes += reducer.parameter(p).count * dtype_size(reducer.parameter(p).dtype);
  if (!sharded) {
    m.parameters = parameter_bytes;  // the model's own memory
    for (const auto& [dtype, bytes] : arena) m.gradients += PinnedPool::size_class(bytes);
  } else {
    for (const auto& [dtype, bytes] : arena) m.parameters += pages(bytes);
    m.gradients = plan.shard == ShardLevel::gradients ? pages(resident_bytes) : m.parameters;
    m.shards = pages(shard_bytes);  // (gradients: the averages' shard is also the gather's)
  }
  m.gradients += wires;
  m.optimizer_state =
      static_cast<std::size_t>(search.state_bytes_per_element * static_cast<double>(elements));
  m.activations = search.activation_bytes;
  return m;
}

}  // namespace

std::string describe(const PlanMemory& memory) {
  std::string s = "parameters " + bytes_text(memory.parameters) + " + gradients " +
                  bytes_text(memory.gradients);
  if (memory.shards) s += " + shards " + bytes_text(memory.shards);
  s += " + optimizer state " + bytes_text(memory.optimizer_state);
  if (memory.activations) s += " + activations " + bytes_text(memory.activations);
  return s + " = " + bytes_text(memory.total());
}

PlanMemory plan_memory(const GradientReducer& reducer, const ReducerPlan& plan,
                       const PlanSearch& search) {
  const std::unique_ptr<Bucketer> bucketer = detail::make_reducer_bucketer(reducer, plan);
  return memory_of(reducer, plan, search, bucketer->buckets(), {});
}

namespace detail {

std::unique_ptr<Bucketer> make_reducer_bucketer(const GradientReducer& reducer,
                                                const ReducerPlan& plan) {
  if (plan.bucket_cap_bytes == 0 || plan.first_bucket_bytes == 0)
    throw_invalid_argument(
        "predict_reducer_step: bucket_cap_bytes and first_bucket_bytes must be > 0 (" +
        describe(plan) + ")");
  BucketerOptions options;
  options.bucket_cap_bytes = plan.bucket_cap_bytes;
  options.first_bucket_bytes = plan.first_bucket_bytes;
  options.partition_large = plan.partition_large;
  options.compression = plan.compression;
  options.average = false;
  if (plan.shard != ShardLevel::none)
    options.shard_multiple = static_cast<std::size_t>(std::max(1, reducer.backend().world_size()));
  auto bucketer = std::make_unique<Bucketer>(parameters_of(reducer), options);
  if (!plan.ready_order.empty()) bucketer->rebuild(plan.ready_order);
  return bucketer;
}

BuiltStep build_reducer_step(const GradientReducer& reducer, const ReducerMeasurements& m,
                             const ReducerPlan& plan, Bucketer& bucketer) {
  const std::size_t n = reducer.num_parameters();
  if (m.ready_s.size() != n)
    throw_invalid_argument("predict_reducer_step: the measurements hold " +
                           std::to_string(m.ready_s.size()) + " gradients for a reducer of " +
                           std::to_string(n));
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
  // never run. A sharded plan's reduce-scatters and all-gathers are made from its nodes in
  // the profile below (op and bytes), as the reducer's graph has them.
  const bool sharded = plan.shard != ShardLevel::none;
  const int world = std::max(1, m.ranks);
  std::vector<BucketTasks> buckets = bucketer.attach(g, grads, world, attach);
  const UpdateGroups groups = sharded ? make_shard_groups(bucketer, attach.issue_order)
                                      : make_update_groups(bucketer, attach.issue_order);

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
    if (sharded) elements /= world;  // this rank's shard
    update_cost.push_back(
        std::max(0.0, m.update.at(static_cast<double>(groups.parameters[k].size()), elements)));
    updates.push_back(u);
  }
  // Sharded: each group's all-gathers after its update, group by group in the forward's order;
  // a module waits for its group's gathers instead of its update.
  std::vector<std::vector<Task>> gathers(updates.size());
  std::vector<std::size_t> gather_sequence;
  if (sharded) {
    gather_sequence = shard_gather_order(bucketer.buckets(), groups.buckets, plan.forward_order, n);
    for (std::size_t k : gather_sequence)
      for (std::size_t b : groups.buckets[k]) {
        Task gather = g.compute("bucket" + std::to_string(b) + ".allgather", [] {});
        updates[k].precede(gather);
        gathers[k].push_back(gather);
      }
  }
  const auto ready_for_forward = [&](std::size_t k) {
    return sharded ? gathers[k] : std::vector<Task>{updates[k]};
  };
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
        throw_invalid_argument("predict_reducer_step: forward module '" + part.module +
                               "' names parameter #" + std::to_string(p) + " of " +
                               std::to_string(n));
      needed[groups.group_of[p]] = 1;
    }
    for (std::size_t k = 0; k < updates.size(); ++k)
      if (needed[k])
        for (const Task& t : ready_for_forward(k)) g.add_edge(t, f);
    forward.push_back(f);
    previous = f;
  }
  const Task after_forward = g.compute("client.after_forward", [] {});
  g.add_edge(previous, after_forward);
  for (std::size_t k = 0; k < updates.size(); ++k)
    for (const Task& t : ready_for_forward(k)) g.add_edge(t, after_forward);

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
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const Bucket& bucket = bucketer.buckets()[b];
    std::vector<std::size_t> handed;
    for (const BucketPiece& piece : bucket.pieces) handed.push_back(grads[piece.gradient].id());
    out.bucket_gradients.push_back(std::move(handed));
    out.bucket_reduce.push_back(buckets[b].done().id());
    out.bucket_bytes.push_back(bucket.padded_count * dtype_size(bucket.dtype));
  }
  if (sharded) {
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const Bucket& bucket = bucketer.buckets()[b];
      ProfiledNode& reduce = nodes[buckets[b].reduce.id()];
      // The whole padded bucket is reduced (scattered) on the wire.
      reduce.bytes = reduce.bytes / bucket.count * bucket.padded_count;
      reduce.op = Collective::reduce_scatter;
    }
    for (std::size_t k : gather_sequence)
      for (std::size_t j = 0; j < gathers[k].size(); ++j) {
        const Bucket& bucket = bucketer.buckets()[groups.buckets[k][j]];
        ProfiledNode& gather = nodes[gathers[k][j].id()];
        gather.kind = NodeKind::collective;
        gather.op = Collective::allgather;
        gather.bytes = bucket.padded_count * dtype_size(bucket.dtype);
        gather.duration_s = 0;
        out.issue.push_back(gathers[k][j].id());
      }
  }
  return out;
}

}  // namespace detail

namespace {

using detail::BuiltStep;

NetworkModel network_of(const ReducerMeasurements& m) {
  if (m.ranks > 1 && m.link_bits_per_s > 0)
    return NetworkModel::from_link(m.link_bits_per_s, m.latency_s);
  return NetworkModel(default_tuning());
}

// The gradient buckets resident at once at the simulated step's peak: each from its first
// gradient's hand-over to its reduction's end.
std::vector<char> resident_at_peak(const BuiltStep& step, const Prediction& simulated) {
  struct Event {
    double at;
    bool use;  // from (true), to (false)
    std::size_t bucket;
  };
  std::vector<Event> events;
  for (std::size_t b = 0; b < step.bucket_reduce.size(); ++b) {
    const double to = simulated.nodes.at(step.bucket_reduce[b]).end_s;
    double from = to;
    for (std::size_t id : step.bucket_gradients[b])
      from = std::min(from, simulated.nodes.at(id).end_s);
    events.push_back({from, true, b});
    events.push_back({to, false, b});
  }
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
    return a.at != b.at ? a.at < b.at : !a.use && b.use;  // a release before a use at a tie
  });
  std::vector<char> now(step.bucket_reduce.size(), 0), best = now;
  std::size_t bytes = 0, peak = 0;
  for (const Event& e : events) {
    now[e.bucket] = e.use;
    bytes = e.use ? bytes + step.bucket_bytes[e.bucket] : bytes - step.bucket_bytes[e.bucket];
    if (bytes > peak) {
      peak = bytes;
      best = now;
    }
  }
  return best;
}

PlanPrediction simulate_step(const ReducerMeasurements& m, const ReducerPlan& plan,
                             BuiltStep step) {
  const NetworkModel network = network_of(m);
  SimulationOptions options;
  options.ranks = std::max(1, m.ranks);
  options.workers = 1;
  options.collectives_in_flight = plan.collectives_in_flight;
  options.issue_order = step.issue;
  PlanPrediction out;
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

// `plan`'s prediction on `bucketer` (its bucketing): the simulated step and its memory.
PlanPrediction predict_on(const GradientReducer& reducer, const ReducerMeasurements& measured,
                          const ReducerPlan& plan, const PlanSearch& search, Bucketer& bucketer) {
  BuiltStep step = detail::build_reducer_step(reducer, measured, plan, bucketer);
  BuiltStep spans;
  spans.bucket_gradients = step.bucket_gradients;
  spans.bucket_reduce = step.bucket_reduce;
  spans.bucket_bytes = step.bucket_bytes;
  PlanPrediction out = simulate_step(measured, plan, std::move(step));
  out.memory =
      memory_of(reducer, plan, search, bucketer.buckets(),
                plan.shard == ShardLevel::gradients ? resident_at_peak(spans, out.simulated)
                                                    : std::vector<char>{});
  out.fits = search.memory_budget_bytes == 0 || out.memory.total() <= search.memory_budget_bytes;
  return out;
}

}  // namespace

PlanPrediction predict_reducer_step(const GradientReducer& reducer,
                                    const ReducerMeasurements& measured, const ReducerPlan& plan,
                                    const PlanSearch& search) {
  const std::unique_ptr<Bucketer> bucketer = detail::make_reducer_bucketer(reducer, plan);
  return predict_on(reducer, measured, plan, search, *bucketer);
}

std::vector<PlanPrediction> rank_plans(const GradientReducer& reducer,
                                       const ReducerMeasurements& measured,
                                       const PlanSearch& search) {
  const ReducerPlan& base = reducer.plan();
  std::vector<PlanPrediction> out;
  out.push_back(predict_reducer_step(reducer, measured, base, search));
  out.front().measured_step_s = measured.step_s;
  std::vector<ShardLevel> levels = search.shard_levels;
  if (levels.empty()) levels.push_back(base.shard);

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

  for (ShardLevel level : levels)
    for (ReducerPlan shape : search.bucketings(base, largest)) {
      shape.shard = level;
      const std::unique_ptr<Bucketer> bucketer = detail::make_reducer_bucketer(reducer, shape);
      for (std::size_t in_flight = 0; in_flight <= search.max_in_flight; ++in_flight)
        for (IssuePriority priority : {IssuePriority::ready, IssuePriority::forward}) {
          if (priority == IssuePriority::forward &&
              (in_flight == 0 || !search.try_forward_priority))
            continue;
          ReducerPlan plan = shape;
          plan.collectives_in_flight = in_flight;
          plan.priority = priority;
          plan.wire_ratio = priority == IssuePriority::forward ? wire_ratio : base.wire_ratio;
          out.push_back(predict_on(reducer, measured, plan, search, *bucketer));
        }
    }
  std::stable_sort(out.begin(), out.end(), [](const PlanPrediction& a, const PlanPrediction& b) {
    if (a.fits != b.fits) return a.fits;
    return a.step_s < b.step_s * (1 - 1e-9);
  });
  return out;
}

}  // namespace loom
