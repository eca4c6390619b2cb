// Pairwise-exchange alltoall: p-1 steps; at step s rank r sends its block for rank r+s and
// receives rank r-s's block for itself (Thakur, Rabenseifner & Gropp's long-message alltoall),
// each step one send and one receive, so no rank is flooded by p-1 messages at once. The
// alltoall of a backend whose transport has no collectives (PointToPointBackend).
#include "algorithms.hpp"

namespace loom::algorithms {
namespace {

class PairwiseAlltoall final : public StepwiseAlgorithm {
 public:
  PairwiseAlltoall(Backend& backend, const CollectiveArgs& args, const WorkLabel& what)
      : StepwiseAlgorithm(backend, what),
        _send(args.send),
        _recv(args.recv),
        _block(args.send.count() / static_cast<std::size_t>(backend.world_size())) {
    copy(block(_recv, rank()), block(_send, rank()));
  }

 protected:
  bool begin_step(int step) override {
    const int p = world();
    const int distance = step + 1;
    if (distance >= p) return false;
    const int to = (rank() + distance) % p;
    const int from = (rank() - distance + p) % p;
    send(block(_send, to), to);
    recv(block(_recv, from), from);
    return true;
  }

 private:
  Buffer block(Buffer b, int index) const {
    return b.slice(static_cast<std::size_t>(index) * _block, _block);
  }

  Buffer _send;
  Buffer _recv;
  std::size_t _block;
};

}  // namespace

std::unique_ptr<ChannelWork> pairwise_alltoall(Backend& b, const CollectiveArgs& a,
                                               const WorkLabel& what) {
  return std::make_unique<PairwiseAlltoall>(b, a, what);
}

}  // namespace loom::algorithms
