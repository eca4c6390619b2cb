// Graph and Task: building nodes and edges, validation entry points and DOT of the built graph.
#include "loom/graph.hpp"

#include <ostream>
#include <utility>

#include "analysis.hpp"
#include "dot_writer.hpp"
#include "graph_state.hpp"
#include "loom/error.hpp"

namespace loom {

std::string_view to_string(NodeKind kind) noexcept {
  switch (kind) {
    case NodeKind::compute:
      return "compute";
    case NodeKind::collective:
      return "collective";
    case NodeKind::send:
      return "send";
    case NodeKind::recv:
      return "recv";
    case NodeKind::copy:
      return "copy";
    case NodeKind::external:
      return "external";
  }
  return "unknown";
}

namespace detail {

void accesses_of(const NodeData& node, std::vector<Access>& out) {
  const CollectiveArgs& c = node.collective;
  switch (node.kind) {
    case NodeKind::compute:
      for (const Buffer& b : node.reads) out.push_back({b, false});
      for (const Buffer& b : node.writes) out.push_back({b, true});
      return;
    case NodeKind::collective:
      if (c.op == Collective::barrier) return;
      if (c.op == Collective::broadcast) {
        out.push_back({c.send, true});
        return;
      }
      out.push_back({c.send, c.send_is_workspace});
      out.push_back({c.recv, true});
      return;
    case NodeKind::send:
      out.push_back({c.send, false});
      return;
    case NodeKind::recv:
      out.push_back({c.send, true});
      return;
    case NodeKind::copy:
      out.push_back({c.send, false});
      out.push_back({c.recv, true});
      return;
    case NodeKind::external:
      return;
  }
}

std::string describe(const NodeData& node) {
  const CollectiveArgs& c = node.collective;
  auto typed = [](Buffer b) {
    return std::string(to_string(b.dtype())) + "[" + std::to_string(b.count()) + "]";
  };
  switch (node.kind) {
    case NodeKind::compute:
      return node.placement == Placement::gpu ? "compute (gpu)" : "compute";
    case NodeKind::collective: {
      std::string s(to_string(c.op));
      if (c.op == Collective::barrier) return s;
      // Appending piecewise: `" " + std::string(...)` trips GCC 12's false -Wrestrict.
      s += ' ';
      s += typed(c.send);
      if (c.op == Collective::reduce || c.op == Collective::allreduce ||
          c.op == Collective::reduce_scatter) {
        s += ' ';
        s += to_string(c.reduce_op);
      }
      if (c.op == Collective::reduce || c.op == Collective::broadcast)
        s += " root " + std::to_string(c.root);
      return s;
    }
    case NodeKind::send:
      return "send " + typed(c.send) + " to " + std::to_string(node.peer) + " tag " +
             std::to_string(node.tag);
    case NodeKind::recv:
      return "recv " + typed(c.send) + " from " + std::to_string(node.peer) + " tag " +
             std::to_string(node.tag);
    case NodeKind::copy:
      return "copy " + typed(c.send);
    case NodeKind::external:
      return "external (signalled)";
  }
  return "unknown";
}

std::string group_of(const NodeData& node) {
  if (!node.group.empty()) return node.group;
  const auto dot = node.name.find('.');
  return dot == std::string::npos ? std::string() : node.name.substr(0, dot);
}

std::size_t bytes_of(const NodeData& node) {
  const CollectiveArgs& c = node.collective;
  switch (node.kind) {
    case NodeKind::compute:
    case NodeKind::external:
      return 0;
    case NodeKind::collective:
      return c.op == Collective::allgather ? c.recv.bytes() : c.send.bytes();
    default:
      return c.send.bytes();
  }
}

}  // namespace detail

const std::string& Task::name() const {
  if (_graph == nullptr) throw Error(ErrorCode::invalid_argument, "name() of an invalid Task");
  return _graph->nodes[_id].name;
}

NodeKind Task::kind() const {
  if (_graph == nullptr) throw Error(ErrorCode::invalid_argument, "kind() of an invalid Task");
  return _graph->nodes[_id].kind;
}

std::string Task::group() const {
  if (_graph == nullptr) throw Error(ErrorCode::invalid_argument, "group() of an invalid Task");
  return detail::group_of(_graph->nodes[_id]);
}

int Task::priority() const {
  if (_graph == nullptr) throw Error(ErrorCode::invalid_argument, "priority() of an invalid Task");
  return _graph->nodes[_id].priority;
}

const CollectiveArgs& Task::collective() const {
  if (_graph == nullptr)
    throw Error(ErrorCode::invalid_argument, "collective() of an invalid Task");
  return _graph->nodes[_id].collective;
}

void Task::add_successor(Task other) {
  if (_graph == nullptr) {
    std::string message = "precede() on a default-constructed Task";
    if (other.valid()) message += " (towards '" + other.name() + "')";
    throw Error(ErrorCode::invalid_argument, message);
  }
  if (!other.valid()) {
    _graph->bad_edges.push_back({_id, true, "a default-constructed Task"});
  } else if (other._graph != _graph) {
    _graph->bad_edges.push_back({_id, true, "'" + other.name() + "', a task of another graph"});
  } else {
    _graph->edges.emplace_back(_id, other._id);
  }
}

Graph::Graph() : _state(std::make_unique<detail::GraphState>()) {}
Graph::~Graph() = default;
Graph::Graph(Graph&&) noexcept = default;
Graph& Graph::operator=(Graph&&) noexcept = default;

Task Graph::add(detail::NodeData&& node) {
  const auto id = static_cast<std::uint32_t>(_state->nodes.size());
  _state->nodes.push_back(std::move(node));
  return Task(_state.get(), id);
}

namespace {
int checked_priority(int priority, const std::string& name) {
  if (priority < 0)
    throw Error(ErrorCode::invalid_argument,
                "node '" + name + "': priority " + std::to_string(priority) + " is negative");
  return priority;
}
}  // namespace

Task Graph::compute(std::string name, std::function<void()> body, ComputeOptions options) {
  detail::NodeData node;
  node.priority = checked_priority(options.priority, name);
  node.group = std::move(options.group);
  node.name = std::move(name);
  node.kind = NodeKind::compute;
  node.body = std::move(body);
  node.reads = std::move(options.reads);
  node.writes = std::move(options.writes);
  return add(std::move(node));
}

Task Graph::compute_gpu(std::string name, std::function<void(StreamRef)> body,
                        ComputeOptions options) {
  detail::NodeData node;
  node.priority = checked_priority(options.priority, name);
  node.group = std::move(options.group);
  node.name = std::move(name);
  node.kind = NodeKind::compute;
  node.placement = Placement::gpu;
  node.gpu_body = std::move(body);
  node.reads = std::move(options.reads);
  node.writes = std::move(options.writes);
  return add(std::move(node));
}

Task Graph::collective(std::string name, const CollectiveArgs& spec, CommOptions options) {
  detail::NodeData node;
  node.priority = checked_priority(options.priority, name);
  node.group = std::move(options.group);
  node.name = std::move(name);
  node.kind = NodeKind::collective;
  node.collective = spec;
  return add(std::move(node));
}

Task Graph::allreduce(std::string name, Buffer send, Buffer recv, ReduceOp op,
                      CommOptions options) {
  return collective(std::move(name), {Collective::allreduce, send, recv, op, 0}, options);
}

Task Graph::allreduce(std::string name, Buffer buffer, ReduceOp op, CommOptions options) {
  return collective(std::move(name), {Collective::allreduce, buffer, buffer, op, 0}, options);
}

Task Graph::broadcast(std::string name, Buffer buffer, int root, CommOptions options) {
  return collective(std::move(name), {Collective::broadcast, buffer, buffer, ReduceOp::sum, root},
                    options);
}

Task Graph::reduce(std::string name, Buffer send, Buffer recv, ReduceOp op, int root,
                   CommOptions options) {
  return collective(std::move(name), {Collective::reduce, send, recv, op, root}, options);
}

Task Graph::allgather(std::string name, Buffer send, Buffer recv, CommOptions options) {
  return collective(std::move(name), {Collective::allgather, send, recv, ReduceOp::sum, 0},
                    options);
}

Task Graph::reduce_scatter(std::string name, Buffer send, Buffer recv, ReduceOp op,
                           CommOptions options) {
  return collective(std::move(name), {Collective::reduce_scatter, send, recv, op, 0}, options);
}

Task Graph::alltoall(std::string name, Buffer send, Buffer recv, CommOptions options) {
  return collective(std::move(name), {Collective::alltoall, send, recv, ReduceOp::sum, 0}, options);
}

Task Graph::barrier(std::string name, CommOptions options) {
  CollectiveArgs spec;
  spec.op = Collective::barrier;
  spec.send = spec.recv = Buffer(nullptr, 0, DType::uint8);
  return collective(std::move(name), spec, options);
}

namespace {
// A send or recv node: the two differ only in their kind (the buffer is in collective.send).
detail::NodeData point_to_point(NodeKind kind, std::string name, Buffer buffer, int peer, int tag,
                                CommOptions options) {
  detail::NodeData node;
  node.priority = checked_priority(options.priority, name);
  node.group = std::move(options.group);
  node.name = std::move(name);
  node.kind = kind;
  node.collective.send = buffer;
  node.peer = peer;
  node.tag = tag;
  return node;
}
}  // namespace

Task Graph::send(std::string name, Buffer buffer, int peer, int tag, CommOptions options) {
  return add(
      point_to_point(NodeKind::send, std::move(name), buffer, peer, tag, std::move(options)));
}

Task Graph::recv(std::string name, Buffer buffer, int peer, int tag, CommOptions options) {
  return add(
      point_to_point(NodeKind::recv, std::move(name), buffer, peer, tag, std::move(options)));
}

Task Graph::copy(std::string name, Buffer src, Buffer dst, CommOptions options) {
  detail::NodeData node;
  node.priority = checked_priority(options.priority, name);
  node.group = std::move(options.group);
  node.name = std::move(name);
  node.kind = NodeKind::copy;
  node.collective.send = src;
  node.collective.recv = dst;
  return add(std::move(node));
}

Task Graph::external(std::string name, ExternalOptions options) {
  detail::NodeData node;
  node.priority = checked_priority(options.priority, name);
  node.group = std::move(options.group);
  node.name = std::move(name);
  node.kind = NodeKind::external;
  return add(std::move(node));
}

void Graph::add_edge(Task from, Task to) {
  if (from.valid() && from._graph != _state.get()) {
    throw Error(ErrorCode::invalid_argument,
                "add_edge: '" + from.name() + "' is a task of another graph");
  }
  if (!from.valid()) {
    if (to.valid() && to._graph == _state.get())
      _state->bad_edges.push_back({to._id, false, "a default-constructed Task"});
    else
      throw Error(ErrorCode::invalid_argument, "add_edge: neither end is a task of this graph");
    return;
  }
  from.add_successor(to);
}

std::size_t Graph::size() const noexcept {
  return _state->nodes.size();
}
Task Graph::task(std::size_t id) const {
  if (id >= _state->nodes.size())
    throw Error(ErrorCode::invalid_argument, "task(" + std::to_string(id) + ") of a graph of " +
                                                 std::to_string(_state->nodes.size()) + " nodes");
  return Task(_state.get(), static_cast<std::uint32_t>(id));
}

std::vector<std::pair<std::size_t, std::size_t>> Graph::edges() const {
  return {_state->edges.begin(), _state->edges.end()};
}

std::size_t Graph::num_edges() const noexcept {
  return _state->edges.size();
}

Task Graph::find(std::string_view name) const {
  for (std::uint32_t i = 0; i < _state->nodes.size(); ++i)
    if (_state->nodes[i].name == name) return Task(_state.get(), i);
  return {};
}

void Graph::validate() const {
  detail::validate_graph(*_state, 0);
}

void Graph::validate(int world_size) const {
  if (world_size < 1)
    throw Error(ErrorCode::invalid_argument,
                "validate: world size " + std::to_string(world_size) + " must be at least 1");
  detail::validate_graph(*_state, world_size);
}

void Graph::set_group(Task task, std::string group) {
  if (!task.valid() || task._graph != _state.get())
    throw Error(ErrorCode::invalid_argument,
                "Graph::set_group: the task is not a node of this graph (group '" + group + "')");
  _state->nodes[task._id].group = std::move(group);
}

std::vector<std::size_t> Graph::topological_order() const {
  detail::check_acyclic(*_state);
  const std::vector<std::uint32_t> order = detail::schedule_order(*_state);
  return {order.begin(), order.end()};
}

void Graph::dump_dot(std::ostream& out, DotOptions options) const {
  detail::write_dot(out, *_state, nullptr, options);
}

}  // namespace loom
