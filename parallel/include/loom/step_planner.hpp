// DataParallelStep's search for its automatic plan (PlanSearch, TimedPlan: loom/plan.hpp): every
// candidate bucketing (cap x first bucket x partition) is built as the step's real graph by the
// client's callback, given the durations the profiled runs measured (compute nodes by name; each
// bucket's pack, unpack and update from a per-byte fit of the measured ones) and simulated
// (loom::best_order: issue orders and collectives in flight 0..max_in_flight) on a wire fitted
// to the runs' measured communication. The simulator ranks; the step then times the shortlist
// (the running plan, then the best predicted plan for each in-flight limit, then the next best)
// round-robin and keeps the running plan unless a plan measured faster by more than
// plan_switch_gain, decided on rank 0's figures: a fitted wire misjudges what few cores and TCP
// do to small messages.
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
#include "loom/plan.hpp"

namespace loom {

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
/// @brief Makes the step's Bucketer with `options` (cap, first bucket and partition set by
/// the candidate).
using BucketerFactory = std::function<std::unique_ptr<Bucketer>(const BucketerOptions& options)>;

/// @brief The running step a search starts from.
struct PlanInputs {
  const PlanGraph* running = nullptr;             ///< the graph the runs were profiled on
  const Bucketer* bucketer = nullptr;             ///< its buckets
  std::span<const std::vector<NodeTiming>> runs;  ///< its profiled runs (Executor::last_run())
  int ranks = 1;
  int workers = 1;                        ///< compute workers per rank
  std::size_t collectives_in_flight = 0;  ///< the running executor's limit
  /// @brief The running step's issue order, bucket indices (empty: the order the graph makes
  /// them ready in).
  std::span<const std::size_t> issue_order;
};

/// @brief The running plan as it runs (its bucketing, in-flight limit and issue order) first,
/// then every candidate plan (the running bucketing, then caps x firsts x partition, each with
/// its best issue order for every in-flight limit 0..max_in_flight), fastest predicted first.
/// Local: no communication (rank 0 calls it and agree_on_plans() shares the result).
/// ErrorCode::invalid_argument for a bad search or inputs, ErrorCode::internal when a
/// candidate's plan does not order all of its buckets.
std::vector<TimedPlan> search_plans(const PlanSearch& search, const PlanInputs& inputs,
                                    const BucketerFactory& make_bucketer,
                                    const PlanGraphBuilder& build);

/// @brief search_plans()' first plan (the running one), then the best predicted plan of each
/// in-flight limit, then the next best overall, at most `keep` (from search_plans()' list: the
/// running plan, then the rest ranked fastest first); a plan the same as the running one is not
/// repeated.
std::vector<TimedPlan> shortlist_plans(const std::vector<TimedPlan>& ranked, std::size_t keep);

/// @brief Rank 0's `mine` on every rank (Backend::agree_on_root, waited for at most `limit`);
/// empty on every rank when rank 0's is (its search failed). Collective.
std::vector<TimedPlan> agree_on_plans(Backend& backend, const std::vector<TimedPlan>& mine,
                                      std::chrono::nanoseconds limit);

}  // namespace loom
