// The step of a GradientReducer's client predicted by the step simulator: profiled steps (the
// reducer's executor timings and what the client's thread did) made into a StepProfile for the
// plan in force or any other, and the automatic plan chosen from those predictions.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loom/executor.hpp"
#include "loom/gradient_reducer.hpp"
#include "loom/step_profile.hpp"
#include "loom/step_simulator.hpp"

namespace loom {

/// @brief What the client's thread (the one running backward, the optimizer and the next
/// forward) did in one step besides handing gradients over, in seconds since that step's
/// GradientReducer::begin(). The step ends where the next one begins.
struct ClientTimeline {
  struct Span {
    double start_s = 0;
    double end_s = 0;
  };
  /// @brief A forward pre-hook of the next forward: the parameters it waits for, when it was
  /// entered and when it let its module run (after waiting for and applying their updates).
  struct ModuleEntry {
    std::string module;  ///< "layers.2.self_attn"; "" for the model itself
    std::vector<std::size_t> parameters;
    double entered_s = 0;
    double resumed_s = 0;
  };
  /// @brief The next step's begin(): the step's period.
  double end_s = 0;
  /// @brief The next forward's pre-hooks in the order they fired (the model's own first).
  std::vector<ModuleEntry> forward;
  /// @brief When the next forward returned.
  double forward_end_s = 0;
  /// @brief (update group, when the client applied it) for each group applied.
  std::vector<std::pair<std::size_t, Span>> updates;
  /// @brief When the client waited for the reducer (wait_update, finish).
  std::vector<Span> waits;
};

/// @brief One profiled step: the executor's timings of its run (Executor::last_run() after
/// finish()), the client's timeline and the reducer's hand-over times.
struct ReducerStepRecord {
  std::vector<NodeTiming> run;
  ClientTimeline client;
  /// @brief When each gradient was handed over (GradientReducer::handed_over_seconds()). Empty:
  /// the end of its "grad.<name>" node in `run`, which is later when the executor armed the
  /// node after the hand-over (a loaded host's late worker at the run's start).
  std::vector<double> handed_over_s;
};

/// @brief A forward pre-hook's share of the forward, on the client's compute clock.
struct ForwardPart {
  std::string module;
  std::vector<std::size_t> parameters;
  double duration_s = 0;
};

/// @brief A cost a + b x + c y fitted to measurements (x, y: what the cost grows with).
struct LinearCost {
  double a = 0, b = 0, c = 0;
  double at(double x, double y = 0) const { return a + b * x + c * y; }
};

/// @brief What profiled steps say about a reducer's step apart from its plan: the client's
/// compute (its clock stopped while it applied updates or waited for the reducer), the
/// updates' cost, the wire. Means over the steps.
struct ReducerMeasurements {
  int ranks = 1;
  std::size_t steps = 0;
  /// @brief Per parameter: when its gradient was handed over, on the client's compute clock.
  std::vector<double> ready_s;
  /// @brief From the last gradient to the next forward: the rest of backward, optimizer.step(),
  /// the loop's own work.
  double after_backward_s = 0;
  std::vector<ForwardPart> forward;
  /// @brief From the forward's end to the next begin(): the loss, backward down to the model.
  double after_forward_s = 0;
  /// @brief An update group's application: a + b tensors + c elements.
  LinearCost update;
  /// @brief Compression's casts per bucket: a + b bytes (zero without compression).
  LinearCost pack, unpack;
  /// @brief The wire fitted to the measured communication (NetworkModel::fitted).
  double link_bits_per_s = 0;
  double latency_s = 0;
  // As measured.
  double step_s = 0;    ///< the period, begin() to the next begin()
  double wait_s = 0;    ///< the client waiting for the reducer
  double update_s = 0;  ///< the client applying updates
  double comm_s = 0;    ///< the union of the collectives' intervals
};

/// @brief The measurements of `steps`, all run under `reducer`'s current plan (records made
/// before its last replan() would name other update groups). Steps whose forward's modules
/// differ from the last step's, or whose period is over twice the median (something else ran
/// before the next step: an evaluation, a checkpoint, another model), are left out.
/// ErrorCode::invalid_argument naming the step and what is missing when a record has no
/// profiled run (profiling off), a gradient that never arrived, or the last step no forward.
ReducerMeasurements measure_reducer_steps(const GradientReducer& reducer,
                                          std::span<const ReducerStepRecord> steps,
                                          double latency_s = 50e-6);

/// @brief What a plan's memory is made of, per rank, in bytes: what
/// PlanSearch::memory_budget_bytes weighs.
struct PlanMemory {
  /// @brief The parameters' values, whole on every rank (a sharded plan's are loom's padded
  /// memory).
  std::size_t parameters = 0;
  /// @brief The gradient buckets: as allocated (the pool's size classes unsharded, exact pages
  /// sharded; 16-bit wires with compression), or with ShardLevel::gradients those resident at
  /// once at the simulated step's peak (every bucket when not simulated).
  std::size_t gradients = 0;
  /// @brief A sharded plan's shards of the parameters (and of the averaged gradients).
  std::size_t shards = 0;
  /// @brief PlanSearch::state_bytes_per_element times the elements this rank updates.
  std::size_t optimizer_state = 0;
  /// @brief PlanSearch::activation_bytes.
  std::size_t activations = 0;
  std::size_t total() const noexcept {
    return parameters + gradients + shards + optimizer_state + activations;
  }
};

/// @brief "parameters 1.2 MiB + gradients 1.2 MiB + shards 0.6 MiB + optimizer state 1.2 MiB +
/// activations 3 MiB = 7.2 MiB".
std::string describe(const PlanMemory& memory);

/// @brief `plan`'s memory per rank over `reducer`'s parameters and world size, with
/// `search`'s optimizer state and activations; every gradient bucket counted resident.
PlanMemory plan_memory(const GradientReducer& reducer, const ReducerPlan& plan,
                       const PlanSearch& search);

/// @brief A plan's predicted step.
struct PlanPrediction {
  ReducerPlan plan;
  std::size_t buckets = 0;
  /// @brief Its memory per rank (plan_memory(), the gradients' peak from the simulated step)
  /// and whether it is within the search's budget.
  PlanMemory memory;
  bool fits = true;
  double step_s = 0;           ///< predicted period
  double measured_step_s = 0;  ///< the measurements' (the plan measured, when it is in force)
  // The predicted step's parts.
  double backward_s = 0;  ///< the client's compute until its last gradient
  double forward_s = 0;   ///< the next forward's compute
  double other_s = 0;     ///< the client's other compute (after backward, after forward)
  double update_s = 0;    ///< applying the updates
  double wire_s = 0;      ///< the collectives, each alone on the fitted wire, summed
  double comm_s = 0;      ///< the union of the collectives' intervals
  double exposed_s = 0;   ///< communication no compute hid
  double wait_s = 0;      ///< the client waiting for the reducer
  double link_bits_per_s = 0;
  StepProfile profile;  ///< what was simulated
  Prediction simulated;
};

/// @brief The step `plan` would take, simulated from `measured`: the client's compute as one
/// chain (each gradient handed over after its measured gap, then the rest of backward, the
/// next forward's modules, each after the updates of the parameters it waits for, and the
/// rest), the plan's buckets (pack, allreduce on the fitted wire, unpack) in its issue order
/// and collective limit, and an update node per update group at the fitted cost. One worker:
/// the client's thread does the updates between its own work (in backward as buckets land,
/// in the forward only where a module needs them), as loom_torch.parallelize does.
/// `plan` keeps the reducer's parameters; ErrorCode::invalid_argument for a bad plan.
PlanPrediction predict_reducer_step(const GradientReducer& reducer,
                                    const ReducerMeasurements& measured, const ReducerPlan& plan,
                                    const PlanSearch& search = PlanSearch::for_gradient_reducer());

/// @brief Every plan `search` tries (compression, usage counting and orders as the reducer's
/// plan; IssuePriority::forward with the measured wire-to-backward ratio; each of
/// search.shard_levels) predicted from `measured`: those within the memory budget first, each
/// part fastest first; the reducer's own plan first among equals.
std::vector<PlanPrediction> rank_plans(
    const GradientReducer& reducer, const ReducerMeasurements& measured,
    const PlanSearch& search = PlanSearch::for_gradient_reducer());

/// @brief What choose_reducer_plan() or decide_reducer_plan() decided.
struct PlanDecision {
  ReducerPlan plan;  ///< now in force on every rank
  double predicted_step_s = 0;
  double current_predicted_step_s = 0;  ///< the plan it replaced, predicted alike
  double measured_step_s = 0;           ///< the plan it replaced, measured
  std::size_t candidates = 0;
  /// @brief Whether the plan changed (replan() ran).
  bool changed = false;
  /// @brief decide_reducer_plan(): the shortlist as timed, in shortlist order (the replaced
  /// plan first); empty when the plan was decided on predictions alone.
  std::vector<TimedPlan> timed;
};

/// @brief The automatic plan's shortlist, to be timed (PlanTrials) before it decides.
struct PlanShortlist {
  /// @brief The running plan first, then the fastest predicted plans that the simulator
  /// predicts under PlanSearch::shortlist_margin times its step, at most `keep` in all.
  /// Only the running plan: nothing to time.
  std::vector<TimedPlan> plans;
  double measured_step_s = 0;  ///< the running plan over the profiled steps (rank 0's)
  std::size_t candidates = 0;  ///< plans predicted
};

/// @brief Collective (every rank, between steps, at the same step): rank 0 measures `steps`,
/// ranks the plans of `search` (rank_plans) and sends its shortlist; every rank gets the same
/// one. The plan is not changed. Plans the simulator cannot tell apart (the same predicted step
/// and bucket count) are shortlisted once. ErrorCode::invalid_argument for `keep` 0, a step in
/// progress, or rank 0's failure to predict (thrown on every rank).
PlanShortlist shortlist_reducer_plans(GradientReducer& reducer,
                                      std::span<const ReducerStepRecord> steps,
                                      const PlanSearch& search = PlanSearch::for_gradient_reducer(),
                                      std::size_t keep = 3);

/// @brief Collective (every rank, between steps, at the same step): rank 0's `measured_s`
/// (each shortlisted plan's period, PlanTrials::steps_s) decide; every rank replans
/// to the fastest measured unless it is the plan in force or beats the running plan (the
/// shortlist's first) by less than 3% (the trials' noise), and gets the same PlanDecision
/// (with `timed` set). ErrorCode::invalid_argument for a step in progress or a measurement per
/// plan missing, ErrorCode::mismatch when rank 0 timed another number of plans.
PlanDecision decide_reducer_plan(GradientReducer& reducer, const PlanShortlist& shortlist,
                                 std::span<const double> measured_s);

/// @brief Collective (every rank, between steps, at the same step): rank 0 measures `steps`
/// (its own), ranks the plans of `search` and sends its fastest, untimed; every rank replans to it
/// (GradientReducer::replan) and gets the same PlanDecision. The running plan stays unless
/// the fastest is predicted faster by more than the prediction of the running plan misses
/// its measured step (on a loaded host the model's error can exceed a candidate's gain). Rank 0's
/// failure to predict (ErrorCode::invalid_argument naming why) is thrown on every rank, the plan
/// left as it was.
PlanDecision choose_reducer_plan(GradientReducer& reducer, std::span<const ReducerStepRecord> steps,
                                 const PlanSearch& search = PlanSearch::for_gradient_reducer());

}  // namespace loom
