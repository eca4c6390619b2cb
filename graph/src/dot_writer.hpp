// Graphviz DOT output shared by Graph::dump_dot and Executor::dump_dot.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "graph_state.hpp"
#include "loom/graph.hpp"

namespace loom::detail {

/// @brief What the executor knows beyond the graph: issue order, algorithm, measurements.
struct DotAnnotations {
  std::vector<std::int64_t> issue_index;     ///< per node; -1 for nodes without one
  std::vector<std::string> algorithm;        ///< per node; empty for compute
  std::vector<double> duration_us;           ///< per node; empty vector before a run
  std::vector<std::uint32_t> critical_path;  ///< nodes of the critical path, in order
  double critical_path_us = 0;
  /// @brief Per communication node: the part of its time no compute of this rank ran beside
  /// (empty vector before a run).
  std::vector<double> exposed_us;
};

/// @brief Writes `graph` as DOT, in full or as a summary (see DotOptions).
void write_dot(std::ostream& out, const GraphState& graph, const DotAnnotations* notes,
               const DotOptions& options);

// Shared by the full and the summary writers (dot_writer.cpp, dot_summary.cpp).
std::string dot_escaped(const std::string& text);
std::string human_time(double us);
/// @brief The label of a node as the full graph draws it (name, what it does, bytes, issue
/// index, algorithm, measured time, exposed time, priority), DOT-escaped.
std::string node_label(const GraphState& graph, const DotAnnotations* notes, std::uint32_t i);
/// @brief Shape and fill colour of a node kind.
struct DotStyle {
  const char* shape;
  const char* fill;
};
DotStyle dot_style(const NodeData& node);
/// @brief Graph attributes that keep `dot` fast on large graphs; `rankdir` "TB" or "LR".
void write_dot_header(std::ostream& out, const char* rankdir);
void write_full_dot(std::ostream& out, const GraphState& graph, const DotAnnotations* notes);
void write_summary_dot(std::ostream& out, const GraphState& graph, const DotAnnotations* notes);

}  // namespace loom::detail
