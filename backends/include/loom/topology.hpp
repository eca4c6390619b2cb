// Topology: which ranks share a node (and its memory), each node's ranks and its leader.
#pragma once

#include <span>
#include <string>
#include <vector>

namespace loom {

/// @brief Where the ranks of a world run: the node of every rank, each node's ranks in rank
/// order, and each node's leader (its lowest rank). Nodes are numbered by their leaders, so
/// node 0 holds rank 0; the same value on every rank. Ranks per node may differ.
///
/// `Backend::topology()` gives a backend's: MPI from `MPI_Comm_split_type(SHARED)`, the local
/// backend one node unless its `LocalWorld` was given another.
class Topology {
 public:
  /// @brief The topology in which rank r runs on the node named `node_ids[r]` (any integers:
  /// ranks with the same id share a node). Throws ErrorCode::invalid_argument when empty.
  static Topology from_node_ids(std::span<const int> node_ids);
  /// @brief Every rank on one node (threads of one process, one host).
  static Topology single_node(int world_size);
  /// @brief Every rank its own node: nothing known to share memory.
  static Topology node_per_rank(int world_size);
  /// @brief Ranks in blocks of `ranks_per_node` (0..k-1 on node 0, ...); the last node holds
  /// the remainder when it does not divide `world_size`.
  static Topology blocks(int world_size, int ranks_per_node);
  /// @brief The same topology with each node named (its host name): `name_of_rank[r]` is rank
  /// r's. Throws ErrorCode::invalid_argument when the count differs from the world size or two
  /// ranks of one node give different names.
  Topology with_node_names(std::span<const std::string> name_of_rank) const;

  int world_size() const noexcept { return static_cast<int>(_node_of.size()); }
  int node_count() const noexcept { return static_cast<int>(_ranks_of_node.size()); }
  /// @brief The node of `rank` (0..node_count()-1).
  int node_of(int rank) const;
  /// @brief `rank`'s index among the ranks of its node (0 for the leader).
  int local_rank(int rank) const;
  /// @brief The ranks of `node`, ascending.
  std::span<const int> ranks_of_node(int node) const;
  /// @brief The lowest rank of `node`.
  int leader_of_node(int node) const { return ranks_of_node(node).front(); }
  /// @brief Every node's leader, by node.
  std::vector<int> leaders() const;
  /// @brief The name of `node` (its host name under MPI), "" where none was given.
  const std::string& node_name(int node) const;
  /// @brief "node 1 (host-b)", or "node 1" without a name: how messages name a node.
  std::string node_label(int node) const;
  /// @brief Whether every node holds the same number of ranks.
  bool uniform() const noexcept;
  /// @brief "2 nodes: {0,1} {2,3}".
  std::string describe() const;

  friend bool operator==(const Topology&, const Topology&) = default;

 private:
  std::vector<int> _node_of;
  std::vector<int> _local_rank;
  std::vector<std::vector<int>> _ranks_of_node;
  std::vector<std::string> _node_names;  // by node; empty: none given
};

}  // namespace loom
