// Executor: compiles a graph (validation, the fixed issue order, the cross-rank agreement, the
// flow graph) and runs it: compute on TBB workers, communication issued through per-stream
// sequencers and completed by the progress engine.
#include "loom/executor.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/task_arena.h>

#include "analysis.hpp"
#include "executor_impl.hpp"
#include "loom/algorithm.hpp"
#include "loom/environment.hpp"
#include "loom/error.hpp"
#include "loom/flight_recorder.hpp"

namespace loom {

namespace flow = tbb::flow;
using detail::NodeData;

Executor::Impl::Impl(const Graph& g, Backend& b, ExecutorOptions o, OwnArena a)
    : backend(b),
      options(o.resolved()),
      graph(*g._state),
      parallelism(std::move(a.parallelism)),
      arena(std::move(a.arena)) {}

void Executor::Impl::compile() {
  timeout = environment::timeout_from_seconds(options.timeout->count(), "ExecutorOptions::timeout");
  profile.enabled = *options.profile;
  profile.profiler.set_enabled(profile.enabled);
  // The progress thread first, before anything communicates: a priority this rank may not have
  // (LOOM_PROGRESS_PRIORITY=realtime without the privilege) fails here, not after its peers
  // entered the cross-rank checks below and wait for it.
  const bool needs_engine = std::any_of(graph.nodes.begin(), graph.nodes.end(), [](const auto& n) {
    return communicates(n.kind) || n.placement == Placement::gpu;
  });
  // External nodes: the step's compute runs outside loom (an autograd engine hands over).
  const bool external = std::any_of(graph.nodes.begin(), graph.nodes.end(),
                                    [](const auto& n) { return n.kind == NodeKind::external; });
  if (needs_engine)
    engine = std::make_unique<ProgressEngine>(
        *options.progress_priority,
        external ? ComputeBeside::outside : ComputeBeside::loom_workers);
  try {
    algorithms.selector = AlgorithmSelector::for_backend(backend, std::nullopt, timeout);
  } catch (const Error& e) {
    // Making the selector is compile's first exchange between the ranks (and its calibration).
    throw Error(e.code(), "Executor::compile: " + e.message());
  }

  detail::check_structure(graph);
  detail::check_acyclic(graph);
  detail::check_communication(graph, backend.world_size());
  plan.order = detail::schedule_order(graph);
  detail::check_races(graph, plan.order);
  wiring.gpu = detail::GpuNodes::create(graph, plan.order);

  plan_issue_order();
  flight.operation_of.assign(graph.nodes.size(), {});
  check_ranks_agree();
  measure_clock_offset();
  build_flow_graph();
  if (profile.enabled) profile.records.assign(graph.nodes.size(), detail::NodeRecord{});
  progress.finished_in = std::make_unique<std::atomic<std::uint64_t>[]>(graph.nodes.size());
  progress.issued_in = std::make_unique<std::atomic<std::uint64_t>[]>(graph.nodes.size());
  progress.signal_of.assign(graph.nodes.size(), detail::RunProgress::Signal::waiting);
  std::vector<char> has_predecessor(graph.nodes.size(), 0);
  for (const auto& edge : graph.edges) has_predecessor[edge.second] = 1;
  for (std::uint32_t i = 0; i < graph.nodes.size(); ++i)
    if (graph.nodes[i].kind == NodeKind::external) {
      progress.external_nodes.push_back(i);
      if (!has_predecessor[i]) progress.external_sources.push_back(i);
    }
}

// Streams of communication: the communicator's collectives, and one per (direction, peer, tag)
// for point-to-point, whose matching order is then the same on every run.
void Executor::Impl::plan_issue_order() {
  const std::size_t n = graph.nodes.size();
  plan.issue_index.assign(n, -1);
  plan.sequencer_of.assign(n, -1);
  plan.slot_of.assign(n, 0);
  algorithms.algorithm_of.assign(n, Algorithm::native);
  algorithms.reason_of_collective.clear();
  std::map<std::tuple<int, int, int>, std::vector<std::uint32_t>> channels;
  for (std::uint32_t i : plan.order) {
    const NodeData& node = graph.nodes[i];
    if (node.kind == NodeKind::collective) {
      plan.issue_index[i] = static_cast<std::int64_t>(plan.collective_order.size());
      plan.collective_order.push_back(i);
      AlgorithmChoice planned = algorithms.selector.choose(node.collective, backend);
      algorithms.algorithm_of[i] = planned.algorithm;
      algorithms.reason_of_collective.push_back(std::move(planned.reason));
    } else if (node.kind == NodeKind::send || node.kind == NodeKind::recv) {
      channels[{static_cast<int>(node.kind), node.peer, node.tag}].push_back(i);
    }
  }
  auto add_sequencer = [&](std::string name, std::vector<std::uint32_t> nodes,
                           std::size_t limit = 0) {
    const int id = static_cast<int>(plan.sequencers.size());
    for (std::uint32_t slot = 0; slot < nodes.size(); ++slot) {
      plan.sequencer_of[nodes[slot]] = id;
      plan.slot_of[nodes[slot]] = slot;
    }
    plan.sequencers.push_back(std::make_unique<detail::Sequencer>(
        std::move(name), std::move(nodes), [this](std::uint32_t node) { issue(node); }, limit));
  };
  add_sequencer("world", plan.collective_order, options.collectives_in_flight);
  for (auto& [key, nodes] : channels) {
    const auto& [kind, peer, tag] = key;
    add_sequencer(std::string(to_string(static_cast<NodeKind>(kind))) + " peer " +
                      std::to_string(peer) + " tag " + std::to_string(tag),
                  nodes);
  }
}

void Executor::Impl::execute_profiled(std::uint32_t i, const std::function<void()>& body) {
  detail::NodeRecord& record = profile.records[i];
  record.lane = tbb::this_task_arena::current_thread_index();
  record.start_ns = profile.now_ns();
  bool ok = false;
  try {
    body();
    ok = true;
  } catch (...) {
    fail(i, std::current_exception());
  }
  record.end_ns = profile.now_ns();
  if (ok) finished(i);
}

void Executor::Impl::arrive(std::uint32_t i, AsyncNode::gateway_type& gateway) {
  if (failure.failed.load(std::memory_order_acquire)) return;
  if (profile.enabled) profile.records[i].ready_ns = profile.now_ns();
  gateway.reserve_wait();
  if (!plan.sequencers[plan.sequencer_of[i]]->ready(plan.slot_of[i])) gateway.release_wait();
}

// Every communication node goes into the backend's flight recorder under its name (the backend
// records every asynchronous operation: scheduled, started, then completed or failed as its Work
// ends) and, for a collective, onto the rank board: its collective_seq_id counts this backend's
// collectives, the same on every rank.
std::unique_ptr<Work> Executor::Impl::start_operation(std::uint32_t i) {
  const NodeData& node = graph.nodes[i];
  const CollectiveArgs& c = node.collective;
  Backend::OperationRecord& operation = flight.operation_of[i];
  if (node.kind == NodeKind::send)
    return backend.send_async(c.send, node.peer, node.tag, node.name, &operation);
  if (node.kind == NodeKind::recv)
    return backend.recv_async(c.send, node.peer, node.tag, node.name, &operation);
  if (node.kind != NodeKind::collective)
    throw Error(ErrorCode::internal, "start_operation on a compute node");
  // The selector decides now, at execution: every rank decides alike (same sizes, world,
  // tuning file and overrides; compile checked that they agree), so every rank runs the same
  // algorithm. What it chose is kept whether or not the start succeeds.
  AlgorithmChoice choice;
  auto keep_choice = [&] {
    algorithms.algorithm_of[i] = choice.algorithm;
    algorithms.reason_of_collective[static_cast<std::size_t>(plan.issue_index[i])] =
        std::move(choice.reason);
  };
  std::unique_ptr<Work> work;
  try {
    work = algorithms.selector.start(backend, c, choice, node.name, &operation);
  } catch (...) {
    keep_choice();
    throw;
  }
  keep_choice();
  return work;
}

// Runs under the node's sequencer lock, on the thread that made the node's turn come.
void Executor::Impl::issue(std::uint32_t i) {
  if (profile.enabled) profile.records[i].start_ns = profile.now_ns();
  std::unique_ptr<Work> work;
  try {
    work = start_operation(i);
  } catch (...) {
    fail(i, std::current_exception());
    wiring.async_of[i]->gateway().release_wait();
    return;
  }
  engine->watch(
      std::move(work), [this, i](std::exception_ptr error) { complete(i, std::move(error)); },
      timeout);
  // Sequentially consistent, as finished(): a waiter counts itself, then reads the node's run.
  progress.issued_in[i].store(progress.run.load(std::memory_order_relaxed));
  if (progress.waiters.load() > 0) notify_waiters();
}

// Runs on the progress engine's thread.
void Executor::Impl::complete(std::uint32_t i, std::exception_ptr error) {
  const NodeData& node = graph.nodes[i];
  if (profile.enabled) {
    detail::NodeRecord& record = profile.records[i];
    record.end_ns = profile.now_ns();
    if (!error) {
      const auto start =
          std::chrono::duration_cast<std::chrono::nanoseconds>(profile.run_start.time_since_epoch())
              .count();
      profile.profiler.record(
          {node.name,
           node.kind == NodeKind::collective ? std::string(to_string(node.collective.op))
                                             : std::string(to_string(node.kind)),
           detail::bytes_of(node), backend.world_size(), algorithms.algorithm(plan, i),
           start + record.start_ns, start + record.end_ns});
    }
  }
  auto& gateway = wiring.async_of[i]->gateway();
  // A window on the collectives: the next one may go as soon as this one is done.
  if (!error && node.kind == NodeKind::collective)
    plan.sequencers[plan.sequencer_of[i]]->finished();
  if (error) {
    fail(i, std::move(error));
  } else {
    finished(i);
    gateway.try_put(flow::continue_msg());
  }
  gateway.release_wait();
}

void Executor::Impl::run() {
  std::lock_guard serial(run_serial);  // concurrent run()s take turns, as they always did
  start();
  wait();
}

void Executor::Impl::start() {
  std::lock_guard lock(run_mutex);
  if (progress.running.load())
    throw Error(ErrorCode::invalid_argument,
                "Executor::start: the run started before has not been waited for "
                "(Executor::wait)");
  if (!failure.poisoned.empty())
    throw Error(ErrorCode::cancelled, "Executor::run refused: " + failure.poisoned);
  failure.failed.store(false);
  failure.error = nullptr;
  failure.timed_out = false;
  failure.message.clear();
  failure.peer_only = false;
  failure.dumped = false;
  for (auto& sequencer : plan.sequencers) sequencer->reset();
  if (profile.enabled)
    std::fill(profile.records.begin(), profile.records.end(), detail::NodeRecord{});
  profile.run_start = std::chrono::steady_clock::now();
  flight.first_seq = backend.flight_recorder().next_collective_seq();
  {
    std::lock_guard progress_lock(progress.mutex);
    for (std::uint32_t i : progress.external_nodes)
      progress.signal_of[i] = detail::RunProgress::Signal::waiting;
    progress.run.fetch_add(1);
    progress.finished_count.store(0);
    progress.running.store(true);
  }
  wiring.start.try_put(flow::continue_msg());
}

void Executor::Impl::wait() {
  std::lock_guard lock(run_mutex);
  if (!progress.running.load())
    throw Error(ErrorCode::invalid_argument,
                "Executor::wait: no run in progress (Executor::start begins one)");
  if (!progress.external_nodes.empty()) wait_for_everything();
  in_arena([this] { wiring.flow_graph.wait_for_all(); });
  {
    std::lock_guard progress_lock(progress.mutex);
    progress.running.store(false);
  }
  profile.has_run = profile.enabled;
  check_peers_after_run();
  const bool failed = failure.failed.load();
  if (failed) end_failed_run();
  if (options.trace_path) write_trace_file();
  if (failed) std::rethrow_exception(failure.error);
}

Executor::Executor(const Graph& graph, Backend& backend, ExecutorOptions options) {
  try {
    // External nodes are completed by threads outside TBB, which never wait in the flow graph
    // while the run goes on: the graph's arena must have a worker of its own even where this
    // process may use one CPU (a rank bound to a core).
    Impl::OwnArena arena;
    for (const NodeData& node : graph._state->nodes)
      if (node.kind == NodeKind::external) {
        // A process bound to one CPU gets no TBB worker unless the limit allows one.
        // Each such executor holds its own control (they end in any order).
        const int concurrency = std::max(2, tbb::info::default_concurrency());
        if (tbb::info::default_concurrency() < concurrency)
          arena.parallelism = std::make_unique<tbb::global_control>(
              tbb::global_control::max_allowed_parallelism, concurrency);
        arena.arena = std::make_unique<tbb::task_arena>(concurrency, 1);
        break;
      }
    tbb::task_arena* where = arena.arena.get();
    auto make = [&] {
      _impl = std::make_unique<Impl>(graph, backend, std::move(options), std::move(arena));
      _impl->compile();
    };
    if (where)  // the flow graph attaches to the arena it is made in
      where->execute(make);
    else
      make();
  } catch (const Error& e) {
    // The other ranks may be waiting for this one in compile's cross-rank check: tell them
    // why it will not come (a graph that fails validation here only, say).
    if (e.code() != ErrorCode::mismatch && e.code() != ErrorCode::timeout &&
        e.code() != ErrorCode::peer_failed)
      backend.publish_failure(e.what(), false);
    throw;
  }
}

Executor::~Executor() {
  // A run started and never waited for: end it (external nodes still waiting for their signal
  // would otherwise keep the flow graph's destructor waiting for ever).
  if (_impl && _impl->progress.running.load()) {
    try {
      const std::uint32_t node =
          _impl->progress.external_nodes.empty() ? 0 : _impl->progress.external_nodes.front();
      _impl->fail(node, std::make_exception_ptr(Error(
                            ErrorCode::cancelled, "the executor was destroyed during the run")));
      _impl->wait();
    } catch (const std::exception&) {
    }
  }
}

std::unique_ptr<Executor> Executor::compile(const Graph& graph, Backend& backend,
                                            ExecutorOptions options) {
  return std::make_unique<Executor>(graph, backend, std::move(options));
}

void Executor::run() {
  _impl->run();
}

void Executor::run(std::size_t times) {
  for (std::size_t k = 0; k < times; ++k) _impl->run();
}

void Executor::start() {
  _impl->start();
}

void Executor::wait() {
  _impl->wait();
}

void Executor::signal(Task task) {
  _impl->signal(_impl->node_of(task, "signal"));
}

void Executor::wait(Task task) {
  _impl->wait_for(_impl->node_of(task, "wait"));
}

bool Executor::done(Task task) const {
  return _impl->progress.done(_impl->node_of(task, "done"));
}

void Executor::wait_issued(Task task) {
  _impl->wait_for(_impl->node_of(task, "wait_issued"), /*issue_only=*/true);
}

bool Executor::issued(Task task) const {
  return _impl->progress.issued(_impl->node_of(task, "issued"));
}

bool Executor::running() const noexcept {
  return _impl->progress.running.load();
}

std::vector<std::string> Executor::issue_order() const {
  std::vector<std::string> names;
  for (std::uint32_t i : _impl->plan.collective_order) names.push_back(_impl->graph.nodes[i].name);
  return names;
}

std::size_t Executor::size() const noexcept {
  return _impl->graph.nodes.size();
}

int Executor::workers() const {
  if (_impl->arena) return _impl->arena->max_concurrency();
  return static_cast<int>(std::min<std::size_t>(
      tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism),
      static_cast<std::size_t>(tbb::this_task_arena::max_concurrency())));
}

std::string Executor::progress_priority() const {
  return _impl->engine ? _impl->engine->priority_note() : "none";
}

const CommunicationProfiler& Executor::profiler() const noexcept {
  return _impl->profile.profiler;
}

}  // namespace loom
