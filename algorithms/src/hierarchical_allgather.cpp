// Hierarchical allgather over the backend's Topology: each node's leader gathers its ranks'
// blocks, the leaders pass the nodes' blocks around a ring (a node's blocks cross its link once
// each way per step, N - 1 steps), and each leader sends the gathered result to the rest of its
// node. A node's ranks need not be consecutive: blocks travel one message per rank.
#include <algorithm>

#include "algorithms.hpp"

namespace loom::algorithms {
namespace {

// Step 0: the gather to the leader; steps 1..N-1: the leaders' ring (step s moves node
// (v - s + 1)'s blocks to the next leader); step N: the leader's result to its node.
class HierarchicalAllgather final : public StepwiseAlgorithm {
 public:
  HierarchicalAllgather(Backend& backend, const CollectiveArgs& args, const WorkLabel& what)
      : StepwiseAlgorithm(backend, what),
        _in(args.send),
        _out(args.recv),
        _topology(backend.topology()),
        _nodes(_topology.node_count()),
        _node(_topology.node_of(rank())),
        _leader(_topology.leader_of_node(_node)) {}

 protected:
  bool begin_step(int step) override {
    const auto mine = _topology.ranks_of_node(_node);
    if (step == 0) {
      if (rank() != _leader) {
        send(_in, _leader);
        return true;
      }
      copy(block(rank()), _in);
      for (int q : mine)
        if (q != rank()) recv(block(q), q);
      return true;
    }
    if (step < _nodes) {
      if (rank() != _leader) return true;
      const int s = step - 1;
      const int next = _topology.leader_of_node((_node + 1) % _nodes);
      const int prev = _topology.leader_of_node((_node - 1 + _nodes) % _nodes);
      for (int q : _topology.ranks_of_node(((_node - s) % _nodes + _nodes) % _nodes))
        send(block(q), next);
      for (int q : _topology.ranks_of_node(((_node - s - 1) % _nodes + _nodes) % _nodes))
        recv(block(q), prev);
      return true;
    }
    if (step > _nodes) return false;
    if (rank() == _leader) {
      for (int q : mine)
        if (q != rank()) send(_out, q);
    } else {
      recv(_out, _leader);
    }
    return true;
  }

 private:
  Buffer block(int r) const {
    return _out.slice(static_cast<std::size_t>(r) * _in.count(), _in.count());
  }

  Buffer _in;
  Buffer _out;
  const Topology& _topology;
  int _nodes;
  int _node;
  int _leader;
};

}  // namespace

std::unique_ptr<ChannelWork> hierarchical_allgather(Backend& b, const CollectiveArgs& a,
                                                    const WorkLabel& what) {
  return std::make_unique<HierarchicalAllgather>(b, a, what);
}

// Blocks to each node's leader, the leaders' ring, the result from the leader to its node.
bool hierarchical_allgather_schedule(const Topology& t, double n, MessageSchedule& s) {
  if (t.node_count() < 2 || t.node_count() == t.world_size()) return false;
  const double block = n / t.world_size();
  s.step();
  for (int q = 0; q < t.world_size(); ++q) s.message(q, t.leader_of_node(t.node_of(q)), block);
  leaders_ring_steps(s, t, block, false);
  s.step();
  for (int q = 0; q < t.world_size(); ++q) s.message(t.leader_of_node(t.node_of(q)), q, n);
  return true;
}

void leaders_ring_steps(MessageSchedule& s, const Topology& t, double per_rank, bool reduces) {
  const int nodes = t.node_count();
  for (int k = 0; k < nodes - 1; ++k) {
    s.step();
    double reduced = 0;
    for (int v = 0; v < nodes; ++v) {
      const int segment = ((v - k) % nodes + nodes) % nodes;
      const double bytes = per_rank * static_cast<double>(t.ranks_of_node(segment).size());
      s.message(t.leader_of_node(v), t.leader_of_node((v + 1) % nodes), bytes);
      reduced = std::max(reduced, bytes);
    }
    if (reduces) s.reduce(reduced);
  }
}

}  // namespace loom::algorithms
