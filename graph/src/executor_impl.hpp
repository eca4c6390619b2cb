// Executor::Impl: the state of a compiled graph, grouped by the concern that owns it. The
// concerns live in their own files: executor.cpp (compile, run, the public calls),
// executor_options.cpp, agreement.cpp (the cross-rank check), clock_sync.cpp (trace clocks),
// wiring.cpp (the TBB flow graph and GPU nodes), failure.cpp (failure and drain), annotation.cpp
// (trace, DOT, timings), external.cpp (asynchronous runs and external nodes).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include "gpu_nodes.hpp"
#include "graph_state.hpp"
#include "loom/algorithm_selector.hpp"
#include "loom/executor.hpp"
#include "loom/progress_engine.hpp"
#include "sequencer.hpp"
#include "trace_writer.hpp"

namespace loom {

namespace detail {

/// @brief The order fixed at compile time, identical on every rank.
struct IssuePlan {
  std::vector<std::uint32_t> order;                    ///< a topological order of every node
  std::vector<std::uint32_t> collective_order;         ///< the collectives, in issue order
  std::vector<std::int64_t> issue_index;               ///< per node: collectives only, else -1
  std::vector<int> sequencer_of;                       ///< per node: -1 for compute and copy
  std::vector<std::uint32_t> slot_of;                  ///< per node: slot in its sequencer
  std::vector<std::unique_ptr<Sequencer>> sequencers;  ///< [0]: the collectives

  bool communicates(std::uint32_t i) const { return sequencer_of[i] >= 0; }
};

/// @brief What the AlgorithmSelector chose for each collective (asked at each issue).
struct AlgorithmPlan {
  AlgorithmSelector selector;  ///< LOOM_TUNING_FILE and LOOM_<COLL>, read at compile time
  /// @brief Per node: the algorithm of its last issue (before any run: planned at compile;
  /// native for point-to-point; meaningless for compute nodes). One byte a node: a graph of
  /// 100,000 nodes keeps its per-node memory under 1 KiB.
  std::vector<Algorithm> algorithm_of;
  /// @brief Per collective, by issue index: the selector's reason for its algorithm.
  std::vector<std::string> reason_of_collective;

  /// @brief The algorithm of communication node `i` ("" for a compute node).
  std::string algorithm(const IssuePlan& plan, std::uint32_t i) const {
    return plan.communicates(i) ? std::string(to_string(algorithm_of[i])) : std::string();
  }
  /// @brief The selector's reason for collective `i`'s algorithm ("" for other nodes).
  const std::string& reason(const IssuePlan& plan, std::uint32_t i) const {
    static const std::string none;
    const std::int64_t k = plan.issue_index[i];
    return k >= 0 ? reason_of_collective[static_cast<std::size_t>(k)] : none;
  }
};

/// @brief The tbb::flow::graph the nodes run on.
struct Wiring {
  using AsyncNode = tbb::flow::async_node<tbb::flow::continue_msg, tbb::flow::continue_msg>;
  using ComputeNode = tbb::flow::continue_node<tbb::flow::continue_msg>;

  // Declared before the nodes: TBB nodes must be destroyed before their graph.
  tbb::flow::graph flow_graph;
  tbb::flow::broadcast_node<tbb::flow::continue_msg> start{flow_graph};
  std::vector<std::unique_ptr<ComputeNode>> compute_nodes;
  std::vector<std::unique_ptr<AsyncNode>> async_nodes;
  std::vector<tbb::flow::receiver<tbb::flow::continue_msg>*> inputs;  ///< per node
  std::vector<tbb::flow::sender<tbb::flow::continue_msg>*> outputs;   ///< per node
  std::vector<AsyncNode*> async_of;                                   ///< per node
  // GPU compute nodes: launched by a continue_node that GPU successors follow at once (they
  // wait on the device), completed by an async_node that everything else follows.
  std::unique_ptr<GpuNodes> gpu;
  /// per node where the graph has GPU nodes (empty otherwise): their launch node, else null
  std::vector<tbb::flow::sender<tbb::flow::continue_msg>*> launched;
};

/// @brief How the current run failed, and whether later runs are refused.
struct FailureState {
  std::atomic<bool> failed{false};
  std::mutex mutex;  ///< guards error and timed_out
  std::exception_ptr error;
  bool timed_out = false;
  std::string message;     ///< the first failure's message (published, dumped)
  bool peer_only = false;  ///< the run completed; a peer's failure made its data stale
  bool dumped = false;     ///< the flight record of this run was written
  std::string poisoned;    ///< why later runs are refused (after a watchdog timeout)
};

/// @brief What the flight recorder and the rank board know of this run's communication.
struct RunRecord {
  /// per node: its flight record and collective_seq_id (-1: not a collective) in this run
  std::vector<Backend::OperationRecord> operation_of;
  std::int64_t first_seq = 0;  ///< the backend's next collective at run start
};

/// @brief One node's times in the last profiled run (ns since the run started).
struct NodeRecord {
  std::int64_t ready_ns = -1;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  int lane = -1;
};

/// @brief What profiling keeps: the last run's node records and the profiler's statistics.
struct RunProfile {
  bool enabled = false;
  std::chrono::steady_clock::time_point run_start;
  std::vector<NodeRecord> records;
  bool has_run = false;  ///< records hold a finished run
  CommunicationProfiler profiler;
  std::int64_t clock_offset_ns = 0;  ///< this rank's steady clock minus rank 0's

  /// @brief Where the last run sits in time, for the trace.
  TraceClock clock(int rank, int world) const {
    const std::int64_t start =
        std::chrono::duration_cast<std::chrono::nanoseconds>(run_start.time_since_epoch()).count();
    return {rank, world, start - clock_offset_ns, clock_offset_ns};
  }

  std::int64_t now_ns() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                                run_start)
        .count();
  }
};

/// @brief Where the current run stands: which nodes completed (Executor::wait(Task), done) and
/// how far each external node got (Executor::signal).
struct RunProgress {
  enum class Signal : std::uint8_t {
    waiting,    ///< its predecessors are not done and no signal came
    early,      ///< signalled before its predecessors were done
    arrived,    ///< its predecessors are done: its gateway is held until the signal
    done,       ///< signalled and passed on
    cancelled,  ///< the run failed first
  };
  std::mutex mutex;  ///< guards signal_of and running; with `changed`, wakes the waiters
  std::condition_variable changed;
  std::vector<Signal> signal_of;                ///< per node (meaningful for external nodes)
  std::vector<std::uint32_t> external_nodes;    ///< in node order
  std::vector<std::uint32_t> external_sources;  ///< those without predecessors
  /// Per node: the run it last completed in. A run's start moves `run` on instead of clearing
  /// every node (on a 10,000-node chain that clearing was a tenth of the run).
  std::unique_ptr<std::atomic<std::uint64_t>[]> finished_in;
  std::atomic<std::uint64_t> run{1};           ///< the current (or last) run; 1 before the first
  std::atomic<std::size_t> finished_count{0};  ///< how many have
  bool done(std::uint32_t i) const noexcept {
    return finished_in[i].load() == run.load(std::memory_order_relaxed);
  }
  /// Per node: the run it was last issued in (communication nodes: started on the backend).
  std::unique_ptr<std::atomic<std::uint64_t>[]> issued_in;
  bool issued(std::uint32_t i) const noexcept {
    return issued_in[i].load() == run.load(std::memory_order_relaxed) || done(i);
  }
  std::atomic<int> waiters{0};
  std::atomic<bool> running{false};  ///< started and not yet waited for
};

}  // namespace detail

struct Executor::Impl {
  using AsyncNode = detail::Wiring::AsyncNode;

  /// @brief The arena a graph with external nodes runs in, and what lets it have a worker.
  struct OwnArena {
    std::unique_ptr<tbb::global_control> parallelism;  ///< set where TBB would allow no worker
    std::unique_ptr<tbb::task_arena> arena;
  };

  Impl(const Graph& g, Backend& b, ExecutorOptions o, OwnArena a);

  Backend& backend;
  ExecutorOptions options;  ///< resolved: every field set
  std::chrono::nanoseconds timeout{0};
  detail::GraphState graph;

  detail::IssuePlan plan;
  detail::AlgorithmPlan algorithms;
  detail::RunProfile profile;
  detail::FailureState failure;
  detail::RunRecord flight;
  detail::RunProgress progress;
  std::mutex run_mutex;
  std::mutex run_serial;  ///< held by run() from start to end
  // A graph with external nodes runs in an arena of its own with at least one worker: its
  // compute is started by signals from threads outside TBB that never wait in the flow graph.
  // Declared before the wiring, whose flow graph is attached to it.
  std::unique_ptr<tbb::global_control> parallelism;
  std::unique_ptr<tbb::task_arena> arena;
  detail::Wiring wiring;
  // Last: destroyed first, so no completion callback runs into a half-destroyed executor.
  std::unique_ptr<ProgressEngine> engine;

  // executor.cpp: compile and run.
  void compile();
  void plan_issue_order();
  void run();
  void start();
  void wait();
  void arrive(std::uint32_t i, AsyncNode::gateway_type& gateway);
  void issue(std::uint32_t i);
  std::unique_ptr<Work> start_operation(std::uint32_t i);
  void complete(std::uint32_t i, std::exception_ptr error);
  // A compute node's body, inline in its TBB node: on a chain of empty nodes every call and
  // store here is measured against a raw continue_node.
  void execute(std::uint32_t i, const std::function<void()>& body) {
    if (failure.failed.load(std::memory_order_relaxed)) return;
    if (profile.enabled) return execute_profiled(i, body);
    try {
      body();
    } catch (...) {
      fail(i, std::current_exception());
      return;
    }
    finished(i);
  }
  void execute_profiled(std::uint32_t i, const std::function<void()>& body);

  // agreement.cpp
  void check_ranks_agree();
  // clock_sync.cpp
  void measure_clock_offset();
  // wiring.cpp
  bool runs_in_continue_node(std::uint32_t i) const;
  std::vector<std::vector<std::uint32_t>> chains_of_compute() const;
  void build_flow_graph();
  void build_gpu_node(std::uint32_t i, tbb::flow::node_priority_t priority);
  // failure.cpp
  void fail(std::uint32_t i, std::exception_ptr error);
  void drain();
  void end_failed_run();
  std::string where(std::uint32_t i) const;
  void check_peers_after_run();
  // external.cpp
  void arrive_external(std::uint32_t i, AsyncNode::gateway_type& gateway);
  void signal(std::uint32_t i);
  void finished(std::uint32_t i) {
    // Sequentially consistent, as the waiters' count it is read before: a waiter counts itself,
    // then reads the node's run (wait_for), so one of the two sees the other.
    progress.finished_in[i].store(progress.run.load(std::memory_order_relaxed));
    // Only wait_for_everything() reads the count, and only for a graph with external nodes:
    // every other graph's nodes skip this read-modify-write of one counter all workers share.
    if (!progress.external_nodes.empty()) progress.finished_count.fetch_add(1);
    if (progress.waiters.load() > 0) notify_waiters();
  }
  void notify_waiters();
  void wait_for(std::uint32_t i, bool issue_only = false);
  void wait_for_everything();
  bool expire(std::uint32_t waited);
  void cancel_external();
  std::uint32_t node_of(const Task& task, std::string_view call) const;
  template <class F>
  void in_arena(F&& f) {
    if (arena)
      arena->execute(std::forward<F>(f));
    else
      f();
  }
  // annotation.cpp
  std::vector<detail::TraceSpan> spans() const;
  void write_trace_file() const;
};

}  // namespace loom
