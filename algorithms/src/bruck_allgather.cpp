// Bruck's allgather: ceil(log2 p) steps for any rank count. Rank r collects blocks r, r+1, ...
// in scratch (step k: send the first min(2^k, p-2^k) blocks to r-2^k, receive as many from
// r+2^k behind them), then rotates them into place.
#include <algorithm>

#include "algorithms.hpp"

namespace loom::algorithms {
namespace {

class BruckAllgather final : public StepwiseAlgorithm {
 public:
  BruckAllgather(Backend& backend, const CollectiveArgs& args, const WorkLabel& what)
      : StepwiseAlgorithm(backend, what),
        _out(args.recv),
        _block(args.send.count()),
        _gathered(scratch(args.recv.count(), args.recv.dtype())) {
    copy(blocks(_gathered, 0, 1), args.send);
  }

 protected:
  bool begin_step(int step) override {
    const int p = world();
    const int distance = 1 << step;
    if (distance >= p) return false;
    const int count = std::min(distance, p - distance);
    send(blocks(_gathered, 0, count), (rank() - distance + p) % p);
    recv(blocks(_gathered, distance, count), (rank() + distance) % p);
    return true;
  }

  void end_step(int step) override {
    const int p = world();
    if ((2 << step) < p) return;  // not the last step
    for (int i = 0; i < p; ++i) copy(blocks(_out, (rank() + i) % p, 1), blocks(_gathered, i, 1));
  }

 private:
  Buffer blocks(Buffer b, int first, int count) const {
    return b.slice(static_cast<std::size_t>(first) * _block,
                   static_cast<std::size_t>(count) * _block);
  }

  Buffer _out;
  std::size_t _block;
  Buffer _gathered;
};

}  // namespace

std::unique_ptr<ChannelWork> bruck_allgather(Backend& b, const CollectiveArgs& a,
                                             const WorkLabel& what) {
  return std::make_unique<BruckAllgather>(b, a, what);
}

bool bruck_allgather_schedule(const Topology& topology, double n, MessageSchedule& s) {
  const int p = topology.world_size();
  for (int distance = 1; distance < p; distance *= 2) {
    s.step();
    shifted(s, p, -distance, n * std::min(distance, p - distance) / p);
  }
  s.copy(n);  // the final rotation into rank order
  return true;
}

}  // namespace loom::algorithms
