// Executor: compiles a Graph once onto a TBB flow graph for one Backend and runs it many times.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/backend.hpp"
#include "loom/communication_profiler.hpp"
#include "loom/graph.hpp"
#include "loom/progress_priority.hpp"

namespace loom {

/// @brief How an Executor runs. Unset fields come from the environment.
struct ExecutorOptions {
  /// @brief Watchdog: a communication node that has not completed this long after it was
  /// issued fails the run with ErrorCode::timeout. Unset: LOOM_TIMEOUT_S (seconds, decimal;
  /// 0 disables), else 300 s.
  std::optional<std::chrono::duration<double>> timeout;
  /// @brief Record per-node start/end times, worker lane, bytes (for write_trace and the
  /// durations in dump_dot). Unset: on when LOOM_TRACE is set or trace_path is given.
  std::optional<bool> profile;
  /// @brief Chrome trace written after every run(). Unset: LOOM_TRACE. With more than one
  /// rank, ".rank<r>" is inserted before the extension ("trace.json" -> "trace.rank1.json").
  std::optional<std::string> trace_path;
  /// @brief At most this many collectives issued and not yet complete at a time (0: no
  /// limit). With 1 the transport carries one collective at a time in the issue order, so the
  /// order decides which completes first (a planned order hands the wire to what is needed
  /// first) instead of every issued collective sharing it.
  std::size_t collectives_in_flight = 0;
  /// @brief How the progress thread that completes communication is scheduled against the
  /// compute workers (ProgressPriority). Unset: LOOM_PROGRESS_PRIORITY, else automatic
  /// (realtime where permitted, else a short slice, else normal; normal on a host with more
  /// ranks than CPUs).
  std::optional<ProgressPriority> progress_priority;

  /// @brief The options with every unset field filled from the environment; throws
  /// ErrorCode::invalid_argument naming a malformed variable.
  ExecutorOptions resolved() const;
};

/// @brief Timing of one node in the last run (nanoseconds since that run started).
struct NodeTiming {
  std::string name;
  NodeKind kind = NodeKind::compute;
  std::int64_t start_ns = 0;  ///< compute: body start; communication: issue
  std::int64_t end_ns = 0;    ///< compute: body end; communication: completion
  int lane = -1;              ///< TBB worker index (compute) or -1
  std::size_t bytes = 0;
  std::int64_t issue_index = -1;  ///< collectives: position in the fixed issue order
  std::string algorithm;  ///< communication: what the AlgorithmSelector chose ("ring", "native")
  /// @brief communication: why ("override", "measured", "model", or "fallback: ... cannot
  /// run (...)" when the preferred candidate could not run this case)
  std::string algorithm_reason;
  /// @brief communication: when its predecessors were done (it may then wait for its turn in
  /// the issue order until start_ns); -1 for compute
  std::int64_t ready_ns = -1;
  /// @brief The node's Task::id() in the graph the executor was compiled from (last_run()[i]
  /// is task i): planners find the nodes they built by id, not by parsing names.
  std::size_t task = 0;
};

/// @brief Runs a compiled Graph on TBB workers, communication through a Backend.
///
/// compile() validates the graph, fixes the collective issue order (a topological order, ties
/// broken by priority then insertion order: the same on every rank), checks with the other
/// ranks that they compiled the same collective sequence (node names, ops, dtypes, counts,
/// reduce ops, roots, planned algorithms), configured the algorithm selector alike and posted
/// matching point-to-point nodes (ErrorCode::mismatch on every rank, naming the first
/// difference, otherwise) and builds the tbb::flow::graph once.
///
/// run() never lets a TBB worker wait on communication: collective and point-to-point nodes
/// are started through the backend's asynchronous calls, in the fixed order, and completed by
/// a progress thread. Each collective runs the algorithm an AlgorithmSelector (configured by
/// LOOM_TUNING_FILE and LOOM_<COLL>, read at compile time) chooses when the node is issued;
/// last_run(), the trace and dump_dot() name it. An exception in any node cancels the run; the
/// communication of that run is then drained (the collectives not yet issued are issued, so that
/// every rank stays at the same point of the sequence) and run() throws loom::Error naming the
/// node. The executor can run again afterwards. The failing rank publishes its failure on the
/// backend's RankBoard before it drains, so a peer whose run completed with those drained
/// collectives (this rank's stale data) fails its run with ErrorCode::peer_failed naming the
/// rank and node, never success.
///
/// Watchdog: a communication node that does not complete within the timeout fails run() with
/// ErrorCode::timeout naming the node, its issue index, its collective sequence number and the
/// ranks that did not arrive (from the RankBoard). The communicator is then in an unknown state
/// (a started MPI or NCCL operation cannot be revoked), so later runs throw
/// ErrorCode::cancelled. Print the error and exit non-zero: destroying the executor abandons
/// what is in flight without waiting, and at exit loom skips MPI_Finalize over abandoned
/// operations and ends the process with status 124. Every communication node is written to the
/// backend's FlightRecorder, dumped (LOOM_FLIGHT_RECORDER_DIR) when a run fails.
class Executor {
 public:
  /// @brief Compiles `graph` for `backend`. The graph is copied (it may change or go away
  /// afterwards); the backend is referenced and must outlive the executor. Every rank must
  /// compile at the same point of its collective sequence (compiling communicates).
  Executor(const Graph& graph, Backend& backend, ExecutorOptions options = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  /// @brief Same as the constructor, Taskflow-style: auto ex = Executor::compile(g, backend).
  static std::unique_ptr<Executor> compile(const Graph& graph, Backend& backend,
                                           ExecutorOptions options = {});

  /// @brief Runs the graph once and waits for it; throws loom::Error naming the failed node.
  void run();
  /// @brief Runs the graph `times` times in a row.
  void run(std::size_t times);

  /// @brief Starts a run and returns at once; its nodes run as their predecessors complete,
  /// external nodes once signal() names them. Finish it with wait() (run() is start() then
  /// wait()). Throws ErrorCode::invalid_argument while a started run was not waited for, and
  /// ErrorCode::cancelled as run() does after a watchdog timeout.
  void start();
  /// @brief Completes external node `task` (of the graph this executor was compiled from) in
  /// the current run; any thread may call it, and it never waits for the graph. A signal that
  /// comes before the node's predecessors are done is kept until they are. Throws
  /// ErrorCode::invalid_argument for a node that is not external, one already signalled in
  /// this run, or when no run is in progress; after the run failed, signals are ignored.
  void signal(Task task);
  /// @brief Waits until `task` has completed in the current run, at most the timeout
  /// (ExecutorOptions::timeout). Throws the run's failure if it failed first; when the time
  /// is up with external nodes still unsignalled, fails the run with ErrorCode::timeout
  /// naming them, else throws ErrorCode::timeout naming `task`.
  void wait(Task task);
  /// @brief Whether `task` has completed in the current run (or, after wait(), the last one).
  bool done(Task task) const;
  /// @brief Waits until `task` was issued in the current run: a communication node started
  /// on the backend (its device work, on a device backend, then enqueued on its stream); any
  /// other node completed. Timeout and failure as wait(task).
  void wait_issued(Task task);
  /// @brief Whether `task` was issued in the current run (see wait_issued); never waits.
  bool issued(Task task) const;
  /// @brief Waits for the run start() began and ends it like run(): throws loom::Error naming
  /// the failed node. With external nodes, when the timeout passes without every node done,
  /// the run fails with ErrorCode::timeout naming the external nodes not signalled (the
  /// communicator stays usable: what the run had not issued is drained as after any failure).
  /// ErrorCode::invalid_argument when no run is in progress.
  void wait();
  /// @brief Whether a run was started and not yet waited for.
  bool running() const noexcept;

  /// @brief Names of the collectives in their issue order.
  std::vector<std::string> issue_order() const;
  /// @brief Node count of the compiled graph.
  std::size_t size() const noexcept;
  /// @brief How many TBB workers run this executor's compute nodes (its own arena's, for a
  /// graph with external nodes; else what the calling thread's arena and
  /// tbb::global_control allow): what a step simulation of it should assume.
  int workers() const;
  /// @brief How the progress thread is scheduled, as ProgressEngine::priority_note() says it
  /// ("realtime (SCHED_FIFO 1)"); "none" when the graph needs no progress thread.
  std::string progress_priority() const;
  /// @brief Timings of the last run (empty unless profiling is on).
  std::vector<NodeTiming> last_run() const;

  /// @brief Every communication node of the profiled runs so far (on when profiling is):
  /// bytes, duration, bandwidth, algorithm; stats() gives count, bandwidth and percentiles.
  const CommunicationProfiler& profiler() const noexcept;

  /// @brief DOT with issue indices, bytes and algorithms; after a profiled run also measured
  /// durations, the communication time no compute hid ("exposed") and the critical path (red).
  /// Above DotOptions::summary_above nodes (or with DotDetail::summary) a summary: one cluster
  /// per group, compute runs collapsed, edges bundled, communication kept.
  void dump_dot(std::ostream& out, DotOptions options = {}) const;
  /// @brief Chrome trace-event JSON of the last profiled run: one lane per TBB worker, one per
  /// communicator; opens in Perfetto (ui.perfetto.dev) or chrome://tracing.
  void write_trace(std::ostream& out) const;
  /// @brief write_trace into a file; throws ErrorCode::invalid_argument if it cannot be written.
  void write_trace(const std::string& path) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> _impl;
};

}  // namespace loom
