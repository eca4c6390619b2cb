// Hierarchical reduce_scatter over the backend's Topology: each node's leader reduces its
// ranks' vectors (in local-rank order), the leaders reduce-scatter the nodes' segments around a
// ring (node w's segment: the blocks of w's ranks; a node's link carries the other nodes'
// segments once), and each leader sends every rank of its node its block. A node's ranks need
// not be consecutive: blocks travel one message per rank.
#include <algorithm>

#include "algorithms.hpp"

namespace loom::algorithms {
namespace {

// Step 0: the node's vectors to the leader, reduced there; steps 1..N-1: the leaders' ring
// (step s sends segment v - s of the partial sums and adds the one of v - s - 1 received);
// step N: each rank's block from its leader.
class HierarchicalReduceScatter final : public StepwiseAlgorithm {
 public:
  HierarchicalReduceScatter(Backend& backend, const CollectiveArgs& args, const WorkLabel& what)
      : StepwiseAlgorithm(backend, what),
        _in(args.send),
        _out(args.recv),
        _op(args.reduce_op),
        _topology(backend.topology()),
        _nodes(_topology.node_count()),
        _node(_topology.node_of(rank())),
        _leader(_topology.leader_of_node(_node)) {
    if (rank() != _leader) return;
    const std::size_t others = _topology.ranks_of_node(_node).size() - 1;
    std::size_t most = 0;
    for (int node = 0; node < _nodes; ++node)
      most = std::max(most, _topology.ranks_of_node(node).size());
    _sum = scratch(_in.count(), _in.dtype());
    _pieces = scratch(std::max<std::size_t>(others, 1) * _in.count(), _in.dtype());
    _incoming = scratch(most * _out.count(), _in.dtype());
  }

 protected:
  bool begin_step(int step) override {
    const auto mine = _topology.ranks_of_node(_node);
    if (step == 0) {
      if (rank() != _leader) {
        send(_in, _leader);
        return true;
      }
      std::size_t slot = 0;
      for (int q : mine)
        if (q != rank()) recv(_pieces.slice(slot++ * _in.count(), _in.count()), q);
      return true;
    }
    if (step < _nodes) {
      if (rank() != _leader) return true;
      const int next = _topology.leader_of_node((_node + 1) % _nodes);
      const int prev = _topology.leader_of_node((_node - 1 + _nodes) % _nodes);
      for (int q : _topology.ranks_of_node(segment_sent(step))) send(block(_sum, q), next);
      std::size_t j = 0;
      for (int q : _topology.ranks_of_node(segment_received(step))) {
        (void)q;
        recv(_incoming.slice(j++ * _out.count(), _out.count()), prev);
      }
      return true;
    }
    if (step > _nodes) return false;
    if (rank() == _leader) {
      for (int q : mine)
        if (q != rank()) send(block(_sum, q), q);
      copy(_out, block(_sum, rank()));
    } else {
      recv(_out, _leader);
    }
    return true;
  }

  void end_step(int step) override {
    if (step == _nodes) {
      finish_average(_out, _op);
      return;
    }
    if (rank() != _leader) return;
    if (step == 0) {
      // sum = this rank's vector (op) the others', in local-rank order.
      const std::size_t others = _topology.ranks_of_node(_node).size() - 1;
      if (others == 0) {
        copy(_sum, _in);
        return;
      }
      combine(_sum, _in, _pieces.slice(0, _in.count()), _op);
      for (std::size_t k = 1; k < others; ++k)
        combine(_sum, _pieces.slice(k * _in.count(), _in.count()), _op);
      return;
    }
    std::size_t j = 0;
    for (int q : _topology.ranks_of_node(segment_received(step)))
      combine(block(_sum, q), _incoming.slice(j++ * _out.count(), _out.count()), _op);
  }

 private:
  // Ring step s = step - 1 sends node v - s - 1's segment and receives node v - s - 2's; after
  // N - 1 steps this leader holds its own node's segment summed over every node.
  int segment_sent(int step) const { return wrap(_node - step); }
  int segment_received(int step) const { return wrap(_node - step - 1); }
  int wrap(int node) const { return (node % _nodes + _nodes) % _nodes; }
  Buffer block(Buffer whole, int r) const {
    return whole.slice(static_cast<std::size_t>(r) * _out.count(), _out.count());
  }

  Buffer _in;
  Buffer _out;
  ReduceOp _op;
  const Topology& _topology;
  int _nodes;
  int _node;
  int _leader;
  Buffer _sum;
  Buffer _pieces;
  Buffer _incoming;
};

}  // namespace

std::unique_ptr<ChannelWork> hierarchical_reduce_scatter(Backend& b, const CollectiveArgs& a,
                                                         const WorkLabel& what) {
  return std::make_unique<HierarchicalReduceScatter>(b, a, what);
}

// Vectors to each node's leader (reduced there), the leaders' ring, each rank's block from its
// leader.
bool hierarchical_reduce_scatter_schedule(const Topology& t, double n, MessageSchedule& s) {
  const int nodes = t.node_count();
  if (nodes < 2 || nodes == t.world_size()) return false;
  const double block = n / t.world_size();
  std::size_t most = 0;
  for (int node = 0; node < nodes; ++node) most = std::max(most, t.ranks_of_node(node).size());
  s.step(static_cast<double>(most - 1) * n);
  for (int q = 0; q < t.world_size(); ++q) s.message(q, t.leader_of_node(t.node_of(q)), n);
  leaders_ring_steps(s, t, block, true);
  s.step();
  for (int q = 0; q < t.world_size(); ++q) s.message(t.leader_of_node(t.node_of(q)), q, block);
  return true;
}

}  // namespace loom::algorithms
