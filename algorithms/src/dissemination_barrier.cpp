// Dissemination barrier (Hensgen, Finkel & Manber): ceil(log2 p) steps; at step k rank r
// signals r+2^k and waits for r-2^k's signal, so after the last step every rank has heard,
// directly or through others, from every rank. Any rank count. The barrier of a backend whose
// transport has no collectives (PointToPointBackend).
#include "algorithms.hpp"

namespace loom::algorithms {
namespace {

class DisseminationBarrier final : public StepwiseAlgorithm {
 public:
  DisseminationBarrier(Backend& backend, const WorkLabel& what)
      : StepwiseAlgorithm(backend, what),
        // One byte each way: a transfer of nothing is skipped (StepwiseAlgorithm), and the token's
        // value is never read.
        _token(scratch(2, DType::uint8)) {
    *static_cast<unsigned char*>(_token.data()) = 1;
  }

 protected:
  bool begin_step(int step) override {
    const int p = world();
    const int distance = 1 << step;
    if (distance >= p) return false;
    send(_token.slice(0, 1), (rank() + distance) % p);
    recv(_token.slice(1, 1), (rank() - distance + p) % p);
    return true;
  }

 private:
  Buffer _token;
};

}  // namespace

std::unique_ptr<ChannelWork> dissemination_barrier(Backend& b, const CollectiveArgs&,
                                                   const WorkLabel& what) {
  return std::make_unique<DisseminationBarrier>(b, what);
}

}  // namespace loom::algorithms
