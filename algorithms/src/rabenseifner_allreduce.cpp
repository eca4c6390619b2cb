// Rabenseifner's allreduce: recursive-halving reduce-scatter, then recursive-doubling
// allgather, over the power-of-two ranks left by the standard fold. Out of place it never
// copies the send buffer into the result: until its first reduction a rank sends from the send
// buffer, and that reduction writes send (op) received into the result.
#include "algorithms.hpp"
#include "fold.hpp"
#include "halving_range.hpp"

namespace loom::algorithms {
namespace {

// Steps: 0 fold; 1..L halving (mask p2/2 .. 1); L+1..2L doubling (mask 1 .. p2/2); 2L+1
// unfold. Participant v owns, after the halving, block v of the vector cut into p2 blocks.
class RabenseifnerAllreduce final : public StepwiseAlgorithm {
 public:
  RabenseifnerAllreduce(Backend& backend, const CollectiveArgs& args, const WorkLabel& what)
      : StepwiseAlgorithm(backend, what),
        _in(args.send),
        _out(args.recv),
        _source(args.send),
        _op(args.reduce_op),
        _fold(rank(), world()),
        _incoming(scratch(_out.count(), _out.dtype())),
        _halving(_fold.p2) {}

 protected:
  bool begin_step(int step) override {
    const int L = _fold.steps;
    if (step > 2 * L + 1) return false;
    if (step == 0) {
      if (_fold.sits_out()) send(_in, rank() + 1);
      if (_fold.absorbs()) recv(_incoming, rank() - 1);
      return true;
    }
    if (step == 2 * L + 1) {
      if (_fold.absorbs()) send(_out, rank() - 1);
      if (_fold.sits_out()) recv(_out, rank() + 1);
      return true;
    }
    if (_fold.sits_out()) return true;
    const int v = _fold.newrank;
    if (step <= L) {
      const HalvingRange::Exchange exchange = _halving.exchange(v, step);
      const Buffer keep = elements(_out, exchange.keep);
      send(elements(_source, exchange.give), _fold.real(exchange.partner));
      recv(_incoming.slice(0, keep.count()), _fold.real(exchange.partner));
    } else {
      const int mask = 1 << (step - L - 1);
      const int partner = v ^ mask;
      const int mine = v & ~(mask - 1);
      const int theirs = partner & ~(mask - 1);
      send(elements(_out, {mine, mine + mask}), _fold.real(partner));
      recv(elements(_out, {theirs, theirs + mask}), _fold.real(partner));
    }
    return true;
  }

  void end_step(int step) override {
    const int L = _fold.steps;
    if (step == 0) {
      if (_fold.absorbs()) {
        combine(_out, _in, _incoming, _op);
        _source = _out;
      }
    } else if (step == 2 * L + 1) {
      finish_average(_out, _op);
    } else if (step <= L && !_fold.sits_out()) {
      const Buffer keep = elements(_out, _halving.kept());
      combine(keep, elements(_source, _halving.kept()), _incoming.slice(0, keep.count()), _op);
      _source = _out;
      _halving.narrow();
    }
  }

 private:
  // Elements of participants `p` of `whole` when it is cut into p2 blocks.
  Buffer elements(Buffer whole, Participants p) const {
    if (p.first >= p.last) return whole.slice(0, 0);
    const Range a = block_of(whole.count(), _fold.p2, p.first);
    const Range b = block_of(whole.count(), _fold.p2, p.last - 1);
    return whole.slice(a.offset, b.offset + b.count - a.offset);
  }

  Buffer _in;
  Buffer _out;
  Buffer _source;  // where this rank's partial result is: the send buffer until it reduces
  ReduceOp _op;
  Fold _fold;
  Buffer _incoming;
  HalvingRange _halving;
};

}  // namespace

std::unique_ptr<ChannelWork> rabenseifner_allreduce(Backend& b, const CollectiveArgs& a,
                                                    const WorkLabel& what) {
  return std::make_unique<RabenseifnerAllreduce>(b, a, what);
}

bool rabenseifner_allreduce_schedule(const Topology& topology, double n, MessageSchedule& s) {
  const Fold f(0, topology.world_size());
  fold_step(s, f, n, false, n);
  for (int k = 1; k <= f.steps; ++k) {  // recursive halving: half of what is left each step
    const double half = n / (1 << k);
    s.step(half);
    exchange(s, f, f.p2 >> k, half);
  }
  for (int k = 0; k < f.steps; ++k) {  // recursive doubling of the reduced blocks
    s.step();
    exchange(s, f, 1 << k, n * (1 << k) / f.p2);
  }
  fold_step(s, f, n, true, 0);
  return true;
}

}  // namespace loom::algorithms
