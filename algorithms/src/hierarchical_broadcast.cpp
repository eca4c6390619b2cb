// Hierarchical broadcast over the backend's Topology: a binomial tree among one rank per node
// (the root on its own node, the leader elsewhere), so the vector crosses each node's link
// once, then each of those ranks sends it to the other ranks of its node.
#include "algorithms.hpp"
#include "ceil_log2.hpp"

namespace loom::algorithms {
namespace {

// Steps 0..K-1: the tree among the nodes' heads (largest mask first, nodes renumbered so that
// the root's node is 0); step K: each head to the rest of its node.
class HierarchicalBroadcast final : public StepwiseAlgorithm {
 public:
  HierarchicalBroadcast(Backend& backend, const CollectiveArgs& args, const WorkLabel& what)
      : StepwiseAlgorithm(backend, what),
        _data(args.send),
        _root(args.root),
        _topology(backend.topology()),
        _nodes(_topology.node_count()),
        _root_node(_topology.node_of(_root)),
        _node(_topology.node_of(rank())),
        _vnode((_node - _root_node + _nodes) % _nodes),
        _steps(ceil_log2(_nodes)) {}

 protected:
  bool begin_step(int step) override {
    if (step < _steps) {
      if (rank() != head(_node)) return true;
      const int mask = 1 << (_steps - 1 - step);
      if (_vnode % (2 * mask) == 0 && _vnode + mask < _nodes)
        send(_data, head(real(_vnode + mask)));
      else if (_vnode % (2 * mask) == mask)
        recv(_data, head(real(_vnode - mask)));
      return true;
    }
    if (step > _steps) return false;
    const int me = head(_node);
    if (rank() == me) {
      for (int peer : _topology.ranks_of_node(_node))
        if (peer != me) send(_data, peer);
    } else {
      recv(_data, me);
    }
    return true;
  }

 private:
  int real(int vnode) const { return (vnode + _root_node) % _nodes; }
  // The rank of `node` in the tree: the root on its node, the leader elsewhere.
  int head(int node) const { return node == _root_node ? _root : _topology.leader_of_node(node); }

  Buffer _data;
  int _root;
  const Topology& _topology;
  int _nodes;
  int _root_node;
  int _node;
  int _vnode;
  int _steps;
};

}  // namespace

std::unique_ptr<ChannelWork> hierarchical_broadcast(Backend& b, const CollectiveArgs& a,
                                                    const WorkLabel& what) {
  return std::make_unique<HierarchicalBroadcast>(b, a, what);
}

// From rank 0: a binomial tree of the nodes' leaders, then each leader to its node.
bool hierarchical_broadcast_schedule(const Topology& t, double n, MessageSchedule& s) {
  const int nodes = t.node_count();
  if (nodes < 2 || nodes == t.world_size()) return false;
  const int steps = ceil_log2(nodes);
  for (int k = 0; k < steps; ++k) {
    const int mask = 1 << (steps - 1 - k);
    s.step();
    for (int v = 0; v + mask < nodes; v += 2 * mask)
      s.message(t.leader_of_node(v), t.leader_of_node(v + mask), n);
  }
  s.step();
  for (int q = 0; q < t.world_size(); ++q) s.message(t.leader_of_node(t.node_of(q)), q, n);
  return true;
}

}  // namespace loom::algorithms
