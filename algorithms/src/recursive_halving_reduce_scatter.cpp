// Recursive-halving reduce-scatter: log2(p2) steps, each exchanging half of the remaining
// range with the partner at that distance, after the standard fold for p not a power of two.
// Participant v stands for rank v + rem's block, or for ranks 2v and 2v+1's blocks if v < rem.
#include "algorithms.hpp"
#include "fold.hpp"

namespace loom::algorithms {
namespace {

// Steps: 0 fold (whole input), 1..L halving, L+1 hand the sitting-out rank its block.
class RecursiveHalvingReduceScatter final : public StepWork {
 public:
  RecursiveHalvingReduceScatter(Backend& backend, const CollectiveArgs& args, std::string what)
      : StepWork(backend, std::move(what)),
        _out(args.recv),
        _op(args.reduce_op),
        _fold(rank(), world()),
        _work(scratch(args.send.count(), args.send.dtype())),
        _incoming(scratch(args.send.count(), args.send.dtype())),
        _hi(_fold.p2) {
    copy(_work, args.send);
  }

 protected:
  bool begin_step(int step) override {
    const int L = _fold.steps;
    if (step > L + 1) return false;
    if (step == 0) {
      if (_fold.sits_out()) send(_work, rank() + 1);
      if (_fold.absorbs()) recv(_incoming, rank() - 1);
      return true;
    }
    if (step == L + 1) {
      if (_fold.absorbs()) send(own_block(rank() - 1), rank() - 1);
      if (_fold.sits_out()) recv(_out, rank() + 1);
      return true;
    }
    if (_fold.sits_out()) return true;
    const int v = _fold.newrank;
    const int partner = v ^ (_fold.p2 >> step);
    const int mid = _lo + (_hi - _lo) / 2;
    const bool lower = v < partner;
    _keep_lo = lower ? _lo : mid;
    _keep_hi = lower ? mid : _hi;
    const Buffer keep = elements(_keep_lo, _keep_hi);
    send(lower ? elements(mid, _hi) : elements(_lo, mid), _fold.real(partner));
    recv(_incoming.slice(0, keep.count()), _fold.real(partner));
    return true;
  }

  void end_step(int step) override {
    const int L = _fold.steps;
    if (step == 0) {
      if (_fold.absorbs()) combine(_work, _incoming, _op);
    } else if (step <= L) {
      if (_fold.sits_out()) return;
      const Buffer keep = elements(_keep_lo, _keep_hi);
      combine(keep, _incoming.slice(0, keep.count()), _op);
      _lo = _keep_lo;
      _hi = _keep_hi;
    } else {
      if (!_fold.sits_out()) copy(_out, own_block(rank()));
      finish_average(_out, _op);
    }
  }

 private:
  // The first original rank participant v stands for, and one past its last.
  int first_rank(int v) const { return v < _fold.rem ? 2 * v : v + _fold.rem; }
  Buffer elements(int first, int last) const {
    const std::size_t block = _out.count();
    const auto begin = static_cast<std::size_t>(first_rank(first)) * block;
    const auto end =
        static_cast<std::size_t>(first_rank(last - 1) + (last - 1 < _fold.rem ? 2 : 1)) * block;
    return _work.slice(begin, end - begin);
  }
  Buffer own_block(int r) const {
    return _work.slice(static_cast<std::size_t>(r) * _out.count(), _out.count());
  }

  Buffer _out;
  ReduceOp _op;
  Fold _fold;
  Buffer _work;
  Buffer _incoming;
  int _lo = 0, _hi;
  int _keep_lo = 0, _keep_hi = 0;
};

}  // namespace

std::unique_ptr<ChannelWork> recursive_halving_reduce_scatter(Backend& b, const CollectiveArgs& a,
                                                              std::string what) {
  return std::make_unique<RecursiveHalvingReduceScatter>(b, a, std::move(what));
}

}  // namespace loom::algorithms
