// Chrome trace-event JSON (Perfetto, chrome://tracing) of one executor run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace loom::detail {

/// @brief One span of the timeline.
struct TraceSpan {
  std::string name;
  std::string category;   ///< "compute", "collective", "send", "recv", "copy"
  std::string describe;   ///< what the node does ("allreduce float32[4] sum")
  std::int64_t start_ns;  ///< since the run started
  std::int64_t end_ns;
  int worker;                ///< TBB worker lane, or -1 for communication
  std::string communicator;  ///< communication: the communicator's lane ("world")
  std::size_t bytes;
  std::string algorithm;
  std::int64_t issue_index;  ///< -1 when none
  std::int64_t ready_ns;     ///< communication: when it became ready (waiting for its turn)
  /// @brief An external node: work done outside the executor, drawn on the lanes "outside"
  /// (split where spans overlap) and counted as busy, like compute.
  bool outside = false;
};

/// @brief Where a rank's run sits in time, so tools can merge every rank's trace into one
/// timeline (tools/loom-trace-merge).
struct TraceClock {
  int rank = 0;
  int world = 1;
  /// @brief The run's start on rank 0's steady clock (ns): this rank's start minus
  /// clock_offset_ns.
  std::int64_t run_start_ns = 0;
  /// @brief This rank's steady clock minus rank 0's, measured at compile.
  std::int64_t clock_offset_ns = 0;
};

/// @brief Writes the spans of one rank: one lane per worker, one per communicator (split
/// into sub-lanes where operations overlap, since trace viewers need nested spans per lane),
/// a lane "exposed communication" with the parts of communication no compute ran beside, a
/// counter "bytes in flight", and the clock in "otherData".
void write_chrome_trace(std::ostream& out, const TraceClock& clock,
                        const std::vector<TraceSpan>& spans);

}  // namespace loom::detail
