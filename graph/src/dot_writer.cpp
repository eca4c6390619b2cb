// Graphviz DOT output shared by Graph::dump_dot and Executor::dump_dot: the full graph, the
// pieces the summary (dot_summary.cpp) shares, and the choice between the two.
#include "dot_writer.hpp"

#include <cstdio>
#include <ostream>
#include <unordered_set>

#include "bytes_text.hpp"

namespace loom::detail {

std::string dot_escaped(const std::string& text) {
  // A DOT double-quoted string: escape quotes and backslashes, drop control characters.
  std::string out;
  out.reserve(text.size() + 2);
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

std::string human_time(double us) {
  char text[32];
  if (us >= 1000)
    std::snprintf(text, sizeof text, "%.2f ms", us / 1000);
  else
    std::snprintf(text, sizeof text, "%.1f us", us);
  return text;
}

DotStyle dot_style(const NodeData& node) {
  switch (node.kind) {
    case NodeKind::compute:
      return node.placement == Placement::gpu ? DotStyle{"box3d", "#c7e9c0"}
                                              : DotStyle{"box", "#c6dbef"};
    case NodeKind::collective:
      return {"hexagon", "#fdd0a2"};
    case NodeKind::send:
      return {"cds", "#dadaeb"};
    case NodeKind::recv:
      return {"invhouse", "#dadaeb"};
    case NodeKind::copy:
      return {"note", "#e5e5e5"};
    case NodeKind::external:
      return {"parallelogram", "#fff7bc"};
  }
  return {"box", "white"};
}

std::string node_label(const GraphState& graph, const DotAnnotations* notes, std::uint32_t i) {
  const NodeData& node = graph.nodes[i];
  const bool measured = notes != nullptr && !notes->duration_us.empty();
  std::string label = dot_escaped(node.name) + "\\n" + dot_escaped(describe(node));
  if (node.kind != NodeKind::compute && node.kind != NodeKind::external)
    label += "\\n" + bytes_text(bytes_of(node), BytesPrecision::one_decimal);
  if (notes != nullptr) {
    if (notes->issue_index[i] >= 0) label += "\\nissue #" + std::to_string(notes->issue_index[i]);
    if (!notes->algorithm[i].empty()) label += "  algo " + dot_escaped(notes->algorithm[i]);
    if (measured) label += "\\n" + human_time(notes->duration_us[i]);
    if (measured && !notes->exposed_us.empty() && notes->exposed_us[i] > 0)
      label += ", exposed " + human_time(notes->exposed_us[i]);
  }
  if (node.priority != 0) label += "\\npriority " + std::to_string(node.priority);
  return label;
}

void write_dot_header(std::ostream& out, const char* rankdir) {
  // Straight edges and bounded crossing minimisation keep `dot` near-linear on large graphs;
  // newrank lets clusters share ranks, so the time order still reads top to bottom.
  out << "digraph loom {\n"
      << "  rankdir=" << rankdir
      << "; newrank=true; splines=line; nslimit=4; mclimit=0.3; remincross=false;\n"
      << "  node [style=filled, fontname=\"Helvetica\", fontsize=10];\n"
      << "  edge [color=\"#555555\"];\n";
}

void write_full_dot(std::ostream& out, const GraphState& graph, const DotAnnotations* notes) {
  const bool measured = notes != nullptr && !notes->duration_us.empty();
  write_dot_header(out, "TB");
  std::vector<char> critical(graph.nodes.size(), 0);
  std::unordered_set<std::uint64_t> critical_edges;
  if (measured) {
    const auto& path = notes->critical_path;
    for (std::size_t k = 0; k < path.size(); ++k) {
      critical[path[k]] = 1;
      if (k > 0) critical_edges.insert((std::uint64_t{path[k - 1]} << 32) | path[k]);
    }
  }
  if (measured)
    out << "  label=\"critical path " << dot_escaped(human_time(notes->critical_path_us))
        << " (red)\";\n  labelloc=t;\n";
  for (std::uint32_t i = 0; i < graph.nodes.size(); ++i) {
    const DotStyle style = dot_style(graph.nodes[i]);
    out << "  n" << i << " [shape=" << style.shape << ", fillcolor=\"" << style.fill
        << "\", label=\"" << node_label(graph, notes, i) << "\"";
    if (critical[i]) out << ", color=\"#d62728\", penwidth=3";
    out << "];\n";
  }
  for (const auto& [from, to] : graph.edges) {
    out << "  n" << from << " -> n" << to;
    if (critical_edges.count((std::uint64_t{from} << 32) | to) != 0)
      out << " [color=\"#d62728\", penwidth=3]";
    out << ";\n";
  }
  out << "}\n";
}

void write_dot(std::ostream& out, const GraphState& graph, const DotAnnotations* notes,
               const DotOptions& options) {
  const bool summary =
      options.detail == DotDetail::summary ||
      (options.detail == DotDetail::automatic && graph.nodes.size() > options.summary_above);
  if (summary)
    write_summary_dot(out, graph, notes);
  else
    write_full_dot(out, graph, notes);
}

}  // namespace loom::detail
