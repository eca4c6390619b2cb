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
#include <utility>
#include <vector>

#include "algorithms.hpp"
#include "fold.hpp"
#include "loom/algorithm.hpp"

namespace loom::algorithms {
namespace {

// Stages of one chunk: 0 the intra-node reduce-scatter (each rank sends shard s to its node's
// local rank s; the owner reduces them in local-rank order); then the inter-node phase:
// recursive doubling (on a node count that is not a power of two: 1 the fold, 2..L+1 the
// exchanges, node participant v ^ 2^(k-2), L+2 the unfold; on a power of two, which has
// nothing to fold, only the exchanges, 1..L, participant v ^ 2^(k-1): an empty stage would
// still cost every chunk a step of the pipeline) or the ring (1..N-1 the reduce-scatter: block v-t
// to node v+1, block v-t-1 from node v-1 reduced in; N..2N-2 the allgather: block v+1-t sent on,
// block v-t received); last, the intra-node allgather (owner s sends shard s to every other rank of
// its node).
//
// The vector is cut into C chunks (hierarchical_chunks) that run the stages as a pipeline: at
// step g chunk c runs stage g - c, so the intra-node phases of one chunk travel while another
// crosses the inter-node link. Each step posts the active chunks' transfers in chunk order and
// each stage's in a fixed peer order, the same on every rank, so messages between two ranks
// match in order. Every chunk at a step is at another stage: the scratch of the inter-node
// stages is one slot per stage.
class HierarchicalAllreduce final : public StepwiseAlgorithm {
 public:
  HierarchicalAllreduce(Backend& backend, const CollectiveArgs& args, const WorkLabel& what)
      : StepwiseAlgorithm(backend, what),
        _in(args.send),
        _out(args.recv),
        _op(args.reduce_op),
        _topology(backend.topology()),
        _node(_topology.node_of(rank())),
        _local(_topology.local_rank(rank())),
        _shards(shard_count(_topology)),
        _fold(_node, _topology.node_count()),
        _chunks(hierarchical_chunks(_out.count() * dtype_size(_out.dtype()))),
        _ring(hierarchical_inter_ring(_topology, _out.count() * dtype_size(_out.dtype()))),
        _inter(_ring ? 2 * (_topology.node_count() - 1) : _fold.steps + (folds() ? 2 : 0)),
        _stages(_inter + 2) {
    const std::size_t chunk_max = block_of(_out.count(), _chunks, 0).count;
    _shard_max = block_of(chunk_max, _shards, 0).count;
    const int N = _topology.node_count();
    _slot = _ring ? block_of(_shard_max, N, 0).count : _shard_max;
    const auto others = _topology.ranks_of_node(_node).size() - 1;
    if (owner()) {
      _pieces = scratch(std::max<std::size_t>(others, 1) * _shard_max, _out.dtype());
      _incoming = scratch(static_cast<std::size_t>(_inter) * _slot, _out.dtype());
    }
  }

  static int shard_count(const Topology& t) {
    std::size_t m = t.ranks_of_node(0).size();
    for (int node = 1; node < t.node_count(); ++node) m = std::min(m, t.ranks_of_node(node).size());
    return static_cast<int>(m);
  }

 protected:
  bool begin_step(int step) override {
    if (step >= _chunks + _stages - 1) return false;
    for (int c = std::max(0, step - _stages + 1); c <= std::min(step, _chunks - 1); ++c)
      post(c, step - c);
    return true;
  }

  void end_step(int step) override {
    for (int c = std::max(0, step - _stages + 1); c <= std::min(step, _chunks - 1); ++c)
      reduce(c, step - c);
    if (step == _chunks + _stages - 2) finish_average(_out, _op);
  }

 private:
  // Posts chunk c's transfers of `stage`.
  void post(int c, int stage) {
    const int L = _fold.steps;
    const int N = _topology.node_count();
    const auto node_ranks = _topology.ranks_of_node(_node);
    const Buffer in = chunk(_in, c), out = chunk(_out, c);
    if (stage == 0) {
      for (std::size_t j = 0; j < node_ranks.size(); ++j) {
        const int peer = node_ranks[j];
        if (peer == rank()) continue;
        if (static_cast<int>(j) < _shards) send(shard(in, static_cast<int>(j)), peer);
        if (owner()) recv(piece(out, slot_of(static_cast<int>(j))), peer);
      }
      return;
    }
    if (stage == _stages - 1) {
      for (std::size_t j = 0; j < node_ranks.size(); ++j) {
        const int peer = node_ranks[j];
        if (peer == rank()) continue;
        if (owner()) send(shard(out, _local), peer);
        if (static_cast<int>(j) < _shards) recv(shard(out, static_cast<int>(j)), peer);
      }
      return;
    }
    if (!owner()) return;
    const Buffer mine = shard(out, _local);
    if (_ring) {
      const int t = stage - 1;
      const int next = peer_on((_node + 1) % N), prev = peer_on((_node + N - 1) % N);
      if (t < N - 1) {
        send(block(mine, _node - t), next);
        recv(incoming(stage, block(mine, _node - t - 1).count()), prev);
      } else {
        const int u = t - (N - 1);
        send(block(mine, _node + 1 - u), next);
        recv(block(mine, _node - u), prev);
      }
      return;
    }
    if (folds() && stage == 1) {
      if (_fold.sits_out()) send(mine, peer_on(_node + 1));
      if (_fold.absorbs()) recv(incoming(stage, mine.count()), peer_on(_node - 1));
    } else if (folds() && stage == L + 2) {
      if (_fold.absorbs()) send(mine, peer_on(_node - 1));
      if (_fold.sits_out()) recv(mine, peer_on(_node + 1));
    } else if (!_fold.sits_out()) {
      const int partner = peer_on(_fold.real(_fold.newrank ^ (1 << exchange_of(stage))));
      send(mine, partner);
      recv(incoming(stage, mine.count()), partner);
    }
  }

  // Chunk c's local work once its transfers of `stage` completed.
  void reduce(int c, int stage) {
    const int L = _fold.steps;
    const int N = _topology.node_count();
    if (stage == _stages - 1 || !owner()) return;
    const Buffer out = chunk(_out, c);
    const Buffer mine = shard(out, _local);
    if (stage == 0) {
      // out = in (op) the node's other ranks' pieces, in local-rank order.
      const Buffer own = shard(chunk(_in, c), _local);
      const auto others = static_cast<int>(_topology.ranks_of_node(_node).size()) - 1;
      if (others == 0) {
        copy(mine, own);
        return;
      }
      combine(mine, own, piece(out, 0), _op);
      for (int k = 1; k < others; ++k) combine(mine, piece(out, k), _op);
    } else if (_ring) {
      if (stage - 1 < N - 1) {
        const Buffer into = block(mine, _node - stage);
        combine(into, incoming(stage, into.count()), _op);
      }
    } else if (folds() && stage == 1) {
      if (_fold.absorbs()) combine(mine, incoming(stage, mine.count()), _op);
    } else if (exchange_of(stage) < L && !_fold.sits_out()) {
      // The lower participant's data first on both sides of the exchange (see
      // recursive_doubling_allreduce.cpp): bit-identical results on every node.
      const Buffer theirs = incoming(stage, mine.count());
      if ((_fold.newrank >> exchange_of(stage)) & 1)
        combine(mine, theirs, mine, _op);
      else
        combine(mine, theirs, _op);
    }
  }

  bool owner() const { return _local < _shards; }
  // The node count is not a power of two: the fold and unfold stages run.
  bool folds() const { return _fold.rem > 0; }
  // Which recursive-doubling exchange (0..L-1) an inter-node stage is; L for the unfold.
  int exchange_of(int stage) const { return stage - (folds() ? 2 : 1); }
  Buffer chunk(Buffer whole, int c) const {
    const Range r = block_of(whole.count(), _chunks, c);
    return whole.slice(r.offset, r.count);
  }
  // Shard s of a chunk.
  Buffer shard(Buffer part, int s) const {
    const Range r = block_of(part.count(), _shards, s);
    return part.slice(r.offset, r.count);
  }
  // Block b (taken modulo the node count) of a shard, for the inter-node ring.
  Buffer block(Buffer shard_buffer, int b) const {
    const int N = _topology.node_count();
    const Range r = block_of(shard_buffer.count(), N, ((b % N) + N) % N);
    return shard_buffer.slice(r.offset, r.count);
  }
  // The scratch slot of local rank j's piece (the owner's own local index has none).
  int slot_of(int j) const { return j < _local ? j : j - 1; }
  // Local rank slot's piece of this owner's shard of the chunk `out` belongs to.
  Buffer piece(Buffer out, int slot) const {
    return _pieces.slice(static_cast<std::size_t>(slot) * _shard_max, shard(out, _local).count());
  }
  // What an inter-node stage receives into before reducing it.
  Buffer incoming(int stage, std::size_t count) const {
    return _incoming.slice(static_cast<std::size_t>(stage - 1) * _slot, count);
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
  int _chunks;  // pipelined pieces of the vector
  bool _ring;   // the inter-node phase is a ring (else recursive doubling)
  int _inter;   // inter-node stages
  int _stages;  // stages of a chunk: the intra-node reduce-scatter, _inter, the allgather
  std::size_t _shard_max = 0;
  std::size_t _slot = 0;  // elements of an inter-node stage's scratch
  Buffer _pieces;
  Buffer _incoming;
};

}  // namespace

int hierarchical_shards(const Topology& topology) {
  return HierarchicalAllreduce::shard_count(topology);
}

std::unique_ptr<ChannelWork> hierarchical_allreduce(Backend& b, const CollectiveArgs& a,
                                                    const WorkLabel& what) {
  return std::make_unique<HierarchicalAllreduce>(b, a, what);
}

namespace {

// One stage of a chunk's way through hierarchical allreduce: what it sends and what the
// busiest rank then reduces.
struct Stage {
  std::vector<ScheduledMessage> messages;
  double reduced = 0;
};

// Recursive doubling among the nodes with the fold (the fold and the unfold only where there is
// a remainder), as stages: node a sends node b `owners(a, b)` in one exchange, each reduced
// (`reduced` bytes) on arrival.
template <typename Owners>
void nodes_fold_and_exchange(std::vector<Stage>& stages, int nodes, const Owners& owners,
                             double reduced) {
  const Fold f(0, nodes);
  auto nodes_stage = [&](const std::vector<std::pair<int, int>>& pairs, double reduce) {
    Stage stage;
    for (auto [a, b] : pairs)
      for (const ScheduledMessage& x : owners(a, b)) stage.messages.push_back(x);
    stage.reduced = pairs.empty() ? 0 : reduce;
    stages.push_back(std::move(stage));
  };
  std::vector<std::pair<int, int>> pairs;
  for (int v = 0; v < 2 * f.rem; v += 2) pairs.push_back({v, v + 1});
  if (f.rem > 0) nodes_stage(pairs, reduced);
  for (int k = 0; k < f.steps; ++k) {
    std::vector<std::pair<int, int>> x;
    for (int v = 0; v < f.p2; ++v) x.push_back({f.real(v), f.real(v ^ (1 << k))});
    nodes_stage(x, reduced);
  }
  for (auto& [a, b] : pairs) std::swap(a, b);
  if (f.rem > 0) nodes_stage(pairs, 0);
}

}  // namespace

// A node-local reduce-scatter into m shards (m the fewest ranks any node holds; local ranks
// 0..m-1 own one each), between the nodes' owners of the same index a ring of each shard
// (hierarchical_inter_ring) or the fold and recursive doubling, the node-local allgather; the
// vector in hierarchical_chunks pipelined chunks, chunk c at stage g - c in step g: a step's
// parts are its chunks' stages, one chunk's intra-node messages beside another's inter-node ones.
bool hierarchical_allreduce_schedule(const Topology& t, double n, MessageSchedule& s) {
  const int nodes = t.node_count();
  if (nodes < 2 || nodes == t.world_size()) return false;
  std::size_t fewest = t.ranks_of_node(0).size(), most = fewest;
  for (int node = 1; node < nodes; ++node) {
    fewest = std::min(fewest, t.ranks_of_node(node).size());
    most = std::max(most, t.ranks_of_node(node).size());
  }
  const int m = static_cast<int>(fewest);
  const int chunks = hierarchical_chunks(static_cast<std::size_t>(n));
  const double shard = n / chunks / m;
  std::vector<Stage> stages(1);
  for (int node = 0; node < nodes; ++node) {
    const auto ranks = t.ranks_of_node(node);
    for (int from : ranks)
      for (int j = 0; j < m; ++j)
        if (from != ranks[j]) stages[0].messages.push_back({from, ranks[j], shard});
  }
  stages[0].reduced = static_cast<double>(most - 1) * shard;
  auto owners = [&](int node_from, int node_to, double bytes) {
    std::vector<ScheduledMessage> msgs;
    for (int j = 0; j < m; ++j)
      msgs.push_back({t.ranks_of_node(node_from)[j], t.ranks_of_node(node_to)[j], bytes});
    return msgs;
  };
  if (hierarchical_inter_ring(t, static_cast<std::size_t>(n))) {
    // Between nodes: a ring of every shard's owners, a block of shard / N per step, reduced in
    // the first N - 1 steps (the reduce-scatter), copied in the next N - 1 (the allgather).
    const double block = shard / nodes;
    for (int k = 0; k < 2 * (nodes - 1); ++k) {
      Stage stage;
      for (int v = 0; v < nodes; ++v)
        for (const ScheduledMessage& x : owners(v, (v + 1) % nodes, block))
          stage.messages.push_back(x);
      stage.reduced = k < nodes - 1 ? block : 0;
      stages.push_back(std::move(stage));
    }
  } else {
    nodes_fold_and_exchange(
        stages, nodes, [&](int a, int b) { return owners(a, b, shard); }, shard);
  }
  Stage back;
  for (int node = 0; node < nodes; ++node) {
    const auto ranks = t.ranks_of_node(node);
    for (int j = 0; j < m; ++j)
      for (int to : ranks)
        if (to != ranks[j]) back.messages.push_back({ranks[j], to, shard});
  }
  stages.push_back(std::move(back));
  const int count = static_cast<int>(stages.size());
  for (int g = 0; g < chunks + count - 1; ++g) {
    s.step();
    bool first = true;
    for (int k = std::max(0, g - chunks + 1); k <= std::min(g, count - 1); ++k) {
      if (!first) s.part();
      first = false;
      for (const ScheduledMessage& x : stages[k].messages)
        s.message(x.from, x.to, x.bytes, x.pieces);
      s.reduce(stages[k].reduced);
    }
  }
  return true;
}

}  // namespace loom::algorithms

namespace loom {

int hierarchical_chunks(std::size_t bytes) {
  return static_cast<int>(
      std::clamp<std::size_t>(bytes / hierarchical_chunk_bytes, 1, hierarchical_max_chunks));
}

bool hierarchical_inter_ring(const Topology& topology, std::size_t bytes) {
  const int nodes = topology.node_count();
  if (nodes < 3) return false;
  const auto shard_bytes =
      bytes / static_cast<std::size_t>(algorithms::hierarchical_shards(topology));
  return shard_bytes / static_cast<std::size_t>(nodes) >= hierarchical_ring_block_bytes;
}

}  // namespace loom
