// Rabenseifner's allreduce: recursive-halving reduce-scatter, then recursive-doubling
// allgather, over the power-of-two ranks left by the standard fold. Out of place it never
// copies the send buffer into the result: until its first reduction a rank sends from the send
// buffer, and that reduction writes send (op) received into the result.
#include "algorithms.hpp"
#include "fold.hpp"

namespace loom::algorithms {
namespace {

// Steps: 0 fold; 1..L halving (mask p2/2 .. 1); L+1..2L doubling (mask 1 .. p2/2); 2L+1
// unfold. Participant v owns, after the halving, block v of the vector cut into p2 blocks.
class RabenseifnerAllreduce final : public StepWork {
 public:
  RabenseifnerAllreduce(Backend& backend, const CollectiveArgs& args, std::string what)
      : StepWork(backend, std::move(what)),
        _in(args.send),
        _out(args.recv),
        _source(args.send),
        _op(args.reduce_op),
        _fold(rank(), world()),
        _incoming(scratch(_out.count(), _out.dtype())),
        _hi(_fold.p2) {}

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
      const int mask = _fold.p2 >> step;
      const int partner = v ^ mask;
      const int mid = _lo + (_hi - _lo) / 2;
      const bool lower = v < partner;
      _keep_lo = lower ? _lo : mid;
      _keep_hi = lower ? mid : _hi;
      const Buffer give = lower ? elements(_source, mid, _hi) : elements(_source, _lo, mid);
      const Buffer keep = elements(_out, _keep_lo, _keep_hi);
      send(give, _fold.real(partner));
      recv(_incoming.slice(0, keep.count()), _fold.real(partner));
    } else {
      const int mask = 1 << (step - L - 1);
      const int partner = v ^ mask;
      const int mine = v & ~(mask - 1);
      const int theirs = partner & ~(mask - 1);
      send(elements(_out, mine, mine + mask), _fold.real(partner));
      recv(elements(_out, theirs, theirs + mask), _fold.real(partner));
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
      const Buffer keep = elements(_out, _keep_lo, _keep_hi);
      combine(keep, elements(_source, _keep_lo, _keep_hi), _incoming.slice(0, keep.count()), _op);
      _source = _out;
      _lo = _keep_lo;
      _hi = _keep_hi;
    }
  }

 private:
  // Elements of participants [first, last) of `whole` when it is cut into p2 blocks.
  Buffer elements(Buffer whole, int first, int last) const {
    if (first >= last) return whole.slice(0, 0);
    const Range a = block_of(whole.count(), _fold.p2, first);
    const Range b = block_of(whole.count(), _fold.p2, last - 1);
    return whole.slice(a.offset, b.offset + b.count - a.offset);
  }

  Buffer _in;
  Buffer _out;
  Buffer _source;  // where this rank's partial result is: the send buffer until it reduces
  ReduceOp _op;
  Fold _fold;
  Buffer _incoming;
  int _lo = 0, _hi;
  int _keep_lo = 0, _keep_hi = 0;
};

}  // namespace

std::unique_ptr<ChannelWork> rabenseifner_allreduce(Backend& b, const CollectiveArgs& a,
                                                    std::string what) {
  return std::make_unique<RabenseifnerAllreduce>(b, a, std::move(what));
}

}  // namespace loom::algorithms
