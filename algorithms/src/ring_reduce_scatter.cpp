// Ring reduce-scatter: p-1 steps; at step s rank r forwards its partial sum of block r-s-1 to
// r+1 and receives the partial of block r-s-2 from r-1, which it combines in place with its
// own input, so that after the last step it holds block r reduced over every rank.
//
// Memory: the partial received at a step is sent at the next one, so two partial buffers
// alternate. The output is one of them (the backend refuses an output that overlaps the input,
// and the output is free until the last step): one scratch block of the output's size, none at
// 2 ranks. When the caller gives the input as workspace (CollectiveArgs::send_is_workspace)
// there is none at all: every partial is received into the output and combined into the input
// block it belongs to, which the next step sends.
#include <cstddef>

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
        _input_is_workspace(args.send_is_workspace) {
    if (world() > 2 && !_input_is_workspace) _other = scratch(_out.count(), _out.dtype());
  }

 protected:
  bool begin_step(int step) override {
    const int p = world();
    if (step >= p - 1) return false;
    const Buffer outgoing =
        step == 0 || _input_is_workspace ? input_block(rank() - step - 1) : partial(step - 1);
    send(outgoing, (rank() + 1) % p);
    recv(partial(step), (rank() + p - 1) % p);
    return true;
  }

  void end_step(int step) override {
    const bool last = step == world() - 2;
    const Buffer incoming = partial(step);
    const Buffer own = input_block(rank() - step - 2);
    // incoming (op) own, in that order on every path (a tie of min or max keeps the first).
    const Buffer result = last ? _out : _input_is_workspace ? own : incoming;
    if (result.count() != 0)
      kernels::reduce(result.data(), incoming.data(), own.data(), result.count(), result.dtype(),
                      _op);
    if (last) finish_average(_out, _op);
  }

 private:
  Buffer input_block(int index) const {
    const int p = world();
    const auto b = static_cast<std::size_t>(((index % p) + p) % p);
    return _send.slice(b * _out.count(), _out.count());
  }

  // Where step `step`'s partial lands: the output always when the input is the workspace (the
  // step sends an input block); otherwise, counted back from the last step, even steps use
  // the output and odd ones the scratch block, so that a partial is never received into the
  // buffer the same step sends.
  Buffer partial(int step) const {
    return _input_is_workspace || (world() - 2 - step) % 2 == 0 ? _out : _other;
  }

  Buffer _send;
  Buffer _out;
  ReduceOp _op;
  bool _input_is_workspace;  // partials accumulate in the input's blocks
  Buffer _other;
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
