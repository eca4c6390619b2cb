// Recursive-halving reduce-scatter: log2(p2) steps, each exchanging half of the remaining
// range with the partner at that distance, after the standard fold for p not a power of two.
// Participant v stands for rank v + rem's block, or for ranks 2v and 2v+1's blocks if v < rem.
#include "algorithms.hpp"
#include "fold.hpp"
#include "halving_range.hpp"

namespace loom::algorithms {
namespace {

// Steps: 0 fold (whole input), 1..L halving, L+1 hand the sitting-out rank its block.
class RecursiveHalvingReduceScatter final : public StepwiseAlgorithm {
 public:
  RecursiveHalvingReduceScatter(Backend& backend, const CollectiveArgs& args, const WorkLabel& what)
      : StepwiseAlgorithm(backend, what),
        _out(args.recv),
        _op(args.reduce_op),
        _fold(rank(), world()),
        _work(scratch(args.send.count(), args.send.dtype())),
        _incoming(scratch(args.send.count(), args.send.dtype())),
        _halving(_fold.p2) {
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
    const HalvingRange::Exchange exchange = _halving.exchange(_fold.newrank, step);
    const Buffer keep = elements(exchange.keep);
    send(elements(exchange.give), _fold.real(exchange.partner));
    recv(_incoming.slice(0, keep.count()), _fold.real(exchange.partner));
    return true;
  }

  void end_step(int step) override {
    const int L = _fold.steps;
    if (step == 0) {
      if (_fold.absorbs()) combine(_work, _incoming, _op);
    } else if (step <= L) {
      if (_fold.sits_out()) return;
      const Buffer keep = elements(_halving.kept());
      combine(keep, _incoming.slice(0, keep.count()), _op);
      _halving.narrow();
    } else {
      if (!_fold.sits_out()) copy(_out, own_block(rank()));
      finish_average(_out, _op);
    }
  }

 private:
  // The first original rank participant v stands for, and one past its last.
  int first_rank(int v) const { return v < _fold.rem ? 2 * v : v + _fold.rem; }
  Buffer elements(Participants p) const {
    const std::size_t block = _out.count();
    const auto begin = static_cast<std::size_t>(first_rank(p.first)) * block;
    const auto end =
        static_cast<std::size_t>(first_rank(p.last - 1) + (p.last - 1 < _fold.rem ? 2 : 1)) * block;
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
  HalvingRange _halving;
};

}  // namespace

std::unique_ptr<ChannelWork> recursive_halving_reduce_scatter(Backend& b, const CollectiveArgs& a,
                                                              const WorkLabel& what) {
  return std::make_unique<RecursiveHalvingReduceScatter>(b, a, what);
}

bool recursive_halving_reduce_scatter_schedule(const Topology& topology, double n,
                                               MessageSchedule& s) {
  const int p = topology.world_size();
  const Fold f(0, p);
  fold_step(s, f, n, false, n);  // the whole vector handed over
  for (int k = 1; k <= f.steps; ++k) {
    const double half = n / (1 << k);
    s.step(half);
    exchange(s, f, f.p2 >> k, half);
  }
  fold_step(s, f, n / p, true, 0);  // the folded ranks' blocks back
  return true;
}

}  // namespace loom::algorithms
