// The loom algorithms and auto: one of loom's own algorithms, or the AlgorithmSelector's
// choice, started with start_collective and waited for.
#include <tuple>

#include "algorithm.hpp"
#include "loom/algorithm_selector.hpp"
#include "loom/error.hpp"

namespace loom::bench {
namespace {

CollectiveArgs args_of(const Call& call) {
  // Broadcast works in place on recv (the benchmark's convention).
  if (call.collective == Collective::broadcast)
    return {call.collective, call.recv, call.recv, call.op, call.root};
  return {call.collective, call.send, call.recv, call.op, call.root};
}

class LoomAlgorithm final : public Algorithm {
 public:
  LoomAlgorithm(Backend& backend, loom::Algorithm algorithm)
      : _backend(backend), _algorithm(algorithm), _name(to_string(algorithm)) {}

  std::string_view name() const noexcept override { return _name; }

  std::string unsupported(Collective collective, DType, ReduceOp) const override {
    for (loom::Algorithm a : candidates(collective))
      if (a == _algorithm) return {};
    return _name + " does not implement " + std::string(to_string(collective));
  }

  std::string cannot_run(const Call& call) const override {
    return loom::cannot_run(_algorithm, args_of(call), _backend);
  }

  void run(const Call& call) override {
    start_collective(_backend, _algorithm, args_of(call))->wait();
  }

 private:
  Backend& _backend;
  loom::Algorithm _algorithm;
  std::string _name;
};

class AutoAlgorithm final : public Algorithm {
 public:
  explicit AutoAlgorithm(Backend& backend)
      : _backend(backend), _selector(AlgorithmSelector::from_environment()) {}

  std::string_view name() const noexcept override { return "auto"; }
  std::string unsupported(Collective, DType, ReduceOp) const override { return {}; }

  std::string chosen(const Call& call) const override {
    const AlgorithmChoice c = _selector.choose(args_of(call), _backend);
    return std::string(to_string(c.algorithm)) + " (" + c.reason + ")";
  }

  // The choice is remembered for the last (collective, size, dtype), as a framework would per
  // tensor; the timed loop then measures the algorithm, not the selection.
  void run(const Call& call) override {
    const CollectiveArgs args = args_of(call);
    const auto key = std::make_tuple(call.collective, call.send.count(), call.recv.count(),
                                     call.send.dtype(), call.root);
    if (!_cached || key != _key) {
      _algorithm = _selector.choose(args, _backend).algorithm;
      _key = key;
      _cached = true;
    }
    start_collective(_backend, _algorithm, args)->wait();
  }

 private:
  Backend& _backend;
  AlgorithmSelector _selector;
  bool _cached = false;
  std::tuple<Collective, std::size_t, std::size_t, DType, int> _key;
  loom::Algorithm _algorithm = loom::Algorithm::native;
};

}  // namespace

std::unique_ptr<Algorithm> make_loom_algorithm(Backend& backend, loom::Algorithm algorithm) {
  return std::make_unique<LoomAlgorithm>(backend, algorithm);
}

std::unique_ptr<Algorithm> make_auto_algorithm(Backend& backend) {
  return std::make_unique<AutoAlgorithm>(backend);
}

}  // namespace loom::bench
