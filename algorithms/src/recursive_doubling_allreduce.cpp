// Recursive-doubling allreduce: log2(p) exchanges of the whole vector, with the standard fold
// for a rank count that is not a power of two. The partners of an exchange combine in the same
// operand order, so the result is bit-identical on every rank.
#include "algorithms.hpp"
#include "fold.hpp"

namespace loom::algorithms {

namespace {

// Steps: 0 the fold, 1..L the exchanges (partner = newrank ^ 2^(k-1)), L+1 the unfold.
class RecursiveDoublingAllreduce final : public StepwiseAlgorithm {
 public:
  RecursiveDoublingAllreduce(Backend& backend, const CollectiveArgs& args, const WorkLabel& what)
      : StepwiseAlgorithm(backend, what),
        _out(args.recv),
        _op(args.reduce_op),
        _fold(rank(), world()),
        _incoming(scratch(_out.count(), _out.dtype())) {
    copy(_out, args.send);
  }

 protected:
  bool begin_step(int step) override {
    const int last = _fold.steps + 1;
    if (step > last) return false;
    if (step == 0) {
      if (_fold.sits_out()) send(_out, rank() + 1);
      if (_fold.absorbs()) recv(_incoming, rank() - 1);
    } else if (step == last) {
      if (_fold.absorbs()) send(_out, rank() - 1);
      if (_fold.sits_out()) recv(_out, rank() + 1);
    } else if (!_fold.sits_out()) {
      const int partner = _fold.real(_fold.newrank ^ (1 << (step - 1)));
      send(_out, partner);
      recv(_incoming, partner);
    }
    return true;
  }

  void end_step(int step) override {
    const int last = _fold.steps + 1;
    if (step == last) {
      finish_average(_out, _op);
    } else if (step == 0) {
      if (_fold.absorbs()) combine(_out, _incoming, _op);  // one rank combines: any order
    } else if (!_fold.sits_out()) {
      // Both partners combine in one order, the lower new rank's data first: where the order
      // changes the bits (min/max of +0 and -0, NaNs with different payloads) they still hold
      // the same bits, and so does every rank in the end.
      if ((_fold.newrank >> (step - 1)) & 1)
        combine(_out, _incoming, _out, _op);
      else
        combine(_out, _incoming, _op);
    }
  }

 private:
  Buffer _out;
  ReduceOp _op;
  Fold _fold;
  Buffer _incoming;
};

}  // namespace

std::unique_ptr<ChannelWork> recursive_doubling_allreduce(Backend& b, const CollectiveArgs& a,
                                                          const WorkLabel& what) {
  return std::make_unique<RecursiveDoublingAllreduce>(b, a, what);
}

bool recursive_doubling_allreduce_schedule(const Topology& topology, double n, MessageSchedule& s) {
  const Fold f(0, topology.world_size());
  fold_step(s, f, n, false, n);
  for (int k = 0; k < f.steps; ++k) {
    s.step(n);
    exchange(s, f, 1 << k, n);
  }
  fold_step(s, f, n, true, 0);
  return true;
}

}  // namespace loom::algorithms
