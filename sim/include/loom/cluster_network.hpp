// ClusterNetwork: a two-level network (a node's shared memory, each node's link) and what each
// of loom's collective algorithms costs on it, replayed message by message.
#pragma once

#include <cstddef>

#include "loom/algorithm.hpp"
#include "loom/topology.hpp"

namespace loom {

/// @brief Nodes of ranks: inside a node the ranks share its memory (every intra-node message of
/// the node moves through it, at `intra_bytes_per_s` for all of them together); between nodes
/// every message crosses the sender's link out and the receiver's link in, each way at
/// `link_bytes_per_s` for all of the node's ranks together (a full-duplex NIC, or the emulated
/// cluster's tbf-shaped veth).
struct ClusterNetwork {
  Topology topology = Topology::single_node(1);
  double link_bytes_per_s = 0;   ///< each node's link, each way
  double link_latency_s = 0;     ///< alpha of a message between nodes
  double intra_bytes_per_s = 0;  ///< a node's memory, for all its ranks' messages together
  double intra_latency_s = 0;    ///< alpha of a message inside a node
  double gamma_s_per_byte = 0;   ///< a rank's reduction, per byte reduced

  /// @brief `nodes` nodes of `ranks_per_node` ranks in blocks (ranks 0..L-1 on node 0, ...).
  /// Throws ErrorCode::invalid_argument naming what is wrong (counts < 1, rates <= 0,
  /// latencies or gamma < 0).
  static ClusterNetwork uniform(int nodes, int ranks_per_node, double link_bits_per_s,
                                double intra_bytes_per_s, double link_latency_s = 0,
                                double intra_latency_s = 0, double gamma_s_per_byte = 0);
  /// @brief The same rates on another topology.
  ClusterNetwork on(Topology other) const;
};

/// @brief A collective's modelled time on a cluster and the traffic that made it.
struct ClusterCost {
  double seconds = 0;
  double link_bytes = 0;    ///< the most bytes one node's link carried in one direction
  double memory_bytes = 0;  ///< the most bytes one node's memory moved
  int steps = 0;            ///< the algorithm's communication steps
};

/// @brief `algorithm` performing `collective` on `bytes` (selection_bytes: the send buffer's,
/// allgather's gathered buffer) over `cluster`: its row's schedule (AlgorithmInfo, the messages
/// the algorithm sends, with the fold for non-power-of-two counts; broadcast and reduce from root
/// 0) replayed step by step. A step takes, over every node, the longest of its link's bytes
/// out, its link's bytes in (at the link rate, plus the link's latency where a message crosses)
/// and its memory's bytes (at the intra rate, plus the intra latency), then its largest
/// reduction at gamma (overlapped with the wire where the step is pipelined, as ring allreduce's
/// are). Infinite where the algorithm cannot run: native (the library's own, not modelled here),
/// and where its schedule refuses the topology (hierarchical on one node or on one rank per
/// node, rd allgather at a non-power-of-two count). Throws ErrorCode::invalid_argument when
/// `algorithm` does not implement `collective`.
ClusterCost cluster_cost(const ClusterNetwork& cluster, Algorithm algorithm, Collective collective,
                         std::size_t bytes);

/// @brief What an allreduce of `bytes` must move through one node's link each way, over the link
/// rate: 2(n-1)/n x bytes / rate for n nodes (0 on one node).
double allreduce_link_bound(const ClusterNetwork& cluster, std::size_t bytes);

}  // namespace loom
