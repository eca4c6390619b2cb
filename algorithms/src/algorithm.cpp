// Algorithm names and parsing, what each can run, and start_collective: each from the algorithm
// table (algorithm_table.cpp).
#include "loom/algorithm.hpp"

#include <limits>
#include <utility>

#include "algorithms.hpp"
#include "loom/algorithm_selector.hpp"
#include "loom/error.hpp"

namespace loom {

std::string_view to_string(Algorithm algorithm) noexcept {
  const AlgorithmInfo* row = find_algorithm(algorithm);
  return row != nullptr ? row->name : std::string_view("unknown");
}

Algorithm parse_algorithm(std::string_view name) {
  for (const AlgorithmInfo& row : algorithm_table()) {
    if (name == row.name) return row.id;
    for (std::string_view alias : row.aliases)
      if (name == alias) return row.id;
  }
  throw Error(ErrorCode::invalid_argument, "unknown algorithm '" + std::string(name) +
                                               "' (expected one of " + algorithm_names() + ")");
}

namespace {

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
  const AlgorithmInfo* row = find_algorithm(algorithm);
  if (row == nullptr)
    return "no algorithm has id " + std::to_string(static_cast<int>(algorithm)) +
           " (the table holds " + algorithm_names() + ")";
  if (row->implementation(args.op) == nullptr)
    return std::string(row->name) + " does not implement " + std::string(to_string(args.op));
  if (!backend.has_algorithm_channel())
    return "the " + std::string(backend.name()) + " backend has no algorithm channel";
  if (!on_host(args)) return "loom's algorithms reduce on the host; the buffers are on a device";
  return row->cannot_run != nullptr ? row->cannot_run(args, backend) : std::string();
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

// The state machine of `algorithm` for `args`, which Backend::validate accepted and which
// cannot_run allows, started (the caller records it).
std::unique_ptr<Work> start_runnable(Backend& backend, Algorithm algorithm,
                                     const CollectiveArgs& args) {
  if (run_trivially(backend, args))
    return std::make_unique<CompletedWork>(
        algorithms::WorkLabel(backend, algorithm, args).describe());
  return find_algorithm(algorithm)->implementation(args.op)->start(backend, args);
}

// start_runnable for arguments nobody has checked yet: validated, then refused with
// ErrorCode::unsupported where cannot_run says why.
std::unique_ptr<Work> start_algorithm(Backend& backend, Algorithm algorithm,
                                      const CollectiveArgs& args) {
  backend.validate(args);
  if (const std::string why = cannot_run(algorithm, args, backend); !why.empty())
    throw Error(ErrorCode::unsupported, algorithms::WorkLabel(backend, algorithm, args).where() +
                                            ": algorithm " + std::string(to_string(algorithm)) +
                                            " cannot run: " + why);
  return start_runnable(backend, algorithm, args);
}

// `start()` (the algorithm's Work) recorded in the backend's flight recorder and on its rank
// board as `name`, as the backend records its own asynchronous calls.
template <class Start>
std::unique_ptr<Work> record_algorithm(Backend& backend, Algorithm algorithm,
                                       const CollectiveArgs& args, std::string_view name,
                                       Backend::OperationRecord* operation, Start&& start) {
  Backend::OperationRecord record;
  return backend.start_recorded({name, to_string(args.op), args.send.dtype(), args.send.count(),
                                 to_string(algorithm), -1, true},
                                operation ? *operation : record, std::forward<Start>(start));
}

}  // namespace

namespace algorithms {

std::unique_ptr<Work> start_chosen(Backend& backend, Algorithm algorithm,
                                   const CollectiveArgs& args, std::string_view name,
                                   Backend::OperationRecord* operation) {
  // native: the backend's recorded call validates the arguments (its only check).
  if (algorithm == Algorithm::native) return backend.collective_async(args, name, operation);
  return record_algorithm(backend, algorithm, args, name, operation, [&] {
    backend.validate(args);
    return start_runnable(backend, algorithm, args);
  });
}

void run_chosen(Backend& backend, Algorithm algorithm, const CollectiveArgs& args) {
  if (algorithm == Algorithm::native) return backend.collective(args);
  start_chosen(backend, algorithm, args, {}, nullptr)->wait();
}

}  // namespace algorithms

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
  // The backend validated `args` before calling here, and algorithm_for_transport chose among
  // the algorithms cannot_run allows: neither check is made again.
  const Algorithm algorithm = algorithm_for_transport(args, backend);
  if (algorithm != Algorithm::native) return start_runnable(backend, algorithm, args);
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
  return record_algorithm(backend, algorithm, args, name, operation,
                          [&] { return start_algorithm(backend, algorithm, args); });
}

void run_collective(Backend& backend, Algorithm algorithm, const CollectiveArgs& args) {
  if (algorithm == Algorithm::native) return backend.collective(args);
  start_collective(backend, algorithm, args)->wait();
}

}  // namespace loom
