// The automatic plan of a data-parallel step: candidate bucketings built as the step's real
// graph by the client's callback, given the durations profiled runs measured, simulated (sim/),
// shortlisted, timed round-robin and decided on rank 0's figures.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loom/backend.hpp"
#include "loom/bucketer.hpp"
#include "loom/executor.hpp"
#include "loom/graph.hpp"

namespace loom {

/// @brief What the automatic plan searches, and how it decides.
///
/// Every candidate bucketing (cap x first bucket x split) is built as the step's real graph,
/// given the durations the profiled runs measured (compute nodes by name; each bucket's pack,
/// unpack and update from a per-byte fit of the measured ones) and simulated
/// (loom::best_order: issue orders and collectives in flight 0..max_in_flight) on a wire fitted
/// to the runs' measured communication. The simulator ranks; the step then times the shortlist
/// (the best predicted plan for each in-flight limit, then the next best), all of them compiled
/// at once and run in turn, and keeps the fastest measured: a fitted wire misjudges what few
/// cores and TCP do to small messages (bench/results/2026-11-22_to_2026-11-24.md, "Automatic
/// plan", shows by how much). Rank 0 decides everything; every rank runs its plans.
struct PlanSearch {
  /// @brief Bucket caps tried (bytes).
  std::vector<std::size_t> caps_bytes = {
      std::size_t{256} << 10, std::size_t{512} << 10, std::size_t{1} << 20, std::size_t{2} << 20,
      std::size_t{4} << 20,   std::size_t{8} << 20,   std::size_t{25} << 20};
  /// @brief First-bucket sizes tried with each cap (those above the cap are skipped; the cap
  /// itself is always tried).
  std::vector<std::size_t> first_bucket_bytes = {std::size_t{256} << 10, std::size_t{1} << 20};
  /// @brief Also try cutting gradients at the cap (BucketerOptions::split_large).
  bool try_split = true;
  /// @brief Collectives in flight tried: 0 (no limit) .. max_in_flight.
  std::size_t max_in_flight = 2;
  /// @brief Profiled runs the plans are predicted from.
  int profile_runs = 2;
  /// @brief Plans timed (0 or 1: the best predicted is taken untimed).
  std::size_t shortlist = 4;
  /// @brief Rounds over the shortlist (each plan runs once per round, round-robin, so a noisy
  /// machine disturbs them alike); the first round (new executors, new bucket memory) is not
  /// counted; PlanTrials::steps_s (each plan against the first in the same rounds) decides.
  int trial_runs = 4;
  /// @brief Per-message latency of the fitted wire (seconds).
  double latency_s = 50e-6;
  /// @brief Compute workers per rank in the simulation (0: the running executor's,
  /// Executor::workers()).
  int workers = 0;
  /// @brief SimulationOptions::cores and comm_cpu (CPU the transport takes on few cores).
  double cores = 0;
  double comm_cpu = 0;

  /// @brief Runs the automatic plan takes before its final plan runs (profile_runs, then every
  /// timed plan's trial_runs).
  int runs_to_decide() const;
  /// @brief ErrorCode::invalid_argument, "<who>: ...", naming the first bad field.
  void check(const std::string& who) const;
};

/// @brief A plan a step can run: buckets, issue order and collectives in flight.
struct StepPlan {
  std::size_t cap_bytes = 0;
  std::size_t first_bucket_bytes = 0;
  bool split_large = false;
  std::size_t collectives_in_flight = 0;  ///< 0: no limit
  std::vector<std::size_t> issue_order;   ///< bucket indices, first issued first
  std::size_t buckets = 0;
  double predicted_step_s = 0;  ///< the simulator's step for this plan
  double measured_step_s = 0;   ///< timed (PlanTrials::steps_s), 0 if never timed
};

/// @brief "cap 512 KiB, first 256 KiB, split, 17 buckets, in flight 2".
std::string describe(const StepPlan& plan);

/// @brief A step's graph as a planner reads it: the graph, and per bucket the nodes the
/// Bucketer attached (pack, allreduce, unpack) and the update that follows them (invalid Task
/// when the step has none). The planner finds them by task id, never by name.
struct PlanGraph {
  Graph graph;
  std::vector<BucketTasks> buckets;
  std::vector<Task> updates;
};

/// @brief Builds the step's graph on `bucketer`'s buckets with `issue_order` (empty: the
/// order the graph makes them ready in).
using PlanGraphBuilder =
    std::function<PlanGraph(const Bucketer& bucketer, std::span<const std::size_t> issue_order)>;
/// @brief Makes the step's Bucketer with `options` (caps and split set by the candidate).
using BucketerFactory = std::function<std::unique_ptr<Bucketer>(const BucketerOptions& options)>;

/// @brief The running step a search starts from.
struct PlanInputs {
  const PlanGraph* running = nullptr;             ///< the graph the runs were profiled on
  const Bucketer* bucketer = nullptr;             ///< its buckets
  std::span<const std::vector<NodeTiming>> runs;  ///< its profiled runs (Executor::last_run())
  int ranks = 1;
  int workers = 1;                        ///< compute workers per rank
  std::size_t collectives_in_flight = 0;  ///< the running executor's limit
};

/// @brief Every candidate plan (the running bucketing, then caps x firsts x split, each with
/// its best issue order for every in-flight limit 0..max_in_flight), fastest predicted first.
/// Local: no communication (rank 0 calls it and agree_on_plans() shares the result).
/// ErrorCode::invalid_argument for a bad search or inputs, ErrorCode::internal when a
/// candidate's plan does not order all of its buckets.
std::vector<StepPlan> search_plans(const PlanSearch& search, const PlanInputs& inputs,
                                   const BucketerFactory& make_bucketer,
                                   const PlanGraphBuilder& build);

/// @brief The best predicted plan of each in-flight limit, then the next best overall, at most
/// `keep` (from a list ranked fastest first).
std::vector<StepPlan> shortlist_plans(const std::vector<StepPlan>& ranked, std::size_t keep);

/// @brief Rank 0's `mine` on every rank (Backend::agree_on_root, waited for at most `limit`);
/// empty on every rank when rank 0's is (its search failed). Collective.
std::vector<StepPlan> agree_on_plans(Backend& backend, const std::vector<StepPlan>& mine,
                                     std::chrono::nanoseconds limit);

/// @brief Times a shortlist round-robin: each plan runs once per round, `rounds` rounds; the
/// first round (new executors, new bucket memory) is not counted. A plan's measurement is taken
/// against the first plan's in the same round (steps_s()), so that a host whose speed drifts
/// between rounds (a shared machine's often does, by tens of percent over seconds) disturbs
/// every plan of a round alike. Plans are indices into the caller's shortlist, so every
/// planner (DataParallelStep's, the GradientReducer's automatic plan) times its own kind.
class PlanTrials {
 public:
  /// @brief ErrorCode::invalid_argument for no plans or fewer than 2 rounds.
  PlanTrials(std::size_t plans, int rounds);
  /// @brief The plan whose run record() expects next.
  std::size_t current() const noexcept { return _current; }
  /// @brief How many plans are timed.
  std::size_t plans() const noexcept { return _runs_s.size(); }
  /// @brief Records the current plan's run; returns the plan to run next (current() after).
  /// ErrorCode::invalid_argument once done(), or for a negative or non-finite time.
  std::size_t record(double run_s);
  /// @brief Whether every plan ran `rounds` times.
  bool done() const noexcept;
  /// @brief Each plan's step, in seconds: the first plan's median over its counted runs, and
  /// for every other plan that median times the median over the counted rounds of the plan's
  /// run over the first plan's run in the same round (ErrorCode::invalid_argument before
  /// done()).
  std::vector<double> steps_s() const;
  /// @brief The index of the lowest time (the first among equals); ErrorCode::invalid_argument
  /// for none.
  static std::size_t fastest(std::span<const double> seconds);

 private:
  std::vector<std::vector<double>> _runs_s;
  std::size_t _rounds;
  std::size_t _current = 0;
};

}  // namespace loom
