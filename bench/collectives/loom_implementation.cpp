// The loom algorithms and auto: one of loom's own algorithms, or the AlgorithmSelector's
// choice, performed with run_collective (native: the backend's blocking call).
#include <tuple>

#include "implementation.hpp"
#include "loom/algorithm_selector.hpp"
#include "loom/error.hpp"

namespace loom::bench {
namespace {

class LoomImplementation final : public Implementation {
 public:
  LoomImplementation(Backend& backend, loom::Algorithm algorithm)
      : _backend(backend), _algorithm(algorithm), _name(to_string(algorithm)) {}

  std::string_view name() const noexcept override { return _name; }

  std::string unsupported(Collective collective, DType, ReduceOp) const override {
    for (loom::Algorithm a : candidates(collective))
      if (a == _algorithm) return {};
    return _name + " does not implement " + std::string(to_string(collective));
  }

  std::string cannot_run(const CollectiveArgs& call) const override {
    return loom::cannot_run(_algorithm, call, _backend);
  }

  void run(const CollectiveArgs& call) override { run_collective(_backend, _algorithm, call); }

 private:
  Backend& _backend;
  loom::Algorithm _algorithm;
  std::string _name;
};

class AutoImplementation final : public Implementation {
 public:
  explicit AutoImplementation(Backend& backend)
      : _backend(backend), _selector(AlgorithmSelector::for_backend(backend)) {}

  std::string_view name() const noexcept override { return "auto"; }
  std::string unsupported(Collective, DType, ReduceOp) const override { return {}; }

  std::string chosen(const CollectiveArgs& call) const override {
    const AlgorithmChoice c = _selector.choose(call, _backend, TimingForm::blocking);
    return std::string(to_string(c.algorithm)) + " (" + c.reason + ")";
  }

  // The choice is remembered for the last (collective, size, dtype), as a framework would per
  // tensor; the timed loop then measures the algorithm, not the selection.
  void run(const CollectiveArgs& call) override {
    const CollectiveArgs args = call;
    const auto key = std::make_tuple(call.op, call.send.count(), call.recv.count(),
                                     call.send.dtype(), call.root);
    if (!_cached || key != _key) {
      _algorithm =
          _selector.choose(args, _backend, TimingForm::blocking).algorithm;  // run_collective
      _key = key;
      _cached = true;
    }
    run_collective(_backend, _algorithm, args);
  }

 private:
  Backend& _backend;
  AlgorithmSelector _selector;
  bool _cached = false;
  std::tuple<Collective, std::size_t, std::size_t, DType, int> _key;
  loom::Algorithm _algorithm = loom::Algorithm::native;
};

}  // namespace

std::unique_ptr<Implementation> make_loom_implementation(Backend& backend,
                                                         loom::Algorithm algorithm) {
  return std::make_unique<LoomImplementation>(backend, algorithm);
}

std::unique_ptr<Implementation> make_auto_implementation(Backend& backend) {
  return std::make_unique<AutoImplementation>(backend);
}

}  // namespace loom::bench
