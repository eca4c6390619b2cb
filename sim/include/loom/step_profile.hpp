// StepProfile: one step's graph with each node's measured duration, saved as JSON for loom-predict.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loom/collective.hpp"
#include "loom/executor.hpp"
#include "loom/graph.hpp"

namespace loom {

/// @brief One node of a profiled step.
struct ProfiledNode {
  std::string name;
  NodeKind kind = NodeKind::compute;
  int priority = 0;
  /// @brief Collective nodes: the operation (allreduce, ...).
  Collective op = Collective::allreduce;
  /// @brief Communication nodes: the bytes the selector models (selection_bytes); copy: bytes.
  std::size_t bytes = 0;
  /// @brief Mean measured time: compute and copy the body, communication issue to completion
  /// (which includes sharing the wire). 0 when it never ran. The mean, not the median: a
  /// step's compute is the sum of its nodes, and on a loaded machine descheduling hits a
  /// different node each step, which per-node medians would drop.
  double duration_s = 0;
  /// @brief Collectives: position in the executor's fixed issue order, -1 if unknown.
  std::int64_t issue_index = -1;
};

/// @brief A step as the simulator reads it: nodes by task id, edges and how it was run.
struct StepProfile {
  std::vector<ProfiledNode> nodes;
  std::vector<std::pair<std::size_t, std::size_t>> edges;  ///< (from id, to id)
  int ranks = 1;
  int workers = 1;  ///< compute workers (TBB threads) per rank
  std::size_t collectives_in_flight = 0;
  std::string backend;
  std::string label;  ///< what ran ("loom-overlap loom mode, MLP 64-8x512-16")
  // Of the profiled runs (loom-overlap writes medians, the automatic plan means); 0: unknown.
  double measured_step_s = 0;     ///< the step
  double measured_comm_s = 0;     ///< the union of the communication intervals
  double measured_compute_s = 0;  ///< the union of the compute intervals
};

/// @brief The profile of `graph` from profiled runs of its executor (Executor::last_run() of
/// each): each node's mean duration over `runs`. profile.nodes[i] is graph.task(i). A timing is
/// matched by its task id (NodeTiming::task) when that node has its name, else by name, so the
/// runs of one graph can profile another built with the same node names (a candidate plan's);
/// the runs' ranks/workers/etc. are left for the caller to fill in.
StepProfile profile_step(const Graph& graph, std::span<const std::vector<NodeTiming>> runs);

/// @brief JSON ("loom-step-profile": 1) that read_step_profile reads back.
void write_step_profile(const StepProfile& profile, std::ostream& out);
/// @brief write_step_profile into `path`; ErrorCode::invalid_argument if it cannot be written.
void save_step_profile(const StepProfile& profile, const std::string& path);
/// @brief Parses the JSON write_step_profile writes; ErrorCode::invalid_argument naming what is
/// missing or malformed (edges to unknown nodes included).
StepProfile read_step_profile(std::istream& in);
StepProfile load_step_profile(const std::string& path);

}  // namespace loom
