// Failure and drain: the first failure of a run is kept (named after its node), the run is
// cancelled, and the communication this run had not issued is issued afterwards so every rank
// ends the run at the same point of each stream; a watchdog timeout refuses later runs.
#include "executor_impl.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"

namespace loom {

using detail::NodeData;

std::string Executor::Impl::where(std::uint32_t i) const {
  const NodeData& node = graph.nodes[i];
  std::string s = std::string(to_string(node.kind)) + " node '" + node.name + "'";
  if (node.kind == NodeKind::collective)
    s += " (" + detail::describe(node) + ", issue #" + std::to_string(plan.issue_index[i]) + ")";
  else if (node.kind == NodeKind::send || node.kind == NodeKind::recv)
    s += " (" + detail::describe(node) + ")";
  return s + " on rank " + std::to_string(backend.rank()) + " of " +
         std::to_string(backend.world_size()) + " (" + std::string(backend.name()) + ")";
}

void Executor::Impl::fail(std::uint32_t i, std::exception_ptr error) {
  bool first = false;
  {
    std::lock_guard lock(failure.mutex);
    if (!failure.error) {
      const bool compute = graph.nodes[i].kind == NodeKind::compute;
      ErrorCode code = compute ? ErrorCode::node_failed : ErrorCode::backend_failure;
      std::string what;
      try {
        std::rethrow_exception(error);
      } catch (const Error& e) {
        what = e.what();
        if (!compute) code = e.code();
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
        what = "an exception that is not a std::exception";
      }
      std::string message = where(i) + " failed: " + what;
      if (code == ErrorCode::timeout) {
        failure.timed_out = true;
        // Who is missing, from the rank board (which does not depend on the stuck operation).
        int failed_rank = -1;
        if (const std::int64_t seq = flight.operation_of[i].seq; seq >= 0) {
          message += "; collective #" + std::to_string(seq) + ": " +
                     backend.who_is_missing(seq, &failed_rank);
        } else {
          message += "; the peer did not take part";
        }
        if (failed_rank >= 0) code = ErrorCode::peer_failed;
      }
      first = true;
      failure.error = std::make_exception_ptr(Error(code, message));
      failure.message = message;
    }
  }
  failure.failed.store(true, std::memory_order_release);
  wiring.flow_graph.cancel();
  for (auto& sequencer : plan.sequencers)
    for (std::uint32_t slot : sequencer->close())
      wiring.async_of[sequencer->node(slot)]->gateway().release_wait();
  if (!first) return;
  // Tell the other ranks before draining: a peer whose collective completes with this rank's
  // stale data (the drain) learns it when its run ends, and one waiting for this rank learns
  // why at its timeout. No issue is in flight once the sequencers are closed.
  const bool drains = !failure.timed_out && !plan.sequencers.empty() &&
                      plan.sequencers[0]->next() < plan.sequencers[0]->size();
  ErrorCode code = ErrorCode::internal;
  try {
    std::rethrow_exception(failure.error);
  } catch (const Error& e) {
    code = e.code();
  }
  const bool consequence =
      code == ErrorCode::timeout || code == ErrorCode::peer_failed || code == ErrorCode::cancelled;
  backend.publish_failure(failure.message, drains, consequence);
}

// A run that completed here may hold stale data from a peer whose run failed and drained
// (issued the rest of the run's collectives without its data): fail it, naming that peer.
void Executor::Impl::check_peers_after_run() {
  RankBoard* board = backend.rank_board();
  if (!board || backend.world_size() == 1) return;
  // Consumed even after a failed run, so that a later run does not report it again.
  const auto stale = board->take_stale_run_failure(flight.first_seq,
                                                   backend.flight_recorder().next_collective_seq());
  if (!stale || failure.failed.load()) return;
  std::string name = backend.flight_recorder().name_of_collective(stale->seq);
  std::string message = "Executor::run on rank " + std::to_string(backend.rank()) + " of " +
                        std::to_string(backend.world_size()) + " (" + std::string(backend.name()) +
                        "): rank " + std::to_string(stale->rank) +
                        " failed in this run before issuing collective #" +
                        std::to_string(stale->seq) + (name.empty() ? "" : " '" + name + "'") +
                        " and issued the rest for it, so this run's results hold its stale "
                        "data (discard them): " +
                        stale->message;
  std::lock_guard lock(failure.mutex);
  failure.error = std::make_exception_ptr(Error(ErrorCode::peer_failed, message));
  failure.message = message;
  failure.failed.store(true, std::memory_order_release);
  failure.peer_only = true;
}

// After a failed run: issue what this run had not issued yet, so every rank ends the run at
// the same point of each communication stream and the next run lines up again.
void Executor::Impl::drain() {
  for (auto& sequencer : plan.sequencers) {
    for (std::uint32_t slot = sequencer->next(); slot < sequencer->size(); ++slot) {
      const std::uint32_t i = sequencer->node(slot);
      try {
        auto work = start_operation(i);
        const bool done = timeout.count() > 0 ? work->wait_for(timeout) : (work->wait(), true);
        if (!done) {
          // Never wait for it again (its destructor would): it is abandoned with the run.
          work->abandon();
          failure.timed_out = true;
          throw Error(ErrorCode::timeout,
                      "did not complete within " +
                          environment::seconds_text(options.timeout->count()) + "; " +
                          (flight.operation_of[i].seq >= 0
                               ? backend.who_is_missing(flight.operation_of[i].seq)
                               : std::string("the peer did not take part")));
        }
      } catch (const std::exception& e) {
        failure.poisoned = "an earlier run failed and draining its communication failed too at " +
                           where(i) + ": " + e.what();
        return;
      }
    }
  }
}

// After wait_for_all of a failed run: reset the flow graph, then either refuse later runs (a
// timeout left the communicator in an unknown state) or drain.
void Executor::Impl::end_failed_run() {
  wiring.flow_graph.reset();
  if (!failure.message.empty() && !failure.dumped) {
    failure.dumped = true;
    backend.dump_flight_record(failure.message);
  }
  if (failure.peer_only) return;  // every collective of the run completed: nothing to drain
  if (!failure.timed_out) {
    drain();
    return;
  }
  std::string what;
  try {
    std::rethrow_exception(failure.error);
  } catch (const Error& e) {
    what = e.message();
  }
  failure.poisoned = "a watchdog timeout left the communicator in an unknown state (" + what + ")";
}

}  // namespace loom
