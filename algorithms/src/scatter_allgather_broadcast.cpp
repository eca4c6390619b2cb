// Scatter-allgather broadcast (van de Geijn): the root sends block i of the buffer to rank i,
// then a ring allgather completes every rank's copy; about 2n bytes per rank instead of n log p.
#include "algorithms.hpp"

namespace loom::algorithms {
namespace {

// Steps: 0 the scatter (linear: at most a handful of ranks per node in loom's use), then the
// p-1 ring steps over uneven blocks.
class ScatterAllgatherBroadcast final : public StepwiseAlgorithm {
 public:
  ScatterAllgatherBroadcast(Backend& backend, const CollectiveArgs& args, const WorkLabel& what)
      : StepwiseAlgorithm(backend, what), _root(args.root), _blocks(args.send, 0, false) {}

 protected:
  bool begin_step(int step) override {
    const int p = world();
    if (step == 0) {
      if (rank() == _root) {
        for (int r = 0; r < p; ++r)
          if (r != _root) send(_blocks.block(r, p), r);
      } else {
        recv(_blocks.block(rank(), p), _root);
      }
      return true;
    }
    const int s = step - 1;
    if (s >= p - 1) return false;
    send(_blocks.block((rank() - s + p) % p, p), (rank() + 1) % p);
    recv(_blocks.block((rank() - s - 1 + 2 * p) % p, p), (rank() + p - 1) % p);
    return true;
  }

 private:
  int _root;
  RingAllgatherSteps _blocks;
};

}  // namespace

std::unique_ptr<ChannelWork> scatter_allgather_broadcast(Backend& b, const CollectiveArgs& a,
                                                         const WorkLabel& what) {
  return std::make_unique<ScatterAllgatherBroadcast>(b, a, what);
}

bool scatter_allgather_broadcast_schedule(const Topology& topology, double n, MessageSchedule& s) {
  const int p = topology.world_size();
  s.step();
  for (int to = 1; to < p; ++to) s.message(0, to, n / p);
  ring_allgather_steps(s, p, n);
  return true;
}

}  // namespace loom::algorithms
