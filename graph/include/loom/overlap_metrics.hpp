// OverlapMetrics: how much of a step's communication its compute hid, from one rank's timeline.
#pragma once

#include <iosfwd>
#include <span>
#include <string>
#include <vector>

#include "loom/backend.hpp"
#include "loom/executor.hpp"

namespace loom {

/// @brief One rank's step, from the executor's per-node timings (milliseconds).
///
/// compute = length of the union of compute intervals; comm = length of the union of
/// communication intervals (issue to completion); hidden = compute + comm - length of the union
/// of both, i.e. the time both were running; exposed_comm = comm - hidden; overlap_efficiency
/// = hidden / comm (0 without communication). By construction 0 <= hidden <= min(compute,
/// comm), so the efficiency lies in [0, 1].
struct OverlapMetrics {
  double compute_ms = 0;
  double comm_ms = 0;
  double busy_ms = 0;  ///< union of everything
  double hidden_ms = 0;
  double exposed_comm_ms = 0;
  double overlap_efficiency = 0;
};

/// @brief The metrics of one profiled run (Executor::last_run()). Nodes that did not run
/// (start == end == 0) are ignored; communication = collective, send and recv nodes; compute
/// = compute and copy nodes.
OverlapMetrics measure_overlap(std::span<const NodeTiming> timings);

/// @brief Why one communication node was, or was not, hidden (times in ms since the run
/// started).
///
/// Its exposed time is the part of [ready, completed] during which no compute ran on this rank:
/// the step was waiting for it. That time is attributed, interval by interval, to the first
/// cause that holds: before issue, "waiting for the issue order" (ready, but an earlier
/// collective had to go first); in flight with other communication, "wire busy" (shared with
/// the node named in busy_with, the one it shared the most time with); in flight alone after
/// compute held every core for most of its flight, "transport starved of CPU" (its progress
/// had no core while compute ran); else "its own transfer" (alone on an idle machine: nothing
/// was left to overlap it with).
struct CommunicationReport {
  std::string name;
  std::int64_t issue_index = -1;
  double ready_ms = 0;
  double issued_ms = 0;
  double completed_ms = 0;
  double exposed_ms = 0;
  double waiting_for_order_ms = 0;  ///< exposed while ready but not issued
  double wire_busy_ms = 0;          ///< exposed while another communication was in flight
  double starved_ms = 0;            ///< exposed after compute held every core most of its flight
  double own_transfer_ms = 0;       ///< exposed alone, nothing starving it
  double cores_busy_ms = 0;         ///< in flight while compute occupied every core
  std::string busy_with;            ///< the communication it shared the wire with most
  /// @brief "hidden", or the largest cause of its exposed time ("wire busy with
  /// bucket5.allreduce", ...).
  std::string reason;
};

/// @brief One report per communication node that ran, in issue order. `cores`: the cores
/// compute and the transport share (0: std::thread::hardware_concurrency()).
std::vector<CommunicationReport> explain_communication(std::span<const NodeTiming> timings,
                                                       unsigned cores = 0);

/// @brief The cores one rank of `backend` can count on: the host's, divided among the ranks on
/// this host (the local backend's threads, or the launcher's ranks on this host).
unsigned cores_per_rank(const Backend& backend);

/// @brief The reports as a table, one line per node, with a header.
void print_communication_report(std::ostream& out, std::span<const CommunicationReport> reports);

}  // namespace loom
