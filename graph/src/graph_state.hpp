// GraphState: the stored nodes and edges behind Graph and Task (shared by graph/ sources only).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "loom/graph.hpp"

namespace loom::detail {

/// @brief One node as the user declared it.
struct NodeData {
  std::string name;
  std::string group;  ///< as declared; group_of() applies the default
  NodeKind kind = NodeKind::compute;
  Placement placement = Placement::cpu;
  int priority = 0;
  std::function<void()> body;               ///< compute on CPU
  std::function<void(StreamRef)> gpu_body;  ///< compute on GPU
  /// collective: its arguments; send/recv: `send` is the buffer; copy: send = src, recv = dst.
  CollectiveArgs collective;
  int peer = 0;
  int tag = 0;
  std::vector<Buffer> reads;   ///< compute: as declared
  std::vector<Buffer> writes;  ///< compute: as declared
};

/// @brief An edge that could not be stored because one end is not a node of this graph.
struct BadEdge {
  std::uint32_t node;   ///< the end that is in this graph
  bool outgoing;        ///< node -> foreign (true) or foreign -> node
  std::string problem;  ///< "a default-constructed Task", "a task of another graph"
};

struct GraphState {
  std::vector<NodeData> nodes;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> edges;  ///< (from, to)
  std::vector<BadEdge> bad_edges;
};

/// @brief A range of memory a node reads or writes.
struct Access {
  Buffer buffer;
  bool write;
};

/// @brief The memory `node` reads and writes (collectives: send read, recv written).
void accesses_of(const NodeData& node, std::vector<Access>& out);

/// @brief "allreduce float32[1024] sum", "send float32[8] to 1 tag 0", "compute".
std::string describe(const NodeData& node);

/// @brief The node's group: as declared, else its name up to the first '.', else "".
std::string group_of(const NodeData& node);

/// @brief Bytes the node moves (0 for compute).
std::size_t bytes_of(const NodeData& node);

}  // namespace loom::detail
