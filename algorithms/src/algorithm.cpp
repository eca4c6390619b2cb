// Algorithm names, the candidates of each collective, what each can run, and start_collective.
#include "loom/algorithm.hpp"

#include <array>
#include <limits>

#include "algorithms.hpp"
#include "loom/algorithm_selector.hpp"
#include "loom/error.hpp"

namespace loom {

std::string_view to_string(Algorithm algorithm) noexcept {
  switch (algorithm) {
    case Algorithm::native:
      return "native";
    case Algorithm::ring:
      return "ring";
    case Algorithm::recursive_doubling:
      return "rd";
    case Algorithm::rabenseifner:
      return "rabenseifner";
    case Algorithm::binomial_tree:
      return "tree";
    case Algorithm::bruck:
      return "bruck";
    case Algorithm::recursive_halving:
      return "halving";
    case Algorithm::scatter_allgather:
      return "scatter_allgather";
    case Algorithm::hierarchical:
      return "hierarchical";
  }
  return "unknown";
}

Algorithm parse_algorithm(std::string_view name) {
  for (auto a :
       {Algorithm::native, Algorithm::ring, Algorithm::recursive_doubling, Algorithm::rabenseifner,
        Algorithm::binomial_tree, Algorithm::bruck, Algorithm::recursive_halving,
        Algorithm::scatter_allgather, Algorithm::hierarchical})
    if (name == to_string(a)) return a;
  if (name == "recursive_doubling") return Algorithm::recursive_doubling;
  if (name == "binomial" || name == "binomial_tree") return Algorithm::binomial_tree;
  if (name == "recursive_halving") return Algorithm::recursive_halving;
  throw Error(ErrorCode::invalid_argument,
              "unknown algorithm '" + std::string(name) +
                  "' (expected native, ring, rd, rabenseifner, tree, bruck, halving, "
                  "scatter_allgather or hierarchical)");
}

std::span<const Algorithm> candidates(Collective collective) noexcept {
  using A = Algorithm;
  static constexpr std::array allreduce{A::native,       A::ring,          A::recursive_doubling,
                                        A::rabenseifner, A::binomial_tree, A::hierarchical};
  static constexpr std::array allgather{A::native, A::ring, A::recursive_doubling, A::bruck,
                                        A::hierarchical};
  static constexpr std::array reduce_scatter{A::native, A::ring, A::recursive_halving,
                                             A::hierarchical};
  static constexpr std::array broadcast{A::native, A::binomial_tree, A::scatter_allgather,
                                        A::hierarchical};
  static constexpr std::array reduce{A::native, A::binomial_tree};
  static constexpr std::array native_only{A::native};
  switch (collective) {
    case Collective::allreduce:
      return allreduce;
    case Collective::allgather:
      return allgather;
    case Collective::reduce_scatter:
      return reduce_scatter;
    case Collective::broadcast:
      return broadcast;
    case Collective::reduce:
      return reduce;
    case Collective::alltoall:
    case Collective::barrier:
      break;
  }
  return native_only;
}

namespace {

std::size_t count_of(const CollectiveArgs& args) {
  return args.send.count();
}

// Judged on what every rank passes alike: a reduce's recv matters on the root only, and a
// broadcast has one buffer.
bool on_host(const CollectiveArgs& args) {
  const bool recv_counts = args.op != Collective::reduce && args.op != Collective::broadcast;
  return args.send.device().kind == DeviceKind::cpu &&
         (!recv_counts || args.recv.device().kind == DeviceKind::cpu);
}

}  // namespace

std::string cannot_run(Algorithm algorithm, const CollectiveArgs& args, const Backend& backend) {
  if (algorithm == Algorithm::native) return {};
  const int world = backend.world_size();
  bool listed = false;
  for (Algorithm a : candidates(args.op)) listed = listed || a == algorithm;
  if (!listed)
    return std::string(to_string(algorithm)) + " does not implement " +
           std::string(to_string(args.op));
  if (!backend.has_algorithm_channel())
    return "the " + std::string(backend.name()) + " backend has no algorithm channel";
  if (!on_host(args)) return "loom's algorithms reduce on the host; the buffers are on a device";
  const std::size_t count = count_of(args);
  const auto ranks = static_cast<std::size_t>(world);
  const bool too_small = count != 0 && count < ranks;
  switch (algorithm) {
    case Algorithm::ring:
      if (args.op == Collective::allreduce && too_small)
        return "count " + std::to_string(count) + " < " + std::to_string(world) +
               " ranks (ring needs one element per rank)";
      return {};
    case Algorithm::rabenseifner:
      if (too_small)
        return "count " + std::to_string(count) + " < " + std::to_string(world) +
               " ranks (rabenseifner needs one element per rank)";
      return {};
    case Algorithm::scatter_allgather:
      if (too_small)
        return "count " + std::to_string(count) + " < " + std::to_string(world) +
               " ranks (scatter_allgather needs one element per rank)";
      return {};
    case Algorithm::hierarchical: {
      const Topology& topology = backend.topology();
      if (topology.node_count() < 2)
        return "one node (hierarchical needs ranks on several nodes; flat algorithms serve one)";
      if (topology.node_count() == world)
        return "one rank per node (hierarchical would be the flat algorithm)";
      return {};
    }
    case Algorithm::recursive_doubling:
      if (args.op == Collective::allgather && (world & (world - 1)) != 0)
        return "rd allgather needs a power-of-two rank count, not " + std::to_string(world);
      return {};
    default:
      return {};
  }
}

namespace {

// Rank counts of one or empty buffers need no message: done here, identically on every rank
// (so no rank consumes an algorithm tag another does not).
bool run_trivially(Backend& backend, const CollectiveArgs& a) {
  const bool empty = a.send.count() == 0;
  if (backend.world_size() != 1 && !empty) return false;
  if (empty) return true;
  switch (a.op) {
    case Collective::allreduce:
    case Collective::reduce_scatter:
    case Collective::reduce:  // the one rank is the root
      algorithms::copy(a.recv, a.send);
      return true;
    case Collective::allgather:
      algorithms::copy(a.recv.slice(0, a.send.count()), a.send);
      return true;
    default:
      return true;
  }
}

// The state machine of `algorithm` for `args`, started (the caller records it).
std::unique_ptr<Work> start_algorithm(Backend& backend, Algorithm algorithm,
                                      const CollectiveArgs& args) {
  backend.validate(args);
  const algorithms::WorkLabel what(backend, algorithm, args);
  if (const std::string why = cannot_run(algorithm, args, backend); !why.empty())
    throw Error(
        ErrorCode::unsupported,
        what.where() + ": algorithm " + std::string(to_string(algorithm)) + " cannot run: " + why);
  if (run_trivially(backend, args)) return std::make_unique<CompletedWork>(what.describe());

  namespace alg = algorithms;
  std::unique_ptr<alg::ChannelWork> work;
  switch (args.op) {
    case Collective::allreduce:
      if (algorithm == Algorithm::ring) work = alg::ring_allreduce(backend, args, what);
      if (algorithm == Algorithm::recursive_doubling)
        work = alg::recursive_doubling_allreduce(backend, args, what);
      if (algorithm == Algorithm::rabenseifner)
        work = alg::rabenseifner_allreduce(backend, args, what);
      if (algorithm == Algorithm::binomial_tree) work = alg::tree_allreduce(backend, args, what);
      if (algorithm == Algorithm::hierarchical)
        work = alg::hierarchical_allreduce(backend, args, what);
      break;
    case Collective::allgather:
      if (algorithm == Algorithm::ring) work = alg::ring_allgather(backend, args, what);
      if (algorithm == Algorithm::recursive_doubling)
        work = alg::recursive_doubling_allgather(backend, args, what);
      if (algorithm == Algorithm::bruck) work = alg::bruck_allgather(backend, args, what);
      if (algorithm == Algorithm::hierarchical)
        work = alg::hierarchical_allgather(backend, args, what);
      break;
    case Collective::reduce_scatter:
      if (algorithm == Algorithm::ring) work = alg::ring_reduce_scatter(backend, args, what);
      if (algorithm == Algorithm::recursive_halving)
        work = alg::recursive_halving_reduce_scatter(backend, args, what);
      if (algorithm == Algorithm::hierarchical)
        work = alg::hierarchical_reduce_scatter(backend, args, what);
      break;
    case Collective::broadcast:
      if (algorithm == Algorithm::binomial_tree) work = alg::tree_broadcast(backend, args, what);
      if (algorithm == Algorithm::scatter_allgather)
        work = alg::scatter_allgather_broadcast(backend, args, what);
      if (algorithm == Algorithm::hierarchical)
        work = alg::hierarchical_broadcast(backend, args, what);
      break;
    case Collective::reduce:
      if (algorithm == Algorithm::binomial_tree) work = alg::tree_reduce(backend, args, what);
      break;
    default:
      break;
  }
  if (!work)
    throw Error(ErrorCode::internal,
                what.where() + ": no implementation of " + std::string(to_string(algorithm)));
  work->start();
  return work;
}

}  // namespace

Algorithm algorithm_for_transport(const CollectiveArgs& args, const Backend& backend) {
  if (args.op == Collective::alltoall || args.op == Collective::barrier) return Algorithm::native;
  if (backend.world_size() == 1 || args.send.count() == 0) return Algorithm::native;
  static const AlgorithmSelector model;  // the built-in parameters: no file, no override
  const std::size_t bytes = selection_bytes(args);
  Algorithm best = Algorithm::native;
  double best_s = std::numeric_limits<double>::infinity();
  for (Algorithm a : candidates(args.op)) {
    if (a == Algorithm::native || !cannot_run(a, args, backend).empty()) continue;
    const double s = model.predict(a, args.op, bytes, backend.topology());
    if (s < best_s) {
      best = a;
      best_s = s;
    }
  }
  if (best == Algorithm::native)
    throw Error(ErrorCode::internal, std::string(backend.where(to_string(args.op))) +
                                         ": no loom algorithm can run it on this transport");
  return best;
}

std::unique_ptr<Work> start_on_algorithms(Backend& backend, const CollectiveArgs& args) {
  const Algorithm algorithm = algorithm_for_transport(args, backend);
  if (algorithm != Algorithm::native) return start_algorithm(backend, algorithm, args);
  const algorithms::WorkLabel what(backend, algorithm, args);
  std::unique_ptr<algorithms::ChannelWork> work;
  if (args.op == Collective::barrier) {
    if (backend.world_size() == 1) return std::make_unique<CompletedWork>(what.describe());
    work = algorithms::dissemination_barrier(backend, args, what);
  } else if (args.op == Collective::alltoall) {
    if (backend.world_size() == 1 || args.send.count() == 0) {
      algorithms::copy(args.recv, args.send);
      return std::make_unique<CompletedWork>(what.describe());
    }
    work = algorithms::pairwise_alltoall(backend, args, what);
  } else {
    // No message to move (one rank, or empty buffers): done here, as start_algorithm does.
    if (!run_trivially(backend, args))
      throw Error(ErrorCode::internal, what.where() + ": no loom algorithm was chosen");
    return std::make_unique<CompletedWork>(what.describe());
  }
  work->start();
  return work;
}

std::unique_ptr<Work> start_collective(Backend& backend, Algorithm algorithm,
                                       const CollectiveArgs& args, std::string_view name,
                                       Backend::OperationRecord* operation) {
  if (algorithm == Algorithm::native) return backend.collective_async(args, name, operation);
  Backend::OperationRecord record;
  return backend.start_recorded({name, to_string(args.op), args.send.dtype(), args.send.count(),
                                 to_string(algorithm), -1, true},
                                operation ? *operation : record,
                                [&] { return start_algorithm(backend, algorithm, args); });
}

void run_collective(Backend& backend, Algorithm algorithm, const CollectiveArgs& args) {
  if (algorithm == Algorithm::native) return backend.collective(args);
  start_collective(backend, algorithm, args)->wait();
}

}  // namespace loom
