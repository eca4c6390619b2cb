// Binomial trees: reduce (to any root), broadcast (from any root) and allreduce as reduce to
// rank 0 followed by broadcast from it. Ranks are renumbered so that the root is 0.
#include "algorithms.hpp"
#include "ceil_log2.hpp"

namespace loom::algorithms {
namespace {

// Reduce step k (mask 2^k): a rank whose low k bits are zero either sends its partial result
// to vr - mask (when bit k is set) and is done, or receives vr + mask's partial and combines.
class TreeReduceSteps {
 public:
  TreeReduceSteps(int vr, int world) : _vr(vr), _world(world), _steps(ceil_log2(world)) {}
  int steps() const { return _steps; }
  bool active(int k) const { return (_vr & ((1 << k) - 1)) == 0; }
  bool sends(int k) const { return active(k) && (_vr & (1 << k)) != 0; }
  bool receives(int k) const { return active(k) && !sends(k) && _vr + (1 << k) < _world; }

 private:
  int _vr, _world, _steps;
};

// Broadcast step k (mask 2^(K-1-k), largest first): ranks that are multiples of 2 mask send to
// vr + mask; ranks that are odd multiples of mask receive from vr - mask.
class TreeBroadcastSteps {
 public:
  TreeBroadcastSteps(int vr, int world) : _vr(vr), _world(world), _steps(ceil_log2(world)) {}
  int steps() const { return _steps; }
  int mask(int k) const { return 1 << (_steps - 1 - k); }
  bool sends(int k) const { return _vr % (2 * mask(k)) == 0 && _vr + mask(k) < _world; }
  bool receives(int k) const { return _vr % (2 * mask(k)) == mask(k); }

 private:
  int _vr, _world, _steps;
};

class TreeCollective final : public StepwiseAlgorithm {
 public:
  TreeCollective(Backend& backend, const CollectiveArgs& args, const WorkLabel& what)
      : StepwiseAlgorithm(backend, what),
        _kind(args.op),
        _op(args.reduce_op),
        _root(args.op == Collective::allreduce ? 0 : args.root),
        _vr((rank() - _root + world()) % world()),
        _reduce(_vr, world()),
        _broadcast(_vr, world()) {
    if (_kind == Collective::broadcast) {
      _data = args.send;
      return;
    }
    // Reduce and allreduce accumulate in the result buffer where there is one; a reduce's
    // non-root has none, so it accumulates in scratch (its send buffer is read-only).
    const bool has_result = _kind == Collective::allreduce || rank() == _root;
    _data = has_result ? args.recv : scratch(args.send.count(), args.send.dtype());
    copy(_data, args.send);
    _incoming = scratch(args.send.count(), args.send.dtype());
  }

 protected:
  bool begin_step(int step) override {
    const bool reduces = _kind != Collective::broadcast;
    const bool broadcasts = _kind != Collective::reduce;
    const int reduce_steps = reduces ? _reduce.steps() : 0;
    if (step < reduce_steps) {
      if (_reduce.sends(step)) send(_data, real(_vr - (1 << step)));
      if (_reduce.receives(step)) recv(_incoming, real(_vr + (1 << step)));
      return true;
    }
    const int k = step - reduce_steps;
    if (!broadcasts || k >= _broadcast.steps()) return false;
    if (_broadcast.sends(k)) send(_data, real(_vr + _broadcast.mask(k)));
    if (_broadcast.receives(k)) recv(_data, real(_vr - _broadcast.mask(k)));
    return true;
  }

  void end_step(int step) override {
    if (_kind == Collective::broadcast) return;
    if (step >= _reduce.steps()) return;
    if (_reduce.receives(step)) combine(_data, _incoming, _op);
    // The root divides once, before broadcasting, so every rank gets the same bits.
    if (step == _reduce.steps() - 1 && _vr == 0) finish_average(_data, _op);
  }

 private:
  int real(int v) const { return (v + _root) % world(); }

  Collective _kind;
  ReduceOp _op;
  int _root;
  int _vr;
  TreeReduceSteps _reduce;
  TreeBroadcastSteps _broadcast;
  Buffer _data;
  Buffer _incoming;
};

}  // namespace

std::unique_ptr<ChannelWork> tree_allreduce(Backend& b, const CollectiveArgs& a,
                                            const WorkLabel& what) {
  return std::make_unique<TreeCollective>(b, a, what);
}

std::unique_ptr<ChannelWork> tree_reduce(Backend& b, const CollectiveArgs& a,
                                         const WorkLabel& what) {
  return std::make_unique<TreeCollective>(b, a, what);
}

std::unique_ptr<ChannelWork> tree_broadcast(Backend& b, const CollectiveArgs& a,
                                            const WorkLabel& what) {
  return std::make_unique<TreeCollective>(b, a, what);
}

bool tree_allreduce_schedule(const Topology& topology, double n, MessageSchedule& s) {
  tree_reduce_steps(s, topology.world_size(), n);
  tree_broadcast_steps(s, topology.world_size(), n);
  return true;
}

bool tree_reduce_schedule(const Topology& topology, double n, MessageSchedule& s) {
  tree_reduce_steps(s, topology.world_size(), n);
  return true;
}

bool tree_broadcast_schedule(const Topology& topology, double n, MessageSchedule& s) {
  tree_broadcast_steps(s, topology.world_size(), n);
  return true;
}

}  // namespace loom::algorithms
