// The summary DOT of a large graph: one cluster per group, runs of compute collapsed into one box
// with their total time, edges between boxes bundled with a count, every communication node
// kept with its issue index, bytes, algorithm and measured time; the critical path and the
// exposed communication highlighted; a legend.
#include <algorithm>
#include <cstdint>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "bytes_text.hpp"
#include "dot_writer.hpp"

namespace loom::detail {
namespace {

constexpr const char* critical_colour = "#d62728";
constexpr const char* exposed_fill = "#fb6a4a";
constexpr const char* partly_exposed_fill = "#fcae91";

// More communication boxes than this (a deep model with small buckets) are merged, in issue
// order, into runs of consecutive operations of one kind, at most about this many boxes.
constexpr std::size_t most_communication_boxes = 48;
constexpr std::size_t communication_runs = 32;

// A box of the summary: a run of compute nodes of one group, one communication node, or a run
// of consecutive communication nodes of one group and kind.
struct Item {
  std::string group;
  std::vector<std::uint32_t> members;  // in topological order
  bool run = false;                    // compute run
};

// Beyond this many groups dot's cluster layout gets slow and a person cannot follow them: groups
// are then merged into their stage, the name before its first digit ("backward12" -> "backward").
constexpr std::size_t most_clusters = 24;

std::string stage_of(const std::string& group) {
  const auto digit = group.find_first_of("0123456789");
  if (digit == std::string::npos) return group;
  std::string stage = group.substr(0, digit);
  while (!stage.empty() && (stage.back() == ' ' || stage.back() == '.' || stage.back() == '_' ||
                            stage.back() == '-' || stage.back() == '('))
    stage.pop_back();
  return stage.empty() ? group : stage;
}

// Each node's group as the summary draws it (see most_clusters).
std::vector<std::string> summary_groups(const GraphState& graph) {
  std::vector<std::string> groups(graph.nodes.size());
  std::set<std::string> distinct;
  for (std::size_t i = 0; i < graph.nodes.size(); ++i) {
    groups[i] = group_of(graph.nodes[i]);
    distinct.insert(groups[i]);
  }
  if (distinct.size() > most_clusters)
    for (std::string& g : groups) g = stage_of(g);
  return groups;
}

// Kahn's order; empty when the graph has a cycle (the summary then falls back to the full graph).
std::vector<std::uint32_t> topological_order(const GraphState& graph,
                                             const std::vector<std::vector<std::uint32_t>>& succ) {
  const std::size_t n = graph.nodes.size();
  std::vector<std::uint32_t> indegree(n, 0), order;
  for (const auto& [from, to] : graph.edges) ++indegree[to];
  for (std::uint32_t i = 0; i < n; ++i)
    if (indegree[i] == 0) order.push_back(i);
  for (std::size_t k = 0; k < order.size(); ++k)
    for (std::uint32_t s : succ[order[k]])
      if (--indegree[s] == 0) order.push_back(s);
  if (order.size() != n) order.clear();
  return order;
}

// Puts every node in an item. A compute node joins the oldest run of its group that none of its
// predecessors outside the run can be reached from (joining such a run would make the boxes'
// graph cyclic), else it opens a new run. Reachability from runs is tracked as bitsets.
std::vector<Item> collapse(const GraphState& graph, const std::vector<std::uint32_t>& order,
                           const std::vector<std::vector<std::uint32_t>>& pred,
                           const std::vector<std::string>& group_of_node,
                           std::vector<std::uint32_t>& item_of) {
  const std::size_t n = graph.nodes.size();
  std::vector<Item> items;
  std::vector<std::int64_t> run_of_item;             // item -> run index, -1 for communication
  std::vector<std::vector<std::uint64_t>> reach(n);  // node -> runs that reach it
  std::unordered_map<std::string, std::vector<std::uint32_t>> runs_of;  // group -> its runs
  std::size_t runs = 0;
  auto has = [](const std::vector<std::uint64_t>& bits, std::size_t k) {
    return k / 64 < bits.size() && (bits[k / 64] >> (k % 64) & 1) != 0;
  };
  auto set = [](std::vector<std::uint64_t>& bits, std::size_t k) {
    if (bits.size() <= k / 64) bits.resize(k / 64 + 1, 0);
    bits[k / 64] |= std::uint64_t{1} << (k % 64);
  };
  item_of.assign(n, 0);
  std::size_t communication = 0;
  for (const NodeData& node : graph.nodes) communication += node.kind != NodeKind::compute;
  const std::size_t per_run = communication > most_communication_boxes
                                  ? (communication + communication_runs - 1) / communication_runs
                                  : 1;
  auto joinable = [&](std::uint32_t v, std::uint32_t item) {
    const std::size_t run = static_cast<std::size_t>(run_of_item[item]);
    for (std::uint32_t p : pred[v])
      if (item_of[p] != item && has(reach[p], run)) return false;
    return true;
  };
  auto new_run = [&](const std::string& group, bool compute) {
    items.push_back({group, {}, compute});
    run_of_item.push_back(static_cast<std::int64_t>(runs++));
    return static_cast<std::uint32_t>(items.size() - 1);
  };
  std::unordered_map<std::string, std::uint32_t> open_communication;  // group + kind -> item
  for (std::uint32_t v : order) {
    const NodeData& node = graph.nodes[v];
    std::vector<std::uint64_t>& mine = reach[v];
    for (std::uint32_t p : pred[v]) {
      const auto& theirs = reach[p];
      if (mine.size() < theirs.size()) mine.resize(theirs.size(), 0);
      for (std::size_t w = 0; w < theirs.size(); ++w) mine[w] |= theirs[w];
    }
    const std::string& group = group_of_node[v];
    if (node.kind != NodeKind::compute && per_run == 1) {
      item_of[v] = static_cast<std::uint32_t>(items.size());
      items.push_back({group, {v}, false});
      run_of_item.push_back(-1);
      continue;
    }
    if (node.kind != NodeKind::compute) {
      // Consecutive operations only: the open run of its group and kind, while not full.
      const std::string key = group + '\x1f' + std::string(to_string(node.kind));
      auto open = open_communication.find(key);
      std::uint32_t chosen;
      if (open != open_communication.end() && items[open->second].members.size() < per_run &&
          joinable(v, open->second)) {
        chosen = open->second;
      } else {
        chosen = new_run(group, false);
        open_communication[key] = chosen;
      }
      item_of[v] = chosen;
      items[chosen].members.push_back(v);
      set(mine, static_cast<std::size_t>(run_of_item[chosen]));
      continue;
    }
    // The oldest run of its group it can join without a cycle, else a new run.
    auto& candidates = runs_of[group];
    std::uint32_t chosen = 0;
    bool found = false;
    for (std::uint32_t item : candidates)
      if (joinable(v, item)) {
        chosen = item;
        found = true;
        break;
      }
    if (!found) {
      chosen = new_run(group, true);
      candidates.push_back(chosen);
    }
    item_of[v] = chosen;
    items[chosen].members.push_back(v);
    set(mine, static_cast<std::size_t>(run_of_item[chosen]));
  }
  return items;
}

std::string item_label(const GraphState& graph, const DotAnnotations* notes, const Item& item,
                       double total_us) {
  if (item.members.size() == 1) return node_label(graph, notes, item.members.front());
  const bool measured = notes != nullptr && !notes->duration_us.empty();
  if (!item.run) {
    // A run of consecutive communication: what, which issue indices, how many bytes, how.
    const NodeData& first = graph.nodes[item.members.front()];
    std::size_t bytes = 0;
    std::set<std::string> algorithms;
    double exposed = 0;
    for (std::uint32_t v : item.members) {
      bytes += bytes_of(graph.nodes[v]);
      if (notes != nullptr && !notes->algorithm[v].empty()) algorithms.insert(notes->algorithm[v]);
      if (measured && !notes->exposed_us.empty()) exposed += notes->exposed_us[v];
    }
    std::string label =
        std::to_string(item.members.size()) + " x " +
        (first.kind == NodeKind::collective ? std::string(to_string(first.collective.op))
                                            : std::string(to_string(first.kind))) +
        "\\n" + dot_escaped(first.name) + " .. " +
        dot_escaped(graph.nodes[item.members.back()].name) + "\\n" +
        bytes_text(bytes, BytesPrecision::one_decimal);
    if (notes != nullptr && notes->issue_index[item.members.front()] >= 0)
      label += "\\nissue #" + std::to_string(notes->issue_index[item.members.front()]) + " .. #" +
               std::to_string(notes->issue_index[item.members.back()]);
    if (!algorithms.empty()) {
      label += "  algo";
      for (const auto& a : algorithms) label += " " + dot_escaped(a);
    }
    if (measured)
      label += "\\ntimes add up to " + human_time(total_us) + ", exposed " + human_time(exposed);
    return label;
  }
  std::string label = std::to_string(item.members.size()) + " compute nodes\\n" +
                      dot_escaped(graph.nodes[item.members.front()].name) + " .. " +
                      dot_escaped(graph.nodes[item.members.back()].name);
  if (measured) label += "\\ntimes add up to " + human_time(total_us);
  return label;
}

void write_legend(std::ostream& out, bool measured) {
  out << "  subgraph cluster_legend {\n"
      << "    label=\"legend\"; fontsize=10; style=rounded; color=\"#999999\";\n"
      << "    legend_run [shape=box, fillcolor=\"#c6dbef\", label=\"compute run\\n(nodes "
         "collapsed, total time)\"];\n"
      << "    legend_collective [shape=hexagon, fillcolor=\"#fdd0a2\", label=\"collective\\nissue "
         "#, bytes, algorithm, time\"];\n";
  if (measured)
    out << "    legend_exposed [shape=hexagon, fillcolor=\"" << exposed_fill
        << "\", label=\"communication\\nmostly exposed\"];\n"
        << "    legend_critical [shape=box, fillcolor=white, color=\"" << critical_colour
        << "\", penwidth=3, label=\"on the\\ncritical path\"];\n";
  out << "    legend_a [shape=point]; legend_b [shape=point];\n"
      << "    legend_a -> legend_b [label=\" n edges\", penwidth=2];\n"
      << "  }\n";
}

}  // namespace

void write_summary_dot(std::ostream& out, const GraphState& graph, const DotAnnotations* notes) {
  const std::size_t n = graph.nodes.size();
  std::vector<std::vector<std::uint32_t>> succ(n), pred(n);
  for (const auto& [from, to] : graph.edges) {
    succ[from].push_back(to);
    pred[to].push_back(from);
  }
  const auto order = topological_order(graph, succ);
  if (order.empty() && n > 0) return write_full_dot(out, graph, notes);  // a cycle: draw it all
  std::vector<std::uint32_t> item_of;
  const std::vector<Item> items = collapse(graph, order, pred, summary_groups(graph), item_of);

  const bool measured = notes != nullptr && !notes->duration_us.empty();
  std::vector<double> total_us(items.size(), 0), exposed_us(items.size(), 0);
  std::vector<char> critical(items.size(), 0);
  std::set<std::pair<std::uint32_t, std::uint32_t>> critical_edges;
  double exposed_total_us = 0;
  if (measured) {
    for (std::uint32_t k = 0; k < items.size(); ++k)
      for (std::uint32_t v : items[k].members) {
        total_us[k] += notes->duration_us[v];
        if (!notes->exposed_us.empty()) exposed_us[k] += notes->exposed_us[v];
      }
    for (double e : exposed_us) exposed_total_us += e;
    const auto& path = notes->critical_path;
    for (std::size_t k = 0; k < path.size(); ++k) {
      critical[item_of[path[k]]] = 1;
      if (k > 0 && item_of[path[k - 1]] != item_of[path[k]])
        critical_edges.insert({item_of[path[k - 1]], item_of[path[k]]});
    }
  }

  // Left to right: time runs along the page and concurrent collectives stack up and down.
  write_dot_header(out, "LR");
  std::set<std::string> groups;
  for (const Item& item : items) groups.insert(item.group);
  out << "  label=\"summary: " << n << " nodes in " << items.size() << " boxes, " << groups.size()
      << " groups";
  if (measured)
    out << "; critical path " << human_time(notes->critical_path_us)
        << " (red border); exposed communication " << human_time(exposed_total_us) << " (red fill)";
  out << "\";\n  labelloc=t;\n";

  // Clusters in the order their first box appears, so the drawing follows the step.
  std::vector<std::string> group_order;
  std::map<std::string, std::vector<std::uint32_t>> boxes_of;
  for (std::uint32_t k = 0; k < items.size(); ++k) {
    auto [it, fresh] = boxes_of.try_emplace(items[k].group);
    if (fresh) group_order.push_back(items[k].group);
    it->second.push_back(k);
  }
  for (std::size_t g = 0; g < group_order.size(); ++g) {
    const std::string& group = group_order[g];
    const bool cluster = !group.empty();
    if (cluster) {
      std::size_t nodes = 0;
      for (std::uint32_t k : boxes_of[group]) nodes += items[k].members.size();
      out << "  subgraph cluster_" << g << " {\n    label=\"" << dot_escaped(group) << " (" << nodes
          << " nodes)\"; style=rounded; color=\"#888888\"; fontsize=11;\n";
    }
    for (std::uint32_t k : boxes_of[group]) {
      const Item& item = items[k];
      DotStyle style = dot_style(graph.nodes[item.members.front()]);
      const char* fill = style.fill;
      if (!item.run && measured && exposed_us[k] > 0)
        fill = exposed_us[k] > 0.5 * total_us[k] ? exposed_fill : partly_exposed_fill;
      out << (cluster ? "    " : "  ") << "b" << k << " [shape=" << style.shape << ", fillcolor=\""
          << fill << "\", label=\"" << item_label(graph, notes, item, total_us[k]) << "\"";
      if (critical[k]) out << ", color=\"" << critical_colour << "\", penwidth=3";
      out << "];\n";
    }
    if (cluster) out << "  }\n";
  }

  // One edge per pair of boxes, labelled with how many edges it stands for.
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::size_t> bundles;
  for (const auto& [from, to] : graph.edges)
    if (item_of[from] != item_of[to]) ++bundles[{item_of[from], item_of[to]}];
  for (const auto& [pair, count] : bundles) {
    out << "  b" << pair.first << " -> b" << pair.second;
    std::string attributes;
    if (count > 1)
      attributes = "label=\"" + std::to_string(count) +
                   "\", penwidth=" + std::to_string(1 + std::min<std::size_t>(count, 16) / 4);
    if (critical_edges.count(pair) != 0)
      attributes += std::string(attributes.empty() ? "" : ", ") + "color=\"" + critical_colour +
                    "\", penwidth=3";
    if (!attributes.empty()) out << " [" << attributes << "]";
    out << ";\n";
  }
  write_legend(out, measured);
  out << "}\n";
}

}  // namespace loom::detail
