// Recursive-doubling allgather (power-of-two rank counts): at step k rank r swaps the 2^k
// blocks it holds with rank r ^ 2^k.
#include "algorithms.hpp"

namespace loom::algorithms {
namespace {

class RecursiveDoublingAllgather final : public StepwiseAlgorithm {
 public:
  RecursiveDoublingAllgather(Backend& backend, const CollectiveArgs& args, const WorkLabel& what)
      : StepwiseAlgorithm(backend, what), _out(args.recv), _block(args.send.count()) {
    copy(blocks(rank(), 1), args.send);
  }

 protected:
  bool begin_step(int step) override {
    const int mask = 1 << step;
    if (mask >= world()) return false;
    const int partner = rank() ^ mask;
    send(blocks(rank() & ~(mask - 1), mask), partner);
    recv(blocks(partner & ~(mask - 1), mask), partner);
    return true;
  }

 private:
  Buffer blocks(int first, int count) const {
    return _out.slice(static_cast<std::size_t>(first) * _block,
                      static_cast<std::size_t>(count) * _block);
  }

  Buffer _out;
  std::size_t _block;
};

}  // namespace

std::unique_ptr<ChannelWork> recursive_doubling_allgather(Backend& b, const CollectiveArgs& a,
                                                          const WorkLabel& what) {
  return std::make_unique<RecursiveDoublingAllgather>(b, a, what);
}

bool recursive_doubling_allgather_schedule(const Topology& topology, double n, MessageSchedule& s) {
  const int p = topology.world_size();
  if ((p & (p - 1)) != 0) return false;
  const Fold f(0, p);
  for (int k = 0; k < f.steps; ++k) {
    s.step();
    exchange(s, f, 1 << k, n * (1 << k) / p);
  }
  return true;
}

}  // namespace loom::algorithms
