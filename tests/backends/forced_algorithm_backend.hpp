// ForcedAlgorithmBackend: a Backend whose collectives all run one loom algorithm over another
// backend, so the independent collective checks can verify every algorithm.
#pragma once

#include <memory>
#include <string>

#include "loom/algorithm.hpp"
#include "loom/algorithm_selector.hpp"

namespace loom::testing {

/// @brief Runs every collective with `algorithm` on `inner` (native where cannot_run says the
/// algorithm cannot, which last_algorithm() then reports); point-to-point goes to `inner`.
class ForcedAlgorithmBackend final : public Backend {
 public:
  ForcedAlgorithmBackend(Backend& inner, Algorithm algorithm)
      : _inner(inner), _algorithm(algorithm) {
    set_topology(inner.topology());
  }
  /// @brief Each collective with the algorithm `selector` chooses for it (auto), which must
  /// outlive this backend.
  ForcedAlgorithmBackend(Backend& inner, const AlgorithmSelector& selector)
      : _inner(inner), _algorithm(Algorithm::native), _selector(&selector) {
    set_topology(inner.topology());
  }

  int rank() const noexcept override { return _inner.rank(); }
  int world_size() const noexcept override { return _inner.world_size(); }
  std::string_view name() const noexcept override { return _inner.name(); }
  /// @brief The algorithm the last collective actually ran with.
  Algorithm last_algorithm() const noexcept { return _last; }

 protected:
  std::unique_ptr<Work> start(const CollectiveArgs& args) {
    const Algorithm wanted = _selector ? _selector->choose(args, _inner).algorithm : _algorithm;
    _last = cannot_run(wanted, args, _inner).empty() ? wanted : Algorithm::native;
    return start_collective(_inner, _last, args);
  }
  std::unique_ptr<Work> start_broadcast(Buffer buffer, int root) override {
    return start({Collective::broadcast, buffer, buffer, ReduceOp::sum, root});
  }
  std::unique_ptr<Work> start_reduce(Buffer send, Buffer recv, ReduceOp op, int root) override {
    return start({Collective::reduce, send, recv, op, root});
  }
  std::unique_ptr<Work> start_allreduce(Buffer send, Buffer recv, ReduceOp op) override {
    return start({Collective::allreduce, send, recv, op, 0});
  }
  std::unique_ptr<Work> start_allgather(Buffer send, Buffer recv) override {
    return start({Collective::allgather, send, recv, ReduceOp::sum, 0});
  }
  std::unique_ptr<Work> start_reduce_scatter(Buffer send, Buffer recv, ReduceOp op) override {
    return start({Collective::reduce_scatter, send, recv, op, 0});
  }
  std::unique_ptr<Work> start_alltoall(Buffer send, Buffer recv) override {
    return start({Collective::alltoall, send, recv, ReduceOp::sum, 0});
  }
  std::unique_ptr<Work> start_barrier() override {
    return start({Collective::barrier, {}, {}, ReduceOp::sum, 0});
  }
  std::unique_ptr<Work> start_send(Buffer buffer, int peer, int tag) override {
    return _inner.send_async(buffer, peer, tag);
  }
  std::unique_ptr<Work> start_recv(Buffer buffer, int peer, int tag) override {
    return _inner.recv_async(buffer, peer, tag);
  }
  std::optional<Status> poll_probe(int peer, int tag) override {
    return _inner.try_probe(peer, tag);
  }
  Message receive_message(int peer, int tag) override { return _inner.recv_message(peer, tag); }
  int max_tag() const noexcept override { return _inner.algorithm_max_tag(); }

 private:
  Backend& _inner;
  Algorithm _algorithm;
  const AlgorithmSelector* _selector = nullptr;
  Algorithm _last = Algorithm::native;
};

/// @brief Every (collective, algorithm) pair loom implements besides native.
inline std::vector<std::pair<Collective, Algorithm>> algorithm_pairs() {
  std::vector<std::pair<Collective, Algorithm>> pairs;
  for (Collective c : {Collective::allreduce, Collective::allgather, Collective::reduce_scatter,
                       Collective::broadcast, Collective::reduce})
    for (Algorithm a : candidates(c))
      if (a != Algorithm::native) pairs.emplace_back(c, a);
  return pairs;
}

}  // namespace loom::testing
