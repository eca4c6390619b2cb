// Asynchronous runs and external nodes: start() returns at once, signal() completes an external
// node from any thread, wait(Task) and wait() wait for a node or the run within the timeout.
#include <algorithm>

#include "executor_impl.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"

namespace loom {

namespace flow = tbb::flow;
using Signal = detail::RunProgress::Signal;

std::uint32_t Executor::Impl::node_of(const Task& task, std::string_view call) const {
  const std::string what = "Executor::" + std::string(call);
  if (!task.valid())
    throw Error(ErrorCode::invalid_argument, what + ": a default-constructed Task");
  if (task.id() >= graph.nodes.size() || graph.nodes[task.id()].name != task.name())
    throw Error(ErrorCode::invalid_argument,
                what + ": '" + task.name() + "' is not a node of the graph this executor runs");
  return static_cast<std::uint32_t>(task.id());
}

void Executor::Impl::notify_waiters() {
  std::lock_guard lock(progress.mutex);
  progress.changed.notify_all();
}

// The async_node body of an external node: its predecessors are done.
void Executor::Impl::arrive_external(std::uint32_t i, AsyncNode::gateway_type& gateway) {
  if (failure.failed.load(std::memory_order_acquire)) return;
  const std::int64_t now = profile.enabled ? profile.now_ns() : 0;
  std::unique_lock lock(progress.mutex);
  Signal& state = progress.signal_of[i];
  if (state == Signal::cancelled) return;
  if (profile.enabled) profile.records[i].ready_ns = profile.records[i].start_ns = now;
  if (state == Signal::early) {
    state = Signal::done;
    lock.unlock();
    if (profile.enabled) profile.records[i].end_ns = now;
    finished(i);
    gateway.try_put(flow::continue_msg());
    return;
  }
  state = Signal::arrived;
  gateway.reserve_wait();  // the run does not end until signal() or a failure releases it
}

void Executor::Impl::signal(std::uint32_t i) {
  if (graph.nodes[i].kind != NodeKind::external)
    throw Error(ErrorCode::invalid_argument,
                "Executor::signal: " + where(i) + " is not an external node (Graph::external)");
  std::unique_lock lock(progress.mutex);
  if (!progress.running.load())
    throw Error(ErrorCode::invalid_argument,
                "Executor::signal: " + where(i) + ": no run in progress (Executor::start)");
  Signal& state = progress.signal_of[i];
  switch (state) {
    case Signal::cancelled:
      return;  // the run failed: nothing waits for it any more
    case Signal::early:
    case Signal::done:
      throw Error(ErrorCode::invalid_argument,
                  "Executor::signal: " + where(i) + " was already signalled in this run");
    case Signal::waiting:
      state = Signal::early;
      return;
    case Signal::arrived:
      break;
  }
  state = Signal::done;
  lock.unlock();
  if (profile.enabled) profile.records[i].end_ns = profile.now_ns();
  finished(i);
  auto& gateway = wiring.async_of[i]->gateway();
  gateway.try_put(flow::continue_msg());
  gateway.release_wait();
}

// From fail(): no external node waits for its signal any more.
void Executor::Impl::cancel_external() {
  std::vector<std::uint32_t> release;
  {
    std::lock_guard lock(progress.mutex);
    for (std::uint32_t i : progress.external_nodes) {
      Signal& state = progress.signal_of[i];
      if (state == Signal::arrived) release.push_back(i);
      if (state != Signal::done) state = Signal::cancelled;
    }
    progress.changed.notify_all();
  }
  for (std::uint32_t i : release) wiring.async_of[i]->gateway().release_wait();
}

// The time is up while waiting for `waited` (or the whole run): when external nodes that wait
// for nothing but their signal are still unsignalled (their predecessors are done, or they have
// none), the run fails naming them (true); otherwise what holds the run is upstream of any
// unsignalled node, in the watchdog's hands (communication) or the compute's (false).
bool Executor::Impl::expire(std::uint32_t waited) {
  std::vector<std::uint32_t> missing;
  {
    std::lock_guard lock(progress.mutex);
    for (std::uint32_t i : progress.external_nodes)
      if (progress.signal_of[i] == Signal::arrived) missing.push_back(i);
    for (std::uint32_t i : progress.external_sources)
      if (progress.signal_of[i] == Signal::waiting) missing.push_back(i);
    // The first one whose predecessors are done is the one the run is stuck on.
    std::stable_partition(missing.begin(), missing.end(), [&](std::uint32_t i) {
      return progress.signal_of[i] == Signal::arrived;
    });
  }
  if (missing.empty()) return false;
  std::string message = "was not signalled within " +
                        environment::seconds_text(options.timeout->count()) +
                        " (Executor::signal; the work outside the executor that completes it "
                        "did not report)";
  if (missing.size() > 1) {
    message += "; " + std::to_string(missing.size()) + " external nodes wait for their signal: ";
    for (std::size_t k = 0; k < missing.size() && k < 8; ++k)
      message += (k ? ", '" : "'") + graph.nodes[missing[k]].name + "'";
    if (missing.size() > 8) message += ", ...";
  }
  if (waited != missing.front() && waited < graph.nodes.size())
    message += "; waited for by '" + graph.nodes[waited].name + "'";
  fail(missing.front(), std::make_exception_ptr(Error(ErrorCode::timeout, message)));
  return true;
}

void Executor::Impl::wait_for(std::uint32_t i, bool issue_only) {
  const auto reached = [&] { return issue_only ? progress.issued(i) : progress.done(i); };
  if (reached()) return;
  const bool bounded = timeout.count() > 0;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool expired = false;
  {
    progress.waiters.fetch_add(1);
    std::unique_lock lock(progress.mutex);
    while (!reached() && !failure.failed.load()) {
      if (!progress.running.load()) break;
      if (!bounded) {
        progress.changed.wait(lock);
      } else if (progress.changed.wait_until(lock, deadline) == std::cv_status::timeout) {
        expired = !reached() && !failure.failed.load();
        break;
      }
    }
    progress.waiters.fetch_sub(1);
  }
  if (reached()) return;
  if (!progress.running.load() && !failure.failed.load())
    throw Error(ErrorCode::invalid_argument,
                "Executor::wait: " + where(i) + ": no run in progress (Executor::start)");
  if (expired && !expire(i))
    throw Error(ErrorCode::timeout,
                "Executor::wait: " + where(i) +
                    (issue_only ? " was not issued within " : " did not complete within ") +
                    environment::seconds_text(options.timeout->count()));
  std::lock_guard lock(failure.mutex);
  std::rethrow_exception(failure.error);
}

// wait(): until every node is done or the run failed. With external nodes still unsignalled
// when the time is up, the run fails; otherwise the flow graph's wait takes over.
void Executor::Impl::wait_for_everything() {
  const std::size_t n = graph.nodes.size();
  auto all_done = [&] { return progress.finished_count.load() == n; };
  const bool bounded = timeout.count() > 0;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool expired = false;
  {
    progress.waiters.fetch_add(1);
    std::unique_lock lock(progress.mutex);
    while (!failure.failed.load() && !all_done()) {
      if (!bounded) {
        progress.changed.wait(lock);
      } else if (progress.changed.wait_until(lock, deadline) == std::cv_status::timeout) {
        expired = !failure.failed.load() && !all_done();
        break;
      }
    }
    progress.waiters.fetch_sub(1);
  }
  if (expired) expire(static_cast<std::uint32_t>(n));
}

}  // namespace loom
