// Ring reduce-scatter: p-1 steps; at step s rank r forwards its partial sum of block r-s-1 to
// r+1 and combines the partial of block r-s-2 arriving from r-1 with its own input, so that
// after the last step it holds block r reduced over every rank.
#include "algorithms.hpp"
#include "loom/kernels/reduce.hpp"

namespace loom::algorithms {
namespace {

class RingReduceScatter final : public StepwiseAlgorithm {
 public:
  RingReduceScatter(Backend& backend, const CollectiveArgs& args, const WorkLabel& what)
      : StepwiseAlgorithm(backend, what),
        _send(args.send),
        _out(args.recv),
        _op(args.reduce_op),
        _incoming(scratch(_out.count(), _out.dtype())) {
    _partial[0] = scratch(_out.count(), _out.dtype());
    _partial[1] = scratch(_out.count(), _out.dtype());
  }

 protected:
  bool begin_step(int step) override {
    const int p = world();
    if (step >= p - 1) return false;
    const Buffer outgoing = step == 0 ? input_block(rank() - 1) : _partial[(step - 1) % 2];
    send(outgoing, (rank() + 1) % p);
    recv(_incoming, (rank() + p - 1) % p);
    return true;
  }

  void end_step(int step) override {
    const bool last = step == world() - 2;
    const Buffer result = last ? _out : _partial[step % 2];
    const Buffer own = input_block(rank() - step - 2);
    if (result.count() != 0)
      kernels::reduce(result.data(), _incoming.data(), own.data(), result.count(), result.dtype(),
                      _op);
    if (last) finish_average(_out, _op);
  }

 private:
  Buffer input_block(int index) const {
    const int p = world();
    const auto b = static_cast<std::size_t>(((index % p) + p) % p);
    return _send.slice(b * _out.count(), _out.count());
  }

  Buffer _send;
  Buffer _out;
  ReduceOp _op;
  Buffer _incoming;
  Buffer _partial[2];
};

}  // namespace

std::unique_ptr<ChannelWork> ring_reduce_scatter(Backend& b, const CollectiveArgs& a,
                                                 const WorkLabel& what) {
  return std::make_unique<RingReduceScatter>(b, a, what);
}

bool ring_reduce_scatter_schedule(const Topology& topology, double n, MessageSchedule& s) {
  const int p = topology.world_size();
  s.step(n / p, p - 1);
  shifted(s, p, 1, n / p);
  return true;
}

}  // namespace loom::algorithms
