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
};

/// @brief Writes the spans of rank `rank`: one lane per worker, one per communicator (split
/// into sub-lanes where operations overlap, since trace viewers need nested spans per lane).
void write_chrome_trace(std::ostream& out, int rank, const std::vector<TraceSpan>& spans);

}  // namespace loom::detail
