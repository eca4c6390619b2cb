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
        message += "; the " + std::string(backend.name()) +
                   " backend cannot tell which ranks did not arrive";
      }
      failure.error = std::make_exception_ptr(Error(code, message));
    }
  }
  failure.failed.store(true, std::memory_order_release);
  wiring.flow_graph.cancel();
  for (auto& sequencer : plan.sequencers)
    for (std::uint32_t slot : sequencer->close())
      wiring.async_of[sequencer->node(slot)]->gateway().release_wait();
}

// After a failed run: issue what this run had not issued yet, so every rank ends the run at
// the same point of each communication stream and the next run lines up again.
void Executor::Impl::drain() {
  for (auto& sequencer : plan.sequencers) {
    for (std::uint32_t slot = sequencer->next(); slot < sequencer->size(); ++slot) {
      const std::uint32_t i = sequencer->node(slot);
      try {
        auto work = start_operation(i);
        if (timeout.count() > 0 ? !work->wait_for(timeout) : (work->wait(), false))
          throw Error(ErrorCode::timeout, "did not complete within " +
                                              environment::seconds_text(options.timeout->count()));
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
