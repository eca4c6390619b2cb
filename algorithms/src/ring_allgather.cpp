// Ring allgather: p-1 steps; at step s rank r passes block r-s to r+1 and receives block r-s-1.
// Blocks may differ in size (scatter-allgather broadcast uses uneven ones).
#include "algorithms.hpp"

namespace loom::algorithms {

RingAllgatherSteps::RingAllgatherSteps(Buffer out, std::size_t block, bool even)
    : _out(out), _block(block), _even(even) {}

Buffer RingAllgatherSteps::block(int index, int world) const {
  if (_even) return _out.slice(static_cast<std::size_t>(index) * _block, _block);
  const Range r = block_of(_out.count(), world, index);
  return _out.slice(r.offset, r.count);
}

namespace {

class RingAllgather final : public StepwiseAlgorithm {
 public:
  RingAllgather(Backend& backend, const CollectiveArgs& args, const WorkLabel& what)
      : StepwiseAlgorithm(backend, what), _blocks(args.recv, args.send.count(), true) {
    copy(_blocks.block(rank(), world()), args.send);
  }

 protected:
  bool begin_step(int step) override {
    if (step >= world() - 1) return false;
    const int p = world();
    send(_blocks.block((rank() - step + p) % p, p), (rank() + 1) % p);
    recv(_blocks.block((rank() - step - 1 + 2 * p) % p, p), (rank() + p - 1) % p);
    return true;
  }

 private:
  RingAllgatherSteps _blocks;
};

}  // namespace

std::unique_ptr<ChannelWork> ring_allgather(Backend& b, const CollectiveArgs& a,
                                            const WorkLabel& what) {
  return std::make_unique<RingAllgather>(b, a, what);
}

bool ring_allgather_schedule(const Topology& topology, double n, MessageSchedule& s) {
  ring_allgather_steps(s, topology.world_size(), n);
  return true;
}

}  // namespace loom::algorithms
