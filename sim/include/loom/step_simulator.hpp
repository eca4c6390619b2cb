// StepSimulator: replays a profiled step's schedule on modelled workers and a shared wire.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "loom/network_model.hpp"
#include "loom/step_profile.hpp"

namespace loom {

/// @brief How the simulated executor runs.
struct SimulationOptions {
  int ranks = 1;
  /// @brief Compute workers per rank; compute and copy nodes take one each.
  int workers = 1;
  /// @brief At most this many communication nodes issued and not complete (0: no limit).
  std::size_t collectives_in_flight = 0;
  /// @brief Node ids of the communication nodes in issue order; empty: default_issue_order().
  std::vector<std::size_t> issue_order;
  /// @brief CPU contention on few cores: a busy worker needs one core, the transport
  /// `comm_cpu` of one while anything is on the wire (TCP's kernel copies, the progress
  /// thread); when the demand exceeds `cores`, compute and the wire both slow by cores /
  /// demand (the OS shares the cores). Cores in the profile's units: its durations already
  /// include whatever the measured ranks took from each other. cores 0: `workers`.
  double cores = 0;
  double comm_cpu = 0;
};

/// @brief One node's simulated interval.
struct SimulatedNode {
  double start_s = 0;  ///< compute: start; communication: issue
  double end_s = 0;
  std::string algorithm;  ///< collectives: the model's choice
};

/// @brief A simulated step on one rank (every rank runs the same graph, so one stands for all).
///
/// compute = union of compute intervals, comm = union of communication intervals, hidden = the
/// time both ran, exposed = comm - hidden (loom-overlap's definitions); critical_path = the
/// longest path with each communication node at its time alone on the wire.
struct Prediction {
  double step_s = 0;
  double compute_s = 0;
  double comm_s = 0;
  double hidden_s = 0;
  double exposed_s = 0;
  double critical_path_s = 0;
  std::vector<SimulatedNode> nodes;  ///< by node id
};

/// @brief The collectives (and sends/receives) ordered as the executor issues them: the
/// profile's issue_index where known, else a topological order taking higher priority, then
/// lower id, first.
std::vector<std::size_t> default_issue_order(const StepProfile& profile);

/// @brief Simulates one step: compute nodes start on a free worker as soon as their
/// predecessors end (higher priority, then lower id, first) and take their profiled duration;
/// communication nodes are issued in the fixed order once ready and within the in-flight
/// limit, and the collectives in flight share the wire equally (each progresses at 1/k of the
/// speed it would have alone, its alone time from `network` at options.ranks), both slowed
/// when they contend for the CPU (SimulationOptions::comm_cpu). Throws
/// ErrorCode::invalid_argument when the issue order cannot complete (an issue order against
/// the graph's edges) or names unknown or non-communication nodes.
Prediction simulate(const StepProfile& profile, const NetworkModel& network,
                    const SimulationOptions& options);

/// @brief The best schedule found and its prediction.
struct Schedule {
  SimulationOptions options;
  Prediction prediction;
};

/// @brief Searches issue orders at `start`'s in-flight limit (moving one collective at a time,
/// kept while the predicted step shrinks), from `start`'s order (default_issue_order() if
/// empty); the fastest found.
Schedule best_order(const StepProfile& profile, const NetworkModel& network,
                    const SimulationOptions& start);

/// @brief Searches issue orders (moving one collective at a time, kept while the predicted
/// step shrinks) for every in-flight limit 0..max_in_flight, starting from `start`'s order;
/// the fastest found (ties: `start` first, then a lower limit).
Schedule best_schedule(const StepProfile& profile, const NetworkModel& network,
                       const SimulationOptions& start, std::size_t max_in_flight = 3);

}  // namespace loom
