// The planning vocabulary both data-parallel steps share: a plan's description, the search's
// defaults and checks, and the round-robin timing of a shortlist.
#include "loom/plan.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <sstream>

#include "bytes_text.hpp"
#include "invalid_argument.hpp"
#include "loom/error.hpp"

namespace loom {

const char* to_string(IssuePriority priority) noexcept {
  return priority == IssuePriority::forward ? "forward" : "ready";
}

const char* to_string(ShardLevel level) noexcept {
  switch (level) {
    case ShardLevel::none:
      return "none";
    case ShardLevel::optimizer:
      return "optimizer";
    case ShardLevel::gradients:
      return "gradients";
  }
  return "unknown";
}

ShardLevel parse_shard_level(std::string_view name) {
  for (ShardLevel level : {ShardLevel::none, ShardLevel::optimizer, ShardLevel::gradients})
    if (name == to_string(level)) return level;
  throw_invalid_argument("unknown shard level '" + std::string(name) +
                         "' (expected none, optimizer or gradients)");
}

std::string describe(const ReducerPlan& plan) {
  std::string s =
      "cap " + bytes_text(plan.bucket_cap_bytes) + ", first " + bytes_text(plan.first_bucket_bytes);
  if (plan.partition_large) s += ", partition";
  if (plan.compression != Compression::none) s += ", " + std::string(to_string(plan.compression));
  if (plan.collectives_in_flight) s += ", in flight " + std::to_string(plan.collectives_in_flight);
  if (!plan.issue_order.empty())
    s += ", planned order";
  else if (plan.priority == IssuePriority::forward && plan.collectives_in_flight)
    s += ", forward priority";
  if (plan.track_usage) s += ", usage counted";
  if (plan.shard != ShardLevel::none) s += ", shard " + std::string(to_string(plan.shard));
  return s;
}

std::string describe(const TimedPlan& plan) {
  std::string s = describe(plan.plan);
  if (plan.buckets)
    s += ", " + std::to_string(plan.buckets) + (plan.buckets == 1 ? " bucket" : " buckets");
  return s;
}

PlanSearch PlanSearch::for_gradient_reducer() {
  PlanSearch search;
  search.caps_bytes = {std::size_t{1} << 20,  std::size_t{2} << 20,  std::size_t{4} << 20,
                       std::size_t{10} << 20, std::size_t{25} << 20, std::size_t{50} << 20};
  search.max_in_flight = 3;
  search.profile_runs = 3;
  search.shortlist = 3;
  search.trial_runs = 5;
  return search;
}

void ReducerPlan::check(const std::string& who) const {
  const auto bad = [&](const std::string& what) { throw_invalid_argument(who + ": " + what); };
  if (bucket_cap_bytes == 0 || first_bucket_bytes == 0)
    bad("bucket_cap_bytes and first_bucket_bytes must be > 0 (" + describe(*this) + ")");
  if (!(wire_ratio > 0) || !std::isfinite(wire_ratio))
    bad("wire_ratio must be > 0 (got " + std::to_string(wire_ratio) + ")");
  if (priority != IssuePriority::ready && priority != IssuePriority::forward)
    bad("priority must be 'forward' or 'ready' (got #" +
        std::to_string(static_cast<int>(priority)) + ")");
  std::vector<std::size_t> sorted = issue_order;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    bad("issue_order names bucket #" +
        std::to_string(*std::adjacent_find(sorted.begin(), sorted.end())) + " twice");
  if (shard != ShardLevel::none && shard != ShardLevel::optimizer && shard != ShardLevel::gradients)
    bad("shard must be 'none', 'optimizer' or 'gradients' (got #" +
        std::to_string(static_cast<int>(shard)) + ")");
  if (shard != ShardLevel::none && !external_updates)
    bad(std::string("shard '") + to_string(shard) +
        "' needs external_updates (the updated shards are all-gathered after the client's update)");
}

int PlanSearch::runs_to_decide() const {
  const int timed = shortlist > 1 ? static_cast<int>(shortlist) * std::max(2, trial_runs) : 0;
  return std::max(1, profile_runs) + timed;
}

void PlanSearch::check(const std::string& who) const {
  const auto bad = [&](const std::string& what) { throw_invalid_argument(who + ": " + what); };
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

std::vector<ReducerPlan> PlanSearch::bucketings(const ReducerPlan& base,
                                                std::size_t largest_gradient_bytes) const {
  std::vector<ReducerPlan> out;
  for (std::size_t cap : caps_bytes) {
    if (cap == 0) throw_invalid_argument("PlanSearch::bucketings: a bucket cap of 0 bytes");
    std::vector<std::size_t> firsts{cap};
    for (std::size_t f : first_bucket_bytes)
      if (f > 0 && f < cap) firsts.push_back(f);
    for (std::size_t first : firsts)
      for (bool partition : {false, true}) {
        if (partition && (!try_partition || largest_gradient_bytes <= cap)) continue;
        ReducerPlan plan = base;
        plan.bucket_cap_bytes = cap;
        plan.first_bucket_bytes = first;
        plan.partition_large = partition;
        plan.issue_order.clear();
        out.push_back(std::move(plan));
      }
  }
  return out;
}

void encode_plan(const ReducerPlan& plan, std::vector<std::int64_t>& out) {
  out.insert(
      out.end(),
      {static_cast<std::int64_t>(plan.bucket_cap_bytes),
       static_cast<std::int64_t>(plan.first_bucket_bytes), plan.partition_large ? 1 : 0,
       static_cast<std::int64_t>(plan.collectives_in_flight),
       static_cast<std::int64_t>(plan.priority), std::bit_cast<std::int64_t>(plan.wire_ratio),
       static_cast<std::int64_t>(plan.shard), static_cast<std::int64_t>(plan.issue_order.size())});
  out.insert(out.end(), plan.issue_order.begin(), plan.issue_order.end());
}

PlanReader::PlanReader(std::span<const std::int64_t> values, std::string who)
    : _values(values), _who(std::move(who)) {}

std::int64_t PlanReader::next() {
  if (_at >= _values.size())
    throw Error(ErrorCode::mismatch,
                _who + ": rank 0's plans end after " + std::to_string(_at) + " values");
  return _values[_at++];
}

double PlanReader::next_double() {
  return std::bit_cast<double>(next());
}

ReducerPlan PlanReader::plan(ReducerPlan base) {
  base.bucket_cap_bytes = static_cast<std::size_t>(next());
  base.first_bucket_bytes = static_cast<std::size_t>(next());
  base.partition_large = next() != 0;
  base.collectives_in_flight = static_cast<std::size_t>(next());
  const std::int64_t priority = next();
  if (priority != static_cast<std::int64_t>(IssuePriority::ready) &&
      priority != static_cast<std::int64_t>(IssuePriority::forward))
    throw Error(ErrorCode::mismatch, _who + ": rank 0 sent priority #" + std::to_string(priority));
  base.priority = static_cast<IssuePriority>(priority);
  base.wire_ratio = next_double();
  const std::int64_t shard = next();
  if (shard < 0 || shard > static_cast<std::int64_t>(ShardLevel::gradients))
    throw Error(ErrorCode::mismatch, _who + ": rank 0 sent shard level #" + std::to_string(shard));
  base.shard = static_cast<ShardLevel>(shard);
  const std::int64_t order = next();
  if (order < 0 || static_cast<std::size_t>(order) > _values.size() - _at)
    throw Error(ErrorCode::mismatch,
                _who + ": rank 0 sent an issue order of " + std::to_string(order) + " buckets");
  base.issue_order.clear();
  for (std::int64_t k = 0; k < order; ++k)
    base.issue_order.push_back(static_cast<std::size_t>(next()));
  return base;
}

PlanTrials::PlanTrials(std::size_t plans, int rounds)
    : _runs_s(plans), _rounds(static_cast<std::size_t>(std::max(0, rounds))) {
  if (plans == 0) throw_invalid_argument("PlanTrials: an empty shortlist");
  if (rounds < 2)
    throw_invalid_argument("PlanTrials: at least 2 rounds (the first is not counted), got " +
                           std::to_string(rounds));
}

std::size_t PlanTrials::record(double run_s) {
  if (done()) throw_invalid_argument("PlanTrials::record: every plan already ran its rounds");
  if (!std::isfinite(run_s) || run_s < 0)
    throw_invalid_argument("PlanTrials::record: plan " + std::to_string(_current) + "'s run took " +
                           std::to_string(run_s) + " s (a time is finite and not negative)");
  _runs_s[_current].push_back(run_s);
  _current = (_current + 1) % _runs_s.size();
  return _current;
}

bool PlanTrials::done() const noexcept {
  return _runs_s.back().size() >= _rounds;
}

std::vector<double> PlanTrials::steps_s() const {
  if (!done()) throw_invalid_argument("PlanTrials::steps_s before every plan ran its rounds");
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
  if (seconds.empty()) throw_invalid_argument("PlanTrials::fastest of no plans");
  return static_cast<std::size_t>(std::min_element(seconds.begin(), seconds.end()) -
                                  seconds.begin());
}

std::size_t PlanTrials::keep_or_switch(std::span<const double> seconds) {
  if (seconds.empty()) throw_invalid_argument("PlanTrials::keep_or_switch of no plans");
  const std::size_t best = fastest(seconds);
  return best != 0 && seconds[best] < seconds[0] * (1.0 - plan_switch_gain) ? best : 0;
}

bool same_plan(const ReducerPlan& a, const ReducerPlan& b) {
  return a.bucket_cap_bytes == b.bucket_cap_bytes && a.first_bucket_bytes == b.first_bucket_bytes &&
         a.partition_large == b.partition_large &&
         a.collectives_in_flight == b.collectives_in_flight && a.priority == b.priority &&
         (a.priority != IssuePriority::forward || a.wire_ratio == b.wire_ratio) &&
         a.shard == b.shard && a.issue_order == b.issue_order;
}

}  // namespace loom
