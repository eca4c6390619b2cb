// Graph: the nodes (compute, collective, send/recv, copy) and edges of one step, and Task handles.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/buffer.hpp"
#include "loom/collective.hpp"
#include "loom/dtype.hpp"

namespace loom {

class Graph;
class Executor;
namespace detail {
struct GraphState;
struct NodeData;
}  // namespace detail

/// @brief What a node does. `external`: work done outside the executor (an autograd engine, a
/// data loader), which completes the node with Executor::signal.
enum class NodeKind : unsigned char { compute, collective, send, recv, copy, external };

std::string_view to_string(NodeKind kind) noexcept;

/// @brief Whether a node of `kind` talks to other ranks (collective, send, recv).
constexpr bool communicates(NodeKind kind) noexcept {
  return kind == NodeKind::collective || kind == NodeKind::send || kind == NodeKind::recv;
}

/// @brief Where a compute node runs.
enum class Placement : unsigned char { cpu, gpu };

/// @brief The stream a GPU compute node enqueues its kernels on (a cudaStream_t).
struct StreamRef {
  void* native = nullptr;
  int device = 0;
};

/// @brief Options of a compute node. `reads`/`writes` declare the memory the body touches, so
/// validation can find data races between nodes that may run concurrently.
struct ComputeOptions {
  /// @brief Higher runs earlier among ready nodes (tbb::flow::node_priority_t); >= 0.
  int priority = 0;
  std::vector<Buffer> reads;
  std::vector<Buffer> writes;
  /// @brief What the node belongs to ("layer 3", "bucket 2", "optimizer"): the summary DOT
  /// draws one cluster per group. Empty: the part of the name before its first '.', if any.
  std::string group;
};

/// @brief Options of a communication or copy node.
struct CommOptions {
  /// @brief Higher is issued earlier among collectives that are unordered by edges. It shapes
  /// the issue order fixed at compile time, identically on every rank.
  int priority = 0;
  /// @brief As ComputeOptions::group.
  std::string group;
};

/// @brief Options of an external node (Graph::external).
struct ExternalOptions {
  /// @brief As ComputeOptions::priority.
  int priority = 0;
  /// @brief As ComputeOptions::group.
  std::string group;
};

/// @brief How much of the graph Graph::dump_dot and Executor::dump_dot draw.
enum class DotDetail : unsigned char {
  automatic,  ///< full up to DotOptions::summary_above nodes, summary above
  full,       ///< every node and edge
  summary,    ///< clusters per group, compute runs collapsed, edges bundled, collectives kept
};

/// @brief Options of the DOT output.
struct DotOptions {
  DotDetail detail = DotDetail::automatic;
  std::size_t summary_above = 300;
};

/// @brief A cheap, copyable handle of one node of a Graph.
class Task {
 public:
  Task() = default;

  /// @brief Makes this task run before each of `others`; returns *this for chaining.
  template <class... Tasks>
  Task& precede(Task other, Tasks... others) {
    add_successor(other);
    (add_successor(others), ...);
    return *this;
  }
  /// @brief Makes this task run after each of `others`.
  template <class... Tasks>
  Task& succeed(Task other, Tasks... others) {
    other.add_successor(*this);
    (others.add_successor(*this), ...);
    return *this;
  }

  bool valid() const noexcept { return _graph != nullptr; }
  /// @brief Position in insertion order (0, 1, ...).
  std::size_t id() const noexcept { return _id; }
  const std::string& name() const;
  NodeKind kind() const;
  /// @brief The node's group: as given in its options, else the part of its name before the
  /// first '.', else "".
  std::string group() const;
  /// @brief The priority it was added with (ComputeOptions or CommOptions).
  int priority() const;
  /// @brief Communication and copy nodes: their arguments (copy: send = src, recv = dst;
  /// send/recv: send is the buffer). Compute nodes: default arguments.
  const CollectiveArgs& collective() const;

  friend bool operator==(const Task& a, const Task& b) noexcept {
    return a._graph == b._graph && a._id == b._id;
  }

 private:
  friend class Graph;
  Task(detail::GraphState* graph, std::uint32_t id) : _graph(graph), _id(id) {}
  void add_successor(Task other);

  detail::GraphState* _graph = nullptr;
  std::uint32_t _id = 0;
};

/// @brief A directed acyclic graph of compute and communication nodes describing one step.
///
/// Build it once, then Executor::compile it. Names must be unique; errors in the graph
/// (cycles, dangling or self edges, duplicate names, collectives whose buffers do not fit the
/// operation, data races) are reported by validate() and by Executor::compile as
/// ErrorCode::graph_invalid naming the nodes involved.
class Graph {
 public:
  Graph();
  ~Graph();
  Graph(Graph&&) noexcept;
  Graph& operator=(Graph&&) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  /// @brief A CPU compute node running `body` on a TBB worker.
  Task compute(std::string name, std::function<void()> body, ComputeOptions options = {});
  /// @brief A GPU compute node: `body` enqueues its work on the stream it is given.
  Task compute_gpu(std::string name, std::function<void(StreamRef)> body,
                   ComputeOptions options = {});

  /// @brief Any collective (see Backend for the buffer semantics of each op).
  Task collective(std::string name, const CollectiveArgs& spec, CommOptions options = {});
  Task allreduce(std::string name, Buffer send, Buffer recv, ReduceOp op = ReduceOp::sum,
                 CommOptions options = {});
  /// @brief In-place allreduce.
  Task allreduce(std::string name, Buffer buffer, ReduceOp op = ReduceOp::sum,
                 CommOptions options = {});
  Task broadcast(std::string name, Buffer buffer, int root, CommOptions options = {});
  Task reduce(std::string name, Buffer send, Buffer recv, ReduceOp op, int root,
              CommOptions options = {});
  Task allgather(std::string name, Buffer send, Buffer recv, CommOptions options = {});
  Task reduce_scatter(std::string name, Buffer send, Buffer recv, ReduceOp op = ReduceOp::sum,
                      CommOptions options = {});
  Task alltoall(std::string name, Buffer send, Buffer recv, CommOptions options = {});
  Task barrier(std::string name, CommOptions options = {});

  /// @brief Sends `buffer` to `peer`. Sends (and receives) on one (peer, tag) are issued in an
  /// order fixed at compile time, so messages match the same way on every run.
  Task send(std::string name, Buffer buffer, int peer, int tag = 0, CommOptions options = {});
  Task recv(std::string name, Buffer buffer, int peer, int tag = 0, CommOptions options = {});
  /// @brief Copies src into dst (same byte size) on a TBB worker.
  Task copy(std::string name, Buffer src, Buffer dst, CommOptions options = {});

  /// @brief A node completed from outside the executor: a run reaches it when its predecessors
  /// are done and passes it once Executor::signal names it (a signal that comes first is kept
  /// until then). No thread waits for it; profiling records when it became ready and when it
  /// was signalled, so the trace and DOT show the outside work as it happened.
  Task external(std::string name, ExternalOptions options = {});

  /// @brief `from` runs before `to` (same as from.precede(to)).
  void add_edge(Task from, Task to);

  std::size_t size() const noexcept;
  std::size_t num_edges() const noexcept;
  /// @brief The task named `name`, or an invalid Task.
  Task find(std::string_view name) const;
  /// @brief The task with id `id` (insertion order); ErrorCode::invalid_argument past size().
  Task task(std::size_t id) const;
  /// @brief The edges (from id, to id) in the order they were added.
  std::vector<std::pair<std::size_t, std::size_t>> edges() const;

  /// @brief Checks everything that does not depend on the world size; throws
  /// ErrorCode::graph_invalid naming the offending nodes.
  void validate() const;
  /// @brief Also checks collectives against `world_size` (counts, roots, peers).
  void validate(int world_size) const;

  /// @brief Task ids in the executor's deterministic schedule order: a topological order, ties
  /// broken by priority, then insertion order (the same on every rank for the same graph).
  /// The order Executor fixes collectives' issue indices in and the bucketer's ready order uses.
  /// ErrorCode::graph_invalid naming a cycle.
  std::vector<std::size_t> topological_order() const;

  /// @brief Puts `task` in `group` (see ComputeOptions::group).
  void set_group(Task task, std::string group);

  /// @brief Graphviz DOT of the graph as built (no issue indices: see Executor::dump_dot).
  void dump_dot(std::ostream& out, DotOptions options = {}) const;

 private:
  friend class Executor;
  friend class Task;
  Task add(detail::NodeData&& node);
  std::unique_ptr<detail::GraphState> _state;
};

}  // namespace loom
