// Hierarchical allreduce over the backend's Topology: inside each node a reduce-scatter into
// m shards (m: the fewest ranks any node holds), between nodes an allreduce of each shard
// among the ranks with the same local index (recursive doubling with the standard fold), and
// inside each node an allgather of the shards. On 3 nodes or more with large shards the
// inter-node phase is a ring instead (hierarchical_inter_ring): each shard cut into one block
// per node, reduce-scattered and allgathered around the nodes. Local ranks 0..m-1 of a node each
// own one shard; a node's other ranks (uneven placement: the nodes with more than m ranks) only
// send their data in the first phase and receive the result in the last, so every rank's data is
// reduced exactly once. With m = 1 it is the leader-based variant: reduce to the node leader,
// allreduce among the leaders, broadcast inside the node. Only a node's m shard owners cross
// the inter-node link, each with 1/m of the vector: the node's link carries the vector once
// per exchange instead of the flat ring's 2(p-1)/p of it.
#include <algorithm>
#include <vector>

#include "algorithms.hpp"
#include "fold.hpp"
#include "loom/algorithm.hpp"

namespace loom::algorithms {
namespace {

// Steps: 0 the intra-node reduce-scatter (each rank sends shard s to its node's local rank s;
// the owner reduces them in local-rank order); then the inter-node phase: recursive doubling
// (1 the fold; 2..L+1 the exchanges, node participant v ^ 2^(k-2); L+2 the unfold) or the ring
// (1..N-1 the reduce-scatter: block v-t to node v+1, block v-t-1 from node v-1 reduced in;
// N..2N-2 the allgather: block v+1-t sent on, block v-t received); last, the intra-node
// allgather (owner s sends shard s to every other rank of its node).
class HierarchicalAllreduce final : public StepWork {
 public:
  HierarchicalAllreduce(Backend& backend, const CollectiveArgs& args, std::string what)
      : StepWork(backend, std::move(what)),
        _in(args.send),
        _out(args.recv),
        _op(args.reduce_op),
        _topology(backend.topology()),
        _node(_topology.node_of(rank())),
        _local(_topology.local_rank(rank())),
        _shards(shard_count(_topology)),
        _fold(_node, _topology.node_count()),
        _ring(hierarchical_inter_ring(_topology, _out.count() * dtype_size(_out.dtype()))),
        _last(1 + (_ring ? 2 * (_topology.node_count() - 1) : _fold.steps + 2)) {
    const std::size_t shard_max = block_of(_out.count(), _shards, 0).count;
    const auto others = _topology.ranks_of_node(_node).size() - 1;
    if (owner()) {
      _pieces = scratch(std::max<std::size_t>(others, 1) * shard_max, _out.dtype());
      _incoming = scratch(shard_max, _out.dtype());
    }
  }

  static int shard_count(const Topology& t) {
    std::size_t m = t.ranks_of_node(0).size();
    for (int node = 1; node < t.node_count(); ++node) m = std::min(m, t.ranks_of_node(node).size());
    return static_cast<int>(m);
  }

 protected:
  bool begin_step(int step) override {
    const int L = _fold.steps;
    const int N = _topology.node_count();
    const auto node_ranks = _topology.ranks_of_node(_node);
    if (step == 0) {
      for (std::size_t j = 0; j < node_ranks.size(); ++j) {
        const int peer = node_ranks[j];
        if (peer == rank()) continue;
        if (static_cast<int>(j) < _shards) send(shard(_in, static_cast<int>(j)), peer);
        if (owner()) recv(piece(slot_of(static_cast<int>(j))), peer);
      }
      return true;
    }
    if (step == _last) {
      for (std::size_t j = 0; j < node_ranks.size(); ++j) {
        const int peer = node_ranks[j];
        if (peer == rank()) continue;
        if (owner()) send(shard(_out, _local), peer);
        if (static_cast<int>(j) < _shards) recv(shard(_out, static_cast<int>(j)), peer);
      }
      return true;
    }
    if (step > _last) return false;
    if (!owner()) return true;
    const Buffer mine = shard(_out, _local);
    if (_ring) {
      const int t = step - 1;
      const int next = peer_on((_node + 1) % N), prev = peer_on((_node + N - 1) % N);
      if (t < N - 1) {
        send(block(mine, _node - t), next);
        const Buffer into = block(mine, _node - t - 1);
        recv(_incoming.slice(0, into.count()), prev);
      } else {
        const int u = t - (N - 1);
        send(block(mine, _node + 1 - u), next);
        recv(block(mine, _node - u), prev);
      }
      return true;
    }
    if (step == 1) {
      if (_fold.sits_out()) send(mine, peer_on(_node + 1));
      if (_fold.absorbs()) recv(_incoming.slice(0, mine.count()), peer_on(_node - 1));
    } else if (step == L + 2) {
      if (_fold.absorbs()) send(mine, peer_on(_node - 1));
      if (_fold.sits_out()) recv(mine, peer_on(_node + 1));
    } else if (!_fold.sits_out()) {
      const int partner = peer_on(_fold.real(_fold.newrank ^ (1 << (step - 2))));
      send(mine, partner);
      recv(_incoming.slice(0, mine.count()), partner);
    }
    return true;
  }

  void end_step(int step) override {
    const int L = _fold.steps;
    const int N = _topology.node_count();
    if (step == _last) {
      finish_average(_out, _op);
      return;
    }
    if (!owner()) return;
    const Buffer mine = shard(_out, _local);
    if (step == 0) {
      // out = in (op) the node's other ranks' pieces, in local-rank order.
      const auto others = static_cast<int>(_topology.ranks_of_node(_node).size()) - 1;
      if (others == 0) {
        copy(mine, shard(_in, _local));
        return;
      }
      combine(mine, shard(_in, _local), piece(0), _op);
      for (int k = 1; k < others; ++k) combine(mine, piece(k), _op);
    } else if (_ring) {
      if (step - 1 < N - 1) {
        const Buffer into = block(mine, _node - step);
        combine(into, _incoming.slice(0, into.count()), _op);
      }
    } else if (step == 1 ? _fold.absorbs() : (step <= L + 1 && !_fold.sits_out())) {
      combine(mine, _incoming.slice(0, mine.count()), _op);
    }
  }

 private:
  bool owner() const { return _local < _shards; }
  Buffer shard(Buffer whole, int s) const {
    const Range r = block_of(whole.count(), _shards, s);
    return whole.slice(r.offset, r.count);
  }
  // Block b (taken modulo the node count) of a shard, for the inter-node ring.
  Buffer block(Buffer shard_buffer, int b) const {
    const int N = _topology.node_count();
    const Range r = block_of(shard_buffer.count(), N, ((b % N) + N) % N);
    return shard_buffer.slice(r.offset, r.count);
  }
  // The scratch slot of local rank j's piece (the owner's own local index has none).
  int slot_of(int j) const { return j < _local ? j : j - 1; }
  Buffer piece(int slot) const {
    const std::size_t n = shard(_out, _local).count();
    const std::size_t stride = block_of(_out.count(), _shards, 0).count;
    return _pieces.slice(static_cast<std::size_t>(slot) * stride, n);
  }
  // The rank with this rank's local index on `node`.
  int peer_on(int node) const { return _topology.ranks_of_node(node)[_local]; }

  Buffer _in;
  Buffer _out;
  ReduceOp _op;
  const Topology& _topology;
  int _node;
  int _local;
  int _shards;
  Fold _fold;
  bool _ring;  // the inter-node phase is a ring (else recursive doubling)
  int _last;   // the intra-node allgather's step
  Buffer _pieces;
  Buffer _incoming;
};

}  // namespace

int hierarchical_shards(const Topology& topology) {
  return HierarchicalAllreduce::shard_count(topology);
}

std::unique_ptr<ChannelWork> hierarchical_allreduce(Backend& b, const CollectiveArgs& a,
                                                    std::string what) {
  return std::make_unique<HierarchicalAllreduce>(b, a, std::move(what));
}

}  // namespace loom::algorithms

namespace loom {

bool hierarchical_inter_ring(const Topology& topology, std::size_t bytes) {
  const int nodes = topology.node_count();
  if (nodes < 3) return false;
  const auto shard_bytes =
      bytes / static_cast<std::size_t>(algorithms::hierarchical_shards(topology));
  return shard_bytes / static_cast<std::size_t>(nodes) >= hierarchical_ring_block_bytes;
}

}  // namespace loom
