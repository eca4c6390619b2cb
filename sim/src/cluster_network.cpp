// ClusterNetwork: loom's collective algorithms replayed message by message on a node's memory
// and each node's link.
#include "loom/cluster_network.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ceil_log2.hpp"
#include "loom/algorithm.hpp"
#include "loom/error.hpp"

namespace loom {

ClusterNetwork ClusterNetwork::uniform(int nodes, int ranks_per_node, double link_bits_per_s,
                                       double intra_bytes_per_s, double link_latency_s,
                                       double intra_latency_s, double gamma_s_per_byte) {
  if (nodes < 1 || ranks_per_node < 1)
    throw Error(ErrorCode::invalid_argument, "a cluster needs >= 1 node of >= 1 rank (got " +
                                                 std::to_string(nodes) + " nodes of " +
                                                 std::to_string(ranks_per_node) + " ranks)");
  ClusterNetwork c;
  c.topology = Topology::blocks(nodes * ranks_per_node, ranks_per_node);
  c.link_bytes_per_s = link_bits_per_s / 8;
  c.intra_bytes_per_s = intra_bytes_per_s;
  c.link_latency_s = link_latency_s;
  c.intra_latency_s = intra_latency_s;
  c.gamma_s_per_byte = gamma_s_per_byte;
  if (!(c.link_bytes_per_s > 0) || !(c.intra_bytes_per_s > 0))
    throw Error(ErrorCode::invalid_argument,
                "a cluster needs a link rate > 0 and an intra-node rate > 0 (got link " +
                    std::to_string(link_bits_per_s) + " bit/s, intra " +
                    std::to_string(intra_bytes_per_s) + " B/s)");
  const std::pair<const char*, double> non_negative[] = {{"link_latency_s", link_latency_s},
                                                         {"intra_latency_s", intra_latency_s},
                                                         {"gamma_s_per_byte", gamma_s_per_byte}};
  for (const auto& [what, value] : non_negative)
    if (!(value >= 0))
      throw Error(
          ErrorCode::invalid_argument,
          std::string("a cluster's ") + what + " must be >= 0 (got " + std::to_string(value) + ")");
  return c;
}

ClusterNetwork ClusterNetwork::on(Topology other) const {
  ClusterNetwork c = *this;
  c.topology = std::move(other);
  return c;
}

namespace {

struct Message {
  int from;
  int to;
  double bytes;
};

// The standard fold (algorithms/src/fold.hpp): p2 the largest power of two <= p, rem = p - p2;
// even ranks r < 2 rem hand their data to r + 1 and sit out; participant v is real(v).
struct Fold {
  explicit Fold(int p) : p2(1) {
    while (p2 * 2 <= p) p2 *= 2;
    rem = p - p2;
    while ((1 << steps) < p2) ++steps;
  }
  int real(int v) const { return v < rem ? 2 * v + 1 : v + rem; }
  int p2;
  int rem = 0;
  int steps = 0;
};

// Accumulates the steps of one algorithm: each step's messages load every node's link (out at
// the sender, in at the receiver) or memory, and the step lasts as long as the busiest of them.
class Replay {
 public:
  explicit Replay(const ClusterNetwork& c)
      : _c(c),
        _out(c.topology.node_count()),
        _in(c.topology.node_count()),
        _memory(c.topology.node_count()) {}

  // One step, `repeat` times over: `messages` at once, then a reduction of `reduced` bytes on
  // the busiest rank (overlapped with the wire when `pipelined`).
  void step(const std::vector<Message>& messages, double reduced, int repeat = 1,
            bool pipelined = false) {
    if (repeat <= 0) return;
    std::fill(_out.begin(), _out.end(), 0.0);
    std::fill(_in.begin(), _in.end(), 0.0);
    std::fill(_memory.begin(), _memory.end(), 0.0);
    bool crosses = false, inside = false;
    for (const Message& m : messages) {
      if (m.from == m.to || m.bytes <= 0) continue;
      const int a = _c.topology.node_of(m.from), b = _c.topology.node_of(m.to);
      if (a != b) {
        _out[a] += m.bytes;
        _in[b] += m.bytes;
        crosses = true;
      } else {
        _memory[a] += m.bytes;
        inside = true;
      }
    }
    double link = 0, memory = 0;
    for (std::size_t n = 0; n < _out.size(); ++n) {
      link = std::max({link, _out[n], _in[n]});
      memory = std::max(memory, _memory[n]);
    }
    const double wire = std::max(crosses ? _c.link_latency_s + link / _c.link_bytes_per_s : 0.0,
                                 inside ? _c.intra_latency_s + memory / _c.intra_bytes_per_s : 0.0);
    const double reduce = reduced * _c.gamma_s_per_byte;
    _cost.seconds += repeat * (pipelined ? std::max(wire, reduce) : wire + reduce);
    _cost.link_bytes += repeat * link;
    _cost.memory_bytes += repeat * memory;
    _cost.steps += repeat;
  }

  ClusterCost cost() const { return _cost; }

 private:
  const ClusterNetwork& _c;
  std::vector<double> _out, _in, _memory;
  ClusterCost _cost;
};

// Every rank r sends `bytes` to (r + shift) mod p.
std::vector<Message> shifted(int p, int shift, double bytes) {
  std::vector<Message> m;
  m.reserve(p);
  for (int r = 0; r < p; ++r) m.push_back({r, ((r + shift) % p + p) % p, bytes});
  return m;
}

// The fold's first step (each even r < 2 rem sends `bytes` to r + 1) or, `back`, its last
// (r + 1 sends `bytes` to r).
void fold_step(Replay& replay, const Fold& f, double bytes, bool back, double reduced) {
  if (f.rem == 0) return;
  std::vector<Message> m;
  for (int r = 0; r < 2 * f.rem; r += 2)
    m.push_back(back ? Message{r + 1, r, bytes} : Message{r, r + 1, bytes});
  replay.step(m, reduced);
}

// Participant v and v ^ mask exchange `bytes` each way.
std::vector<Message> exchange(const Fold& f, int mask, double bytes) {
  std::vector<Message> m;
  for (int v = 0; v < f.p2; ++v) m.push_back({f.real(v), f.real(v ^ mask), bytes});
  return m;
}

void ring_allreduce(Replay& r, int p, double n) {
  const auto m = shifted(p, 1, n / p);
  r.step(m, n / p, p - 1, true);
  r.step(m, 0, p - 1, true);
}

void rd_allreduce(Replay& r, int p, double n) {
  const Fold f(p);
  fold_step(r, f, n, false, n);
  for (int k = 0; k < f.steps; ++k) r.step(exchange(f, 1 << k, n), n);
  fold_step(r, f, n, true, 0);
}

void rabenseifner_allreduce(Replay& r, int p, double n) {
  const Fold f(p);
  fold_step(r, f, n, false, n);
  for (int k = 1; k <= f.steps; ++k) {
    const double half = n / (1 << k);
    r.step(exchange(f, f.p2 >> k, half), half);
  }
  for (int k = 0; k < f.steps; ++k) r.step(exchange(f, 1 << k, n * (1 << k) / f.p2), 0);
  fold_step(r, f, n, true, 0);
}

// Binomial reduce to rank 0 (step k: vr with bit k its lowest set bit sends to vr - 2^k).
void tree_reduce(Replay& r, int p, double n) {
  for (int k = 0; k < ceil_log2(p); ++k) {
    std::vector<Message> m;
    for (int v = 0; v < p; ++v)
      if ((v & ((1 << k) - 1)) == 0 && (v & (1 << k)) != 0) m.push_back({v, v - (1 << k), n});
    r.step(m, n);
  }
}

// Binomial broadcast from rank 0 (largest mask first).
void tree_broadcast(Replay& r, int p, double n) {
  const int steps = ceil_log2(p);
  for (int k = 0; k < steps; ++k) {
    const int mask = 1 << (steps - 1 - k);
    std::vector<Message> m;
    for (int v = 0; v + mask < p; v += 2 * mask) m.push_back({v, v + mask, n});
    r.step(m, 0);
  }
}

// One step of a pipelined algorithm's chunk: what it sends and what the busiest rank then
// reduces.
struct Stage {
  std::vector<Message> messages;
  double reduced = 0;
};

// Recursive doubling among `nodes` node-level participants with the fold, as stages (the fold
// and the unfold only where there is a remainder, as hierarchical_allreduce.cpp runs them):
// `owners(a, b)` the messages node a sends node b in one exchange, each reduced (`reduced`
// bytes) on arrival.
template <typename Owners>
void fold_and_exchange(std::vector<Stage>& stages, int nodes, const Owners& owners,
                       double reduced) {
  const Fold f(nodes);
  auto nodes_stage = [&](const std::vector<std::pair<int, int>>& pairs, double reduce) {
    Stage stage;
    for (auto [a, b] : pairs)
      for (const Message& x : owners(a, b)) stage.messages.push_back(x);
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

// hierarchical_allreduce.cpp: node-local reduce-scatter into m shards (m the fewest ranks any
// node holds; local ranks 0..m-1 own one each), between the nodes' owners of the same index a
// ring of each shard (hierarchical_inter_ring) or the fold and recursive doubling, the
// node-local allgather; the vector in hierarchical_chunks pipelined chunks, chunk c at stage
// g - c in step g, so that a step carries one chunk's intra-node messages beside another's
// inter-node ones and lasts as long as the busier of the link and the memory.
void hierarchical_allreduce(Replay& r, const Topology& t, double n) {
  const int nodes = t.node_count();
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
      for (int j = 0; j < m; ++j) stages[0].messages.push_back({from, ranks[j], shard});
  }
  stages[0].reduced = static_cast<double>(most - 1) * shard;
  auto owners = [&](int node_from, int node_to, double bytes) {
    std::vector<Message> msgs;
    for (int s = 0; s < m; ++s)
      msgs.push_back({t.ranks_of_node(node_from)[s], t.ranks_of_node(node_to)[s], bytes});
    return msgs;
  };
  if (hierarchical_inter_ring(t, static_cast<std::size_t>(n))) {
    // Between nodes: a ring of every shard's owners, a block of shard / N per step, reduced in
    // the first N - 1 steps (the reduce-scatter), copied in the next N - 1 (the allgather).
    const double block = shard / nodes;
    for (int s = 0; s < 2 * (nodes - 1); ++s) {
      Stage stage;
      for (int v = 0; v < nodes; ++v)
        for (const Message& x : owners(v, (v + 1) % nodes, block)) stage.messages.push_back(x);
      stage.reduced = s < nodes - 1 ? block : 0;
      stages.push_back(std::move(stage));
    }
  } else {
    // Between nodes: node-level fold and exchanges, every shard's owners at once.
    fold_and_exchange(
        stages, nodes, [&](int a, int b) { return owners(a, b, shard); }, shard);
  }
  Stage back;
  for (int node = 0; node < nodes; ++node) {
    const auto ranks = t.ranks_of_node(node);
    for (int j = 0; j < m; ++j)
      for (int to : ranks) back.messages.push_back({ranks[j], to, shard});
  }
  stages.push_back(std::move(back));
  const int count = static_cast<int>(stages.size());
  for (int g = 0; g < chunks + count - 1; ++g) {
    std::vector<Message> messages;
    double reduced = 0;
    for (int s = std::max(0, g - chunks + 1); s <= std::min(g, count - 1); ++s) {
      messages.insert(messages.end(), stages[s].messages.begin(), stages[s].messages.end());
      reduced += stages[s].reduced;
    }
    r.step(messages, reduced);
  }
}

// The leaders' ring of hierarchical allgather and reduce_scatter: N - 1 steps, leader v sending
// node (v - s)'s segment (`per_rank` bytes per rank of it) to leader v + 1.
void leaders_ring(Replay& r, const Topology& t, double per_rank, bool reduces) {
  const int nodes = t.node_count();
  for (int s = 0; s < nodes - 1; ++s) {
    std::vector<Message> m;
    double reduced = 0;
    for (int v = 0; v < nodes; ++v) {
      const int segment = ((v - s) % nodes + nodes) % nodes;
      const double bytes = per_rank * static_cast<double>(t.ranks_of_node(segment).size());
      m.push_back({t.leader_of_node(v), t.leader_of_node((v + 1) % nodes), bytes});
      reduced = std::max(reduced, bytes);
    }
    r.step(m, reduces ? reduced : 0);
  }
}

std::size_t most_ranks(const Topology& t) {
  std::size_t most = 0;
  for (int node = 0; node < t.node_count(); ++node)
    most = std::max(most, t.ranks_of_node(node).size());
  return most;
}

// hierarchical_allgather.cpp: blocks to the leader, the leaders' ring, the result to the node.
void hierarchical_allgather(Replay& r, const Topology& t, double n) {
  const double block = n / t.world_size();
  std::vector<Message> in, out;
  for (int q = 0; q < t.world_size(); ++q) {
    const int leader = t.leader_of_node(t.node_of(q));
    in.push_back({q, leader, block});
    out.push_back({leader, q, n});
  }
  r.step(in, 0);
  leaders_ring(r, t, block, false);
  r.step(out, 0);
}

// hierarchical_reduce_scatter.cpp: vectors to the leader (reduced there), the leaders' ring,
// each rank's block from its leader.
void hierarchical_reduce_scatter(Replay& r, const Topology& t, double n) {
  const double block = n / t.world_size();
  std::vector<Message> in, out;
  for (int q = 0; q < t.world_size(); ++q) {
    const int leader = t.leader_of_node(t.node_of(q));
    in.push_back({q, leader, n});
    out.push_back({leader, q, block});
  }
  r.step(in, static_cast<double>(most_ranks(t) - 1) * n);
  leaders_ring(r, t, block, true);
  r.step(out, 0);
}

// hierarchical_broadcast.cpp from rank 0: a binomial tree of the nodes' leaders, then each
// leader to its node.
void hierarchical_broadcast(Replay& r, const Topology& t, double n) {
  const int nodes = t.node_count();
  const int steps = ceil_log2(nodes);
  for (int k = 0; k < steps; ++k) {
    const int mask = 1 << (steps - 1 - k);
    std::vector<Message> m;
    for (int v = 0; v + mask < nodes; v += 2 * mask)
      m.push_back({t.leader_of_node(v), t.leader_of_node(v + mask), n});
    r.step(m, 0);
  }
  std::vector<Message> inside;
  for (int q = 0; q < t.world_size(); ++q) inside.push_back({t.leader_of_node(t.node_of(q)), q, n});
  r.step(inside, 0);
}

void ring_allgather(Replay& r, int p, double n) {
  r.step(shifted(p, 1, n / p), 0, p - 1);
}

void rd_allgather(Replay& r, int p, double n) {
  const Fold f(p);
  for (int k = 0; k < f.steps; ++k) r.step(exchange(f, 1 << k, n * (1 << k) / p), 0);
}

void bruck_allgather(Replay& r, int p, double n) {
  for (int distance = 1; distance < p; distance *= 2)
    r.step(shifted(p, -distance, n * std::min(distance, p - distance) / p), 0);
}

void ring_reduce_scatter(Replay& r, int p, double n) {
  r.step(shifted(p, 1, n / p), n / p, p - 1);
}

// recursive_halving_reduce_scatter.cpp: the fold hands the whole vector over, halving among the
// p2, and the folded ranks get their block back.
void halving_reduce_scatter(Replay& r, int p, double n) {
  const Fold f(p);
  fold_step(r, f, n, false, n);
  for (int k = 1; k <= f.steps; ++k) {
    const double half = n / (1 << k);
    r.step(exchange(f, f.p2 >> k, half), half);
  }
  fold_step(r, f, n / p, true, 0);
}

// scatter_allgather_broadcast.cpp: the root sends each rank its block, then a ring allgather.
void scatter_allgather_broadcast(Replay& r, int p, double n) {
  std::vector<Message> m;
  for (int to = 1; to < p; ++to) m.push_back({0, to, n / p});
  r.step(m, 0);
  ring_allgather(r, p, n);
}

constexpr double infinite = std::numeric_limits<double>::infinity();

}  // namespace

ClusterCost cluster_cost(const ClusterNetwork& cluster, Algorithm algorithm, Collective collective,
                         std::size_t bytes) {
  bool implements = false;
  for (Algorithm a : candidates(collective)) implements = implements || a == algorithm;
  if (!implements)
    throw Error(ErrorCode::invalid_argument, std::string(to_string(algorithm)) +
                                                 " does not implement " +
                                                 std::string(to_string(collective)));
  const Topology& t = cluster.topology;
  const int p = t.world_size();
  const double n = static_cast<double>(bytes);
  if (p <= 1) return {};
  Replay r(cluster);
  using A = Algorithm;
  using C = Collective;
  switch (algorithm) {
    case A::native:
      return {infinite, 0, 0, 0};
    case A::ring:
      if (collective == C::allreduce) ring_allreduce(r, p, n);
      if (collective == C::allgather) ring_allgather(r, p, n);
      if (collective == C::reduce_scatter) ring_reduce_scatter(r, p, n);
      break;
    case A::recursive_doubling:
      if (collective == C::allreduce) rd_allreduce(r, p, n);
      if (collective == C::allgather) {
        if ((p & (p - 1)) != 0) return {infinite, 0, 0, 0};
        rd_allgather(r, p, n);
      }
      break;
    case A::rabenseifner:
      rabenseifner_allreduce(r, p, n);
      break;
    case A::binomial_tree:
      if (collective != C::broadcast) tree_reduce(r, p, n);
      if (collective != C::reduce) tree_broadcast(r, p, n);
      break;
    case A::bruck:
      bruck_allgather(r, p, n);
      break;
    case A::recursive_halving:
      halving_reduce_scatter(r, p, n);
      break;
    case A::scatter_allgather:
      scatter_allgather_broadcast(r, p, n);
      break;
    case A::hierarchical:
      if (t.node_count() < 2 || t.node_count() == p) return {infinite, 0, 0, 0};
      if (collective == C::allreduce) hierarchical_allreduce(r, t, n);
      if (collective == C::allgather) hierarchical_allgather(r, t, n);
      if (collective == C::reduce_scatter) hierarchical_reduce_scatter(r, t, n);
      if (collective == C::broadcast) hierarchical_broadcast(r, t, n);
      break;
  }
  return r.cost();
}

double allreduce_link_bound(const ClusterNetwork& cluster, std::size_t bytes) {
  const double nodes = cluster.topology.node_count();
  return 2 * (nodes - 1) / nodes * static_cast<double>(bytes) / cluster.link_bytes_per_s;
}

}  // namespace loom
