// The automatic plan of a GradientReducer, agreed from rank 0: its fastest predicted plan
// (choose_reducer_plan), or a shortlist timed by the client (shortlist_reducer_plans) and
// decided on rank 0's trial steps (decide_reducer_plan). Every function is collective.
#include "loom/reducer_prediction.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "invalid_argument.hpp"
#include "loom/error.hpp"

namespace loom {

namespace {

std::chrono::nanoseconds agreement_limit(const GradientReducer& reducer) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(*reducer.executor_options().timeout);
}

// What rank 0 predicts from the profiled steps, on every rank: rank 0 measures the steps,
// ranks the plans and predicts the running one, and `encode` turns that into the values every
// rank receives (Backend::agree_on_root, `name`, within agreement_limit). `valid` checks their
// shape on every rank; where rank 0 failed, it rethrows its own error and the other ranks get
// invalid_argument naming `who` (the plan is left unchanged everywhere).
std::vector<std::int64_t> predicted_on_rank_zero(
    GradientReducer& reducer, std::span<const ReducerStepRecord> steps, const PlanSearch& search,
    std::string_view name, std::string_view who,
    const std::function<void(const ReducerMeasurements&, const std::vector<PlanPrediction>&,
                             const PlanPrediction&, std::vector<std::int64_t>&)>& encode,
    const std::function<bool(const std::vector<std::int64_t>&)>& valid) {
  Backend& backend = reducer.backend();
  const std::string who_here = std::string(who) + " on rank " + std::to_string(backend.rank());
  std::vector<std::int64_t> mine;  // empty elsewhere and on rank 0's failure
  std::optional<Error> failure;
  if (backend.rank() == 0) {
    try {
      const ReducerMeasurements measured = measure_reducer_steps(reducer, steps, search.latency_s);
      const std::vector<PlanPrediction> ranked = rank_plans(reducer, measured, search);
      const PlanPrediction current =
          predict_reducer_step(reducer, measured, reducer.plan(), search);
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
    throw_invalid_argument(
        who_here +
        ": rank 0 could not predict the plans (its error says why); the plan is unchanged");
  }
  return zero;
}

}  // namespace

PlanDecision choose_reducer_plan(GradientReducer& reducer, std::span<const ReducerStepRecord> steps,
                                 const PlanSearch& search) {
  if (reducer.in_step())
    throw_invalid_argument("choose_reducer_plan: a step is in progress (finish() it first)");
  // The plan, the candidates' count, three predictions and whether the plan changes.
  const std::vector<std::int64_t> zero = predicted_on_rank_zero(
      reducer, steps, search, "GradientReducer::choose_plan", "choose_reducer_plan",
      [](const ReducerMeasurements& measured, const std::vector<PlanPrediction>& ranked,
         const PlanPrediction& running, std::vector<std::int64_t>& out) {
        const double current = running.step_s;
        // A plan replaces the running one only if it is predicted faster by more than the
        // prediction misses the running plan's measured step.
        // A running plan over the memory budget is replaced by the fastest that fits.
        const double doubt = std::abs(current - measured.step_s);
        const bool change =
            ranked.front().fits && (ranked.front().step_s < current - doubt || !running.fits);
        encode_plan(change ? ranked.front().plan : running.plan, out);
        out.push_back(static_cast<std::int64_t>(ranked.size()));
        out.push_back(std::bit_cast<std::int64_t>(change ? ranked.front().step_s : current));
        out.push_back(std::bit_cast<std::int64_t>(current));
        out.push_back(std::bit_cast<std::int64_t>(measured.step_s));
        out.push_back(change ? 1 : 0);
      },
      [](const std::vector<std::int64_t>& zero) { return !zero.empty(); });
  PlanReader read(zero, "choose_reducer_plan on rank " + std::to_string(reducer.backend().rank()));
  const ReducerPlan plan = read.plan(reducer.plan());
  PlanDecision chosen;
  chosen.candidates = static_cast<std::size_t>(read.next());
  chosen.predicted_step_s = read.next_double();
  chosen.current_predicted_step_s = read.next_double();
  chosen.measured_step_s = read.next_double();
  chosen.changed = read.next() != 0;
  if (chosen.changed) reducer.replan(plan);
  chosen.plan = reducer.plan();
  return chosen;
}

PlanShortlist shortlist_reducer_plans(GradientReducer& reducer,
                                      std::span<const ReducerStepRecord> steps,
                                      const PlanSearch& search, std::size_t keep) {
  if (keep == 0)
    throw_invalid_argument("shortlist_reducer_plans: keep must be at least 1 (the running plan)");
  if (!(search.shortlist_margin >= 1.0) || !std::isfinite(search.shortlist_margin))
    throw_invalid_argument(
        "shortlist_reducer_plans: shortlist_margin must be a finite factor >= 1, not " +
        std::to_string(search.shortlist_margin));
  const double margin = search.shortlist_margin;
  if (reducer.in_step())
    throw_invalid_argument("shortlist_reducer_plans: a step is in progress (finish() it first)");
  // Rank 0's candidates' count, the running plan's measured step, then per plan its fields, its
  // prediction and its bucket count.
  const std::vector<std::int64_t> zero = predicted_on_rank_zero(
      reducer, steps, search, "GradientReducer::shortlist_plans", "shortlist_reducer_plans",
      [keep, margin](const ReducerMeasurements& measured, const std::vector<PlanPrediction>& ranked,
                     const PlanPrediction& current, std::vector<std::int64_t>& out) {
        // Only plans within the memory budget (rank_plans puts them first); where the running
        // plan is over it, the fastest that fit, whatever their prediction.
        std::vector<const PlanPrediction*> picked{&current};
        for (const PlanPrediction& p : ranked) {
          if (picked.size() >= keep || !p.fits ||
              (current.fits && !(p.step_s < current.step_s * margin)))
            break;
          const bool twin = std::any_of(picked.begin(), picked.end(), [&](const auto* q) {
            return same_plan(q->plan, p.plan) ||
                   (q->buckets == p.buckets && std::abs(q->step_s - p.step_s) <= 1e-9 * q->step_s);
          });
          if (!twin) picked.push_back(&p);
        }
        out.push_back(static_cast<std::int64_t>(ranked.size()));
        out.push_back(std::bit_cast<std::int64_t>(measured.step_s));
        for (const PlanPrediction* p : picked) {
          encode_plan(p->plan, out);
          out.push_back(std::bit_cast<std::int64_t>(p->step_s));
          out.push_back(static_cast<std::int64_t>(p->buckets));
          out.push_back(static_cast<std::int64_t>(p->memory.total()));
          out.push_back(p->fits ? 1 : 0);
        }
      },
      [](const std::vector<std::int64_t>& zero) { return !zero.empty(); });
  PlanReader read(zero,
                  "shortlist_reducer_plans on rank " + std::to_string(reducer.backend().rank()));
  PlanShortlist out;
  out.candidates = static_cast<std::size_t>(read.next());
  out.measured_step_s = read.next_double();
  while (!read.done()) {
    TimedPlan t;
    t.plan = read.plan(reducer.plan());
    t.predicted_step_s = read.next_double();
    t.buckets = static_cast<std::size_t>(read.next());
    t.memory_bytes = static_cast<std::size_t>(read.next());
    t.fits = read.next() != 0;
    out.plans.push_back(std::move(t));
  }
  if (out.plans.empty())
    throw Error(ErrorCode::mismatch, "shortlist_reducer_plans on rank " +
                                         std::to_string(reducer.backend().rank()) +
                                         ": rank 0's shortlist holds no plan");
  // The running plan keeps its own orders (the ready and forward orders are not sent).
  out.plans.front().plan = reducer.plan();
  return out;
}

PlanDecision decide_reducer_plan(GradientReducer& reducer, const PlanShortlist& shortlist,
                                 std::span<const double> measured_s) {
  Backend& backend = reducer.backend();
  const std::string who = "decide_reducer_plan on rank " + std::to_string(backend.rank());
  if (reducer.in_step())
    throw_invalid_argument(who + ": a step is in progress (finish() it first)");
  if (shortlist.plans.empty()) throw_invalid_argument(who + ": an empty shortlist");
  if (measured_s.size() != shortlist.plans.size())
    throw_invalid_argument(who + ": " + std::to_string(measured_s.size()) + " measurements for " +
                           std::to_string(shortlist.plans.size()) + " shortlisted plans");
  std::vector<std::int64_t> mine;
  for (double v : measured_s) {
    if (!std::isfinite(v) || v < 0)
      throw_invalid_argument(who + ": a plan's measured step is " + std::to_string(v) + " s");
    mine.push_back(std::bit_cast<std::int64_t>(v));
  }
  const std::vector<std::int64_t> zero = backend.agree_on_root(
      "GradientReducer::decide_plan", mine, agreement_limit(reducer),
      [&] { return "decide_reducer_plan on rank " + std::to_string(backend.rank()); },
      /*same_length=*/true);
  PlanDecision chosen;
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
  // A plan replaces the running one (DDP's cap at first) only for a gain above the trials'
  // noise (plan_switch_gain); plans over the memory budget are not chosen (a running plan over
  // it is replaced by the fastest that fits, when one was timed).
  std::vector<double> candidates = agreed;
  for (std::size_t k = 1; k < candidates.size(); ++k)
    if (!chosen.timed[k].fits) candidates[k] = std::numeric_limits<double>::infinity();
  std::size_t fastest = PlanTrials::keep_or_switch(candidates);
  if (!chosen.timed.front().fits) {
    candidates.front() = std::numeric_limits<double>::infinity();
    const std::size_t best = PlanTrials::fastest(candidates);
    if (std::isfinite(candidates[best])) fastest = best;
  }
  const TimedPlan& best = chosen.timed[fastest];
  chosen.predicted_step_s = best.predicted_step_s;
  chosen.changed = fastest != 0;  // the replaced plan is the shortlist's first
  if (!same_plan(best.plan, reducer.plan())) reducer.replan(best.plan);
  chosen.plan = reducer.plan();
  return chosen;
}

}  // namespace loom
