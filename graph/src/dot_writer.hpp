// Graphviz DOT output shared by Graph::dump_dot and Executor::dump_dot.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "graph_state.hpp"

namespace loom::detail {

/// @brief What the executor knows beyond the graph: issue order, algorithm, measurements.
struct DotAnnotations {
  std::vector<std::int64_t> issue_index;     ///< per node; -1 for nodes without one
  std::vector<std::string> algorithm;        ///< per node; empty for compute
  std::vector<double> duration_us;           ///< per node; empty vector before a run
  std::vector<std::uint32_t> critical_path;  ///< nodes of the critical path, in order
  double critical_path_us = 0;
};

/// @brief Writes `graph` as DOT; compute and communication nodes differ by shape and colour.
void write_dot(std::ostream& out, const GraphState& graph, const DotAnnotations* notes);

}  // namespace loom::detail
