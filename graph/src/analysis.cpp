// Graph analyses on Boost.Graph: validation (structure, cycles, collectives, races), the
// deterministic schedule order and the critical path of a measured run.
#include "analysis.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <queue>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/breadth_first_search.hpp>
#include <boost/graph/dag_shortest_paths.hpp>
#include <boost/graph/filtered_graph.hpp>
#include <boost/graph/strong_components.hpp>

#include "loom/error.hpp"

namespace loom::detail {
namespace {

using Digraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS>;
using Vertex = Digraph::vertex_descriptor;

Digraph to_boost(const GraphState& graph) {
  Digraph g(graph.nodes.size());
  for (const auto& [from, to] : graph.edges) boost::add_edge(from, to, g);
  return g;
}

[[noreturn]] void invalid(const std::string& message) {
  throw Error(ErrorCode::graph_invalid, message);
}

std::string quoted(const NodeData& node) {
  return "'" + node.name + "'";
}

bool reduces(Collective op) {
  return op == Collective::reduce || op == Collective::allreduce ||
         op == Collective::reduce_scatter;
}

// Checks one collective's buffers against its op and the world size.
void check_collective(const NodeData& node, int world) {
  const CollectiveArgs& c = node.collective;
  auto fail = [&](const std::string& what) {
    invalid(std::string(to_string(c.op)) + " node " + quoted(node) + ": " + what);
  };
  auto count = [](Buffer b) { return std::to_string(b.count()); };
  for (auto [role, b] : {std::pair{"send", c.send}, std::pair{"recv", c.recv}})
    if (b.data() == nullptr && b.count() != 0)
      fail(std::string(role) + " buffer is null with count " + count(b));
  if (c.op == Collective::barrier) return;
  const bool rooted = c.op == Collective::broadcast || c.op == Collective::reduce;
  if (rooted && (c.root < 0 || (world > 0 && c.root >= world)))
    fail("root " + std::to_string(c.root) + " is out of range [0, " +
         (world > 0 ? std::to_string(world) : std::string("world size")) + ")");
  if (c.op == Collective::broadcast) return;
  const bool has_recv = !(c.op == Collective::reduce && c.recv.empty());
  if (has_recv && c.send.dtype() != c.recv.dtype())
    fail("send " + c.send.describe() + " and recv " + c.recv.describe() + " have different dtypes");
  if (reduces(c.op) && !supports(c.reduce_op, c.send.dtype()))
    fail(unsupported_message(c.reduce_op, c.send.dtype()));
  const auto w = static_cast<std::size_t>(world > 0 ? world : 1);
  switch (c.op) {
    case Collective::allreduce:
    case Collective::reduce:
      if (has_recv && c.recv.count() != c.send.count())
        fail("recv count " + count(c.recv) + " differs from send count " + count(c.send));
      return;
    case Collective::allgather:
      if (world > 0 && c.recv.count() != c.send.count() * w)
        fail("recv count " + count(c.recv) + " must be send count " + count(c.send) + " x " +
             std::to_string(w) + " ranks = " + std::to_string(c.send.count() * w));
      return;
    case Collective::reduce_scatter:
      if (world > 0 && c.send.count() != c.recv.count() * w)
        fail("send count " + count(c.send) + " must be recv count " + count(c.recv) + " x " +
             std::to_string(w) + " ranks = " + std::to_string(c.recv.count() * w));
      return;
    case Collective::alltoall:
      if (c.send.count() != c.recv.count())
        fail("recv count " + count(c.recv) + " differs from send count " + count(c.send));
      if (world > 0 && c.send.count() % w != 0)
        fail("count " + count(c.send) + " does not divide by " + std::to_string(w) + " ranks");
      return;
    default:
      return;
  }
}

}  // namespace

void check_structure(const GraphState& graph) {
  if (!graph.bad_edges.empty()) {
    const BadEdge& e = graph.bad_edges.front();
    const NodeData& node = graph.nodes[e.node];
    invalid("dangling edge " + std::string(e.outgoing ? "from " : "to ") + quoted(node) +
            (e.outgoing ? " to " : " from ") + e.problem);
  }
  for (const auto& [from, to] : graph.edges)
    if (from == to)
      invalid("self edge: node " + quoted(graph.nodes[from]) + " has an edge to itself");
  std::unordered_map<std::string_view, std::uint32_t> names;
  names.reserve(graph.nodes.size());
  for (std::uint32_t i = 0; i < graph.nodes.size(); ++i) {
    const NodeData& node = graph.nodes[i];
    if (node.name.empty()) invalid("node #" + std::to_string(i) + " has an empty name");
    auto [it, inserted] = names.emplace(node.name, i);
    if (!inserted)
      invalid("duplicate name: nodes #" + std::to_string(it->second) + " and #" +
              std::to_string(i) + " are both named " + quoted(node) + " (names must be unique)");
  }
}

void check_acyclic(const GraphState& graph) {
  const Digraph g = to_boost(graph);
  const std::size_t n = boost::num_vertices(g);
  std::vector<int> component(n);
  const int components = boost::strong_components(
      g, boost::make_iterator_property_map(component.begin(), boost::get(boost::vertex_index, g)));
  if (static_cast<std::size_t>(components) == n) return;  // every component is one vertex
  std::vector<std::size_t> sizes(components, 0);
  for (int c : component) ++sizes[c];
  Vertex start = 0;
  while (sizes[component[start]] < 2) ++start;
  // One simple cycle through `start`: the shortest path from start back to one of its
  // predecessors in the same strongly connected component, found by BFS inside it.
  const int scc = component[start];
  // Boost wants a default-constructible, assignable predicate: no lambda.
  struct InComponent {
    const std::vector<int>* component = nullptr;
    int id = 0;
    bool operator()(Vertex v) const { return (*component)[v] == id; }
  };
  const InComponent in_scc{&component, scc};
  boost::filtered_graph<Digraph, boost::keep_all, InComponent> inside(g, boost::keep_all(), in_scc);
  std::vector<Vertex> parent(n, std::numeric_limits<Vertex>::max());
  parent[start] = start;
  boost::breadth_first_search(
      inside, start,
      boost::visitor(boost::make_bfs_visitor(boost::record_predecessors(
          boost::make_iterator_property_map(parent.begin(), boost::get(boost::vertex_index, g)),
          boost::on_tree_edge()))));
  Vertex last = start;
  for (const auto& [from, to] : graph.edges)
    if (to == start && in_scc(from) && parent[from] != std::numeric_limits<Vertex>::max()) {
      last = from;
      break;
    }
  std::vector<Vertex> path;
  for (Vertex v = last; v != start; v = parent[v]) path.push_back(v);
  path.push_back(start);
  std::reverse(path.begin(), path.end());
  std::string text;
  for (Vertex v : path) text += quoted(graph.nodes[v]) + " -> ";
  text += quoted(graph.nodes[start]);
  invalid("cycle: " + text + " (" + std::to_string(sizes[scc]) +
          " nodes are on cycles in this strongly connected component)");
}

void check_communication(const GraphState& graph, int world_size) {
  for (const NodeData& node : graph.nodes) {
    switch (node.kind) {
      case NodeKind::collective:
        check_collective(node, world_size);
        break;
      case NodeKind::send:
      case NodeKind::recv: {
        const std::string what = std::string(to_string(node.kind)) + " node " + quoted(node);
        if (node.peer < 0 || (world_size > 0 && node.peer >= world_size))
          invalid(what + ": peer " + std::to_string(node.peer) + " is out of range [0, " +
                  (world_size > 0 ? std::to_string(world_size) : std::string("world size")) + ")");
        if (node.tag < 0) invalid(what + ": tag " + std::to_string(node.tag) + " is negative");
        if (node.collective.send.data() == nullptr && node.collective.send.count() != 0)
          invalid(what + ": buffer is null with count " +
                  std::to_string(node.collective.send.count()));
        break;
      }
      case NodeKind::copy: {
        const Buffer src = node.collective.send, dst = node.collective.recv;
        if (src.bytes() != dst.bytes())
          invalid("copy node " + quoted(node) + ": src " + src.describe() + " has " +
                  std::to_string(src.bytes()) + " bytes but dst " + dst.describe() + " has " +
                  std::to_string(dst.bytes()));
        if ((src.data() == nullptr || dst.data() == nullptr) && src.bytes() != 0)
          invalid("copy node " + quoted(node) + ": a buffer is null");
        break;
      }
      case NodeKind::external:
        break;
      case NodeKind::compute:
        if (node.placement == Placement::cpu && !node.body)
          invalid("compute node " + quoted(node) + " has an empty body");
        if (node.placement == Placement::gpu && !node.gpu_body)
          invalid("compute node " + quoted(node) + " has an empty body");
        break;
    }
  }
}

std::vector<std::uint32_t> schedule_order(const GraphState& graph) {
  // Kahn's algorithm with a priority queue. Boost's topological_sort is depth-first and gives
  // no say over ties; the issue order must break ties by priority, then insertion order, so
  // that it is the same on every rank and front layers go first.
  const auto n = static_cast<std::uint32_t>(graph.nodes.size());
  std::vector<std::uint32_t> offsets(n + 1, 0), targets(graph.edges.size()), indegree(n, 0);
  for (const auto& [from, to] : graph.edges) {
    ++offsets[from + 1];
    ++indegree[to];
  }
  for (std::uint32_t i = 0; i < n; ++i) offsets[i + 1] += offsets[i];
  {
    std::vector<std::uint32_t> fill(offsets.begin(), offsets.end() - 1);
    for (const auto& [from, to] : graph.edges) targets[fill[from]++] = to;
  }
  auto later = [&](std::uint32_t a, std::uint32_t b) {
    const int pa = graph.nodes[a].priority, pb = graph.nodes[b].priority;
    return pa != pb ? pa < pb : a > b;
  };
  using Queue = std::priority_queue<std::uint32_t, std::vector<std::uint32_t>, decltype(later)>;
  // Nodes other than collectives are taken as soon as they are ready, so a collective waits
  // only for the collectives it depends on: the collectives' order is then topological among
  // themselves with ties broken by priority, not by how deep their compute ancestors are.
  Queue other(later), collectives(later);
  auto push = [&](std::uint32_t v) {
    (graph.nodes[v].kind == NodeKind::collective ? collectives : other).push(v);
  };
  for (std::uint32_t i = 0; i < n; ++i)
    if (indegree[i] == 0) push(i);
  std::vector<std::uint32_t> order;
  order.reserve(n);
  while (!other.empty() || !collectives.empty()) {
    Queue& from = other.empty() ? collectives : other;
    const std::uint32_t v = from.top();
    from.pop();
    order.push_back(v);
    for (std::uint32_t e = offsets[v]; e < offsets[v + 1]; ++e)
      if (--indegree[targets[e]] == 0) push(targets[e]);
  }
  if (order.size() != n) throw Error(ErrorCode::internal, "schedule_order on a cyclic graph");
  return order;
}

void check_races(const GraphState& graph, const std::vector<std::uint32_t>& order) {
  struct Range {
    std::uintptr_t lo, hi;
    Device device;
    std::uint32_t node;
    bool write;
    Buffer buffer;
  };
  std::vector<Range> ranges;
  std::vector<Access> scratch;
  for (std::uint32_t i = 0; i < graph.nodes.size(); ++i) {
    scratch.clear();
    accesses_of(graph.nodes[i], scratch);
    for (const Access& a : scratch) {
      if (a.buffer.bytes() == 0 || a.buffer.data() == nullptr) continue;
      const auto lo = reinterpret_cast<std::uintptr_t>(a.buffer.data());
      ranges.push_back({lo, lo + a.buffer.bytes(), a.buffer.device(), i, a.write, a.buffer});
    }
  }
  if (ranges.empty()) return;
  auto key = [](const Range& r) {
    return std::tuple(static_cast<int>(r.device.kind), r.device.index, r.lo);
  };
  std::sort(ranges.begin(), ranges.end(),
            [&](const Range& a, const Range& b) { return key(a) < key(b); });

  std::vector<std::uint32_t> position(graph.nodes.size());
  for (std::uint32_t p = 0; p < order.size(); ++p) position[order[p]] = p;
  const Digraph g = to_boost(graph);
  std::unordered_map<std::uint32_t, std::vector<boost::default_color_type>> reach;
  auto reaches = [&](std::uint32_t from, std::uint32_t to) {
    auto [it, fresh] = reach.try_emplace(from);
    if (fresh) {
      it->second.assign(graph.nodes.size(), boost::white_color);
      boost::breadth_first_visit(g, from,
                                 boost::color_map(boost::make_iterator_property_map(
                                     it->second.begin(), boost::get(boost::vertex_index, g))));
    }
    return it->second[to] != boost::white_color;
  };

  std::vector<const Range*> active;
  for (const Range& r : ranges) {
    std::erase_if(active, [&](const Range* a) { return a->device != r.device || a->hi <= r.lo; });
    for (const Range* a : active) {
      if (a->node == r.node || !(a->write || r.write)) continue;
      std::uint32_t first = a->node, second = r.node;
      if (position[first] > position[second]) std::swap(first, second);
      if (reaches(first, second)) continue;
      const Range& w = a->write ? *a : r;
      const Range& o = a->write ? r : *a;
      const std::uintptr_t lo = std::max(a->lo, r.lo), hi = std::min(a->hi, r.hi);
      std::ostringstream text;
      text << "data race: nodes " << quoted(graph.nodes[w.node]) << " and "
           << quoted(graph.nodes[o.node]) << " may run concurrently (no path between them) and "
           << quoted(graph.nodes[w.node]) << " writes bytes that " << quoted(graph.nodes[o.node])
           << (o.write ? " also writes" : " reads") << " (" << (hi - lo) << " bytes at offset "
           << (lo - w.lo) << " of " << w.buffer.describe() << "); add an edge to order them";
      invalid(text.str());
    }
    active.push_back(&r);
  }
}

std::vector<std::uint32_t> critical_path(const GraphState& graph,
                                         const std::vector<double>& weights) {
  // Longest path in a DAG = shortest path with negated weights, from a virtual source that
  // precedes every node; edge u->v carries -weight(v).
  using Weighted =
      boost::adjacency_list<boost::vecS, boost::vecS, boost::directedS, boost::no_property,
                            boost::property<boost::edge_weight_t, double>>;
  const std::size_t n = graph.nodes.size();
  if (n == 0) return {};
  Weighted g(n + 1);
  const std::size_t source = n;
  for (const auto& [from, to] : graph.edges) boost::add_edge(from, to, -weights[to], g);
  for (std::size_t v = 0; v < n; ++v) boost::add_edge(source, v, -weights[v], g);
  std::vector<double> distance(n + 1);
  std::vector<std::size_t> parent(n + 1);
  auto index = boost::get(boost::vertex_index, g);
  boost::dag_shortest_paths(
      g, source,
      boost::distance_map(boost::make_iterator_property_map(distance.begin(), index))
          .predecessor_map(boost::make_iterator_property_map(parent.begin(), index)));
  std::size_t end = 0;
  for (std::size_t v = 1; v < n; ++v)
    if (distance[v] < distance[end]) end = v;
  std::vector<std::uint32_t> path;
  for (std::size_t v = end; v != source; v = parent[v]) {
    path.push_back(static_cast<std::uint32_t>(v));
    if (parent[v] == v) break;
  }
  std::reverse(path.begin(), path.end());
  return path;
}

void validate_graph(const GraphState& graph, int world_size) {
  check_structure(graph);
  check_acyclic(graph);
  check_communication(graph, world_size);
  check_races(graph, schedule_order(graph));
}

}  // namespace loom::detail
