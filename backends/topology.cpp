// Topology (built from each rank's node id) and Backend::topology, which gives a backend's.
#include "loom/topology.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "loom/backend.hpp"
#include "loom/error.hpp"

namespace loom {
namespace {

void check_world_size(int world_size, const char* what) {
  if (world_size < 1)
    throw Error(ErrorCode::invalid_argument, std::string("Topology::") + what +
                                                 ": the world size must be at least 1, got " +
                                                 std::to_string(world_size));
}

}  // namespace

Topology Topology::from_node_ids(std::span<const int> node_ids) {
  if (node_ids.empty())
    throw Error(ErrorCode::invalid_argument, "Topology::from_node_ids: no ranks");
  Topology t;
  std::map<int, int> node_of_id;  // first appearance in rank order = numbering by leader
  t._node_of.reserve(node_ids.size());
  t._local_rank.reserve(node_ids.size());
  for (int rank = 0; rank < static_cast<int>(node_ids.size()); ++rank) {
    const auto [it, added] = node_of_id.try_emplace(node_ids[rank], t.node_count());
    if (added) t._ranks_of_node.emplace_back();
    auto& ranks = t._ranks_of_node[it->second];
    t._node_of.push_back(it->second);
    t._local_rank.push_back(static_cast<int>(ranks.size()));
    ranks.push_back(rank);
  }
  return t;
}

Topology Topology::single_node(int world_size) {
  check_world_size(world_size, "single_node");
  return from_node_ids(std::vector<int>(world_size, 0));
}

Topology Topology::node_per_rank(int world_size) {
  check_world_size(world_size, "node_per_rank");
  std::vector<int> ids(world_size);
  for (int r = 0; r < world_size; ++r) ids[r] = r;
  return from_node_ids(ids);
}

Topology Topology::blocks(int world_size, int ranks_per_node) {
  check_world_size(world_size, "blocks");
  if (ranks_per_node < 1)
    throw Error(ErrorCode::invalid_argument,
                "Topology::blocks: ranks per node must be at least 1, got " +
                    std::to_string(ranks_per_node));
  std::vector<int> ids(world_size);
  for (int r = 0; r < world_size; ++r) ids[r] = r / ranks_per_node;
  return from_node_ids(ids);
}

int Topology::node_of(int rank) const {
  if (rank < 0 || rank >= world_size())
    throw Error(ErrorCode::invalid_argument, "Topology::node_of: rank " + std::to_string(rank) +
                                                 " is out of range [0, " +
                                                 std::to_string(world_size()) + ")");
  return _node_of[rank];
}

int Topology::local_rank(int rank) const {
  node_of(rank);  // the range check
  return _local_rank[rank];
}

namespace {

void check_node(const char* who, int node, int nodes) {
  if (node < 0 || node >= nodes)
    throw Error(ErrorCode::invalid_argument, std::string(who) + ": node " + std::to_string(node) +
                                                 " is out of range [0, " + std::to_string(nodes) +
                                                 ")");
}

}  // namespace

std::span<const int> Topology::ranks_of_node(int node) const {
  check_node("Topology::ranks_of_node", node, node_count());
  return _ranks_of_node[node];
}

Topology Topology::with_node_names(std::span<const std::string> name_of_rank) const {
  if (static_cast<int>(name_of_rank.size()) != world_size())
    throw Error(ErrorCode::invalid_argument,
                "Topology::with_node_names: " + std::to_string(name_of_rank.size()) +
                    " names for " + std::to_string(world_size()) + " ranks");
  Topology t = *this;
  t._node_names.assign(_ranks_of_node.size(), "");
  for (int node = 0; node < node_count(); ++node) {
    const int leader = _ranks_of_node[node].front();
    for (int r : _ranks_of_node[node])
      if (name_of_rank[r] != name_of_rank[leader])
        throw Error(ErrorCode::invalid_argument,
                    "Topology::with_node_names: rank " + std::to_string(r) + " names node " +
                        std::to_string(node) + " '" + name_of_rank[r] + "' but rank " +
                        std::to_string(leader) + " names it '" + name_of_rank[leader] + "'");
    t._node_names[node] = name_of_rank[leader];
  }
  return t;
}

const std::string& Topology::node_name(int node) const {
  static const std::string none;
  check_node("Topology::node_name", node, node_count());
  return _node_names.empty() ? none : _node_names[node];
}

std::string Topology::node_label(int node) const {
  const std::string& name = node_name(node);
  return "node " + std::to_string(node) + (name.empty() ? "" : " (" + name + ")");
}

std::vector<int> Topology::leaders() const {
  std::vector<int> leaders;
  leaders.reserve(_ranks_of_node.size());
  for (const auto& ranks : _ranks_of_node) leaders.push_back(ranks.front());
  return leaders;
}

bool Topology::uniform() const noexcept {
  for (const auto& ranks : _ranks_of_node) {
    if (ranks.size() != _ranks_of_node.front().size()) return false;
  }
  return true;
}

std::string Topology::describe() const {
  std::string text = std::to_string(node_count()) + (node_count() == 1 ? " node:" : " nodes:");
  for (const auto& ranks : _ranks_of_node) {
    text += " {";
    for (std::size_t k = 0; k < ranks.size(); ++k) {
      if (k > 0) text += ',';
      text += std::to_string(ranks[k]);
    }
    text += '}';
    if (!_node_names.empty() && !_node_names[&ranks - _ranks_of_node.data()].empty())
      text += " on " + _node_names[&ranks - _ranks_of_node.data()];
  }
  return text;
}

const Topology& Backend::topology() const {
  std::call_once(_topology_default, [this] {
    if (!_topology)
      _topology = std::make_shared<const Topology>(Topology::node_per_rank(world_size()));
  });
  return *_topology;
}

void Backend::set_topology(Topology topology) {
  _topology = std::make_shared<const Topology>(std::move(topology));
}

}  // namespace loom
