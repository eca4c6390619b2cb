// OverlapMetrics: how much of a step's communication its compute hid, from one rank's timeline.
#pragma once

#include <vector>

#include "loom/executor.hpp"

namespace loom::examples {

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
/// (start == end == 0) are ignored.
OverlapMetrics measure_overlap(const std::vector<NodeTiming>& timings);

}  // namespace loom::examples
