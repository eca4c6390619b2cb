// ClusterNetwork: loom's collective algorithms replayed message by message (each row's schedule
// in the algorithm table) on a node's memory and each node's link.
#include "loom/cluster_network.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

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

// Replays a schedule: each step's messages (all its parts at once) load every node's link (out
// at the sender, in at the receiver) or memory, and the step lasts as long as the busiest of
// them, then its reduction on the busiest rank (overlapped with the wire when pipelined).
class Replay {
 public:
  explicit Replay(const ClusterNetwork& c)
      : _c(c),
        _out(c.topology.node_count()),
        _in(c.topology.node_count()),
        _memory(c.topology.node_count()) {}

  void run(const MessageSchedule& schedule) {
    for (const MessageSchedule::Step& step : schedule.steps()) {
      if (step.repeat <= 0) continue;
      std::fill(_out.begin(), _out.end(), 0.0);
      std::fill(_in.begin(), _in.end(), 0.0);
      std::fill(_memory.begin(), _memory.end(), 0.0);
      bool crosses = false, inside = false;
      for (const MessageSchedule::Part& part : schedule.parts(step))
        for (const ScheduledMessage& m : schedule.messages(part)) {
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
      const double wire =
          std::max(crosses ? _c.link_latency_s + link / _c.link_bytes_per_s : 0.0,
                   inside ? _c.intra_latency_s + memory / _c.intra_bytes_per_s : 0.0);
      const double reduce = step.reduced * _c.gamma_s_per_byte;
      _cost.seconds += step.repeat * (step.pipelined ? std::max(wire, reduce) : wire + reduce);
      _cost.link_bytes += step.repeat * link;
      _cost.memory_bytes += step.repeat * memory;
      _cost.steps += step.repeat;
    }
  }

  ClusterCost cost() const { return _cost; }

 private:
  const ClusterNetwork& _c;
  std::vector<double> _out, _in, _memory;
  ClusterCost _cost;
};

constexpr double infinite = std::numeric_limits<double>::infinity();

}  // namespace

ClusterCost cluster_cost(const ClusterNetwork& cluster, Algorithm algorithm, Collective collective,
                         std::size_t bytes) {
  const AlgorithmInfo* row = find_algorithm(algorithm);
  const AlgorithmImplementation* run = row != nullptr ? row->implementation(collective) : nullptr;
  if (run == nullptr)
    throw Error(ErrorCode::invalid_argument, std::string(to_string(algorithm)) +
                                                 " does not implement " +
                                                 std::string(to_string(collective)));
  if (cluster.topology.world_size() <= 1) return {};
  // native is the library's own call: no schedule, not modelled here.
  if (run->schedule == nullptr) return {infinite, 0, 0, 0};
  MessageSchedule schedule;
  if (!run->schedule(cluster.topology, static_cast<double>(bytes), schedule))
    return {infinite, 0, 0, 0};
  Replay replay(cluster);
  replay.run(schedule);
  return replay.cost();
}

double allreduce_link_bound(const ClusterNetwork& cluster, std::size_t bytes) {
  const double nodes = cluster.topology.node_count();
  return 2 * (nodes - 1) / nodes * static_cast<double>(bytes) / cluster.link_bytes_per_s;
}

}  // namespace loom
