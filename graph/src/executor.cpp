// Executor: the graph compiled onto a tbb::flow::graph; compute on TBB workers, communication
// issued through per-stream sequencers and completed by the progress engine.
#include "loom/executor.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <ostream>
#include <sstream>
#include <tuple>

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/task_arena.h>

#include "analysis.hpp"
#include "dot_writer.hpp"
#include "gpu_nodes.hpp"
#include "graph_state.hpp"
#include "loom/algorithm.hpp"
#include "loom/algorithm_selector.hpp"
#include "loom/error.hpp"
#include "loom/progress_engine.hpp"
#include "sequencer.hpp"
#include "trace_writer.hpp"

namespace loom {

namespace flow = tbb::flow;
using detail::NodeData;
using Clock = std::chrono::steady_clock;

namespace {

constexpr double default_timeout_s = 300;
constexpr const char* algorithm_native = "native";

CollectiveArgs args_of(const CollectiveSpec& c) {
  return {c.op, c.send, c.recv, c.reduce_op, c.root};
}

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

double parse_seconds(const std::string& text, const char* variable) {
  double value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || !std::isfinite(value) || value < 0)
    throw Error(ErrorCode::invalid_argument,
                std::string(variable) + "='" + text +
                    "' is not a number of seconds (expected e.g. 30 or 0.5; 0 disables the "
                    "watchdog)");
  return value;
}

std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g s", s);
  return text;
}

// Every rank must agree on these fields of each collective, in issue order.
struct CollectiveRecord {
  std::int64_t signature;  // op | dtype | reduce op | root
  std::int64_t count;

  bool operator==(const CollectiveRecord&) const = default;

  static CollectiveRecord of(const NodeData& node) {
    const CollectiveSpec& c = node.collective;
    if (c.op == Collective::barrier) return {static_cast<std::int64_t>(c.op), 0};
    const bool reduces = c.op == Collective::reduce || c.op == Collective::allreduce ||
                         c.op == Collective::reduce_scatter;
    const bool rooted = c.op == Collective::reduce || c.op == Collective::broadcast;
    const std::int64_t signature = static_cast<std::int64_t>(c.op) |
                                   (static_cast<std::int64_t>(c.send.dtype()) << 8) |
                                   (reduces ? static_cast<std::int64_t>(c.reduce_op) << 16 : 0) |
                                   (rooted ? static_cast<std::int64_t>(c.root) << 24 : 0);
    return {signature, static_cast<std::int64_t>(c.send.count())};
  }

  std::string describe() const {
    if (signature < 0) return "no collective";
    const auto op = static_cast<Collective>(signature & 0xff);
    std::string s(to_string(op));
    if (op == Collective::barrier) return s;
    s += " " + std::string(to_string(static_cast<DType>((signature >> 8) & 0xff))) + "[" +
         std::to_string(count) + "]";
    if (op == Collective::reduce || op == Collective::allreduce || op == Collective::reduce_scatter)
      s += " " + std::string(to_string(static_cast<ReduceOp>((signature >> 16) & 0xff)));
    if (op == Collective::reduce || op == Collective::broadcast)
      s += " root " + std::to_string(signature >> 24);
    return s;
  }
};

std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  // splitmix64 finaliser over the running hash: order-sensitive, well spread.
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

struct Record {
  std::int64_t ready_ns = -1;
  std::int64_t start_ns = 0;
  std::int64_t end_ns = 0;
  int lane = -1;
};

}  // namespace

ExecutorOptions ExecutorOptions::resolved() const {
  ExecutorOptions out = *this;
  if (!out.timeout) {
    const auto text = env("LOOM_TIMEOUT_S");
    out.timeout = std::chrono::duration<double>(text ? parse_seconds(*text, "LOOM_TIMEOUT_S")
                                                     : default_timeout_s);
  } else if (!std::isfinite(out.timeout->count()) || out.timeout->count() < 0) {
    throw Error(ErrorCode::invalid_argument,
                "ExecutorOptions::timeout must be >= 0 seconds (0 disables the watchdog)");
  }
  if (!out.trace_path) {
    if (auto path = env("LOOM_TRACE")) out.trace_path = *path;
  }
  if (!out.profile) out.profile = out.trace_path.has_value();
  return out;
}

struct Executor::Impl {
  using AsyncNode = flow::async_node<flow::continue_msg, flow::continue_msg>;
  using ComputeNode = flow::continue_node<flow::continue_msg>;

  Impl(const Graph& g, Backend& b, ExecutorOptions o)
      : backend(b), options(o.resolved()), graph(*g._state) {}

  Backend& backend;
  ExecutorOptions options;
  detail::GraphState graph;
  bool profile = false;
  std::chrono::nanoseconds timeout{0};

  std::vector<std::uint32_t> order;
  std::vector<std::int64_t> issue_index;                       // per node: collectives only
  std::vector<int> sequencer_of;                               // per node: -1 for compute and copy
  std::vector<std::uint32_t> slot_of;                          // per node: slot in its sequencer
  std::vector<std::unique_ptr<detail::Sequencer>> sequencers;  // [0]: collectives
  std::vector<std::uint32_t> collective_order;
  // Asked at each node's issue: LOOM_TUNING_FILE and LOOM_<COLL>, read at compile time.
  AlgorithmSelector selector;
  // Per node: the algorithm of its last issue (before any run: the one planned at compile).
  std::vector<std::string> algorithm_of;
  std::vector<std::string> reason_of;  // per node: the selector's reason for algorithm_of
  CommunicationProfiler profiler;

  // Declared before the nodes: TBB nodes must be destroyed before their graph.
  flow::graph flow_graph;
  flow::broadcast_node<flow::continue_msg> start{flow_graph};
  std::vector<std::unique_ptr<ComputeNode>> compute_nodes;
  std::vector<std::unique_ptr<AsyncNode>> async_nodes;
  std::vector<flow::receiver<flow::continue_msg>*> inputs;  // per node
  std::vector<flow::sender<flow::continue_msg>*> outputs;   // per node
  std::vector<AsyncNode*> async_of;                         // per node
  // GPU compute nodes: launched by a continue_node that GPU successors follow at once (they
  // wait on the device), completed by an async_node that everything else follows.
  std::unique_ptr<detail::GpuNodes> gpu;
  std::vector<flow::sender<flow::continue_msg>*> launched;  // per node: GPU nodes only

  // State of the current run.
  std::mutex run_mutex;
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr error;
  bool timed_out = false;
  std::string poisoned;  // why later runs are refused (after a watchdog timeout)
  Clock::time_point run_start;
  std::vector<Record> records;
  bool has_profile = false;

  // Last: destroyed first, so no completion callback runs into a half-destroyed executor.
  std::unique_ptr<ProgressEngine> engine;

  void compile();
  void check_ranks_agree();
  void build_flow_graph();
  void build_gpu_node(std::uint32_t i, flow::node_priority_t priority);

  std::int64_t now_ns() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - run_start).count();
  }

  void execute(std::uint32_t i, const std::function<void()>& body);
  void arrive(std::uint32_t i, AsyncNode::gateway_type& gateway);
  void issue(std::uint32_t i);
  void complete(std::uint32_t i, std::exception_ptr failure);
  std::unique_ptr<Work> start_operation(std::uint32_t i);
  void fail(std::uint32_t i, std::exception_ptr failure);
  std::string where(std::uint32_t i) const;
  void drain();
  void run();
  void write_trace_file() const;
  std::vector<detail::TraceSpan> spans() const;
};

std::string Executor::Impl::where(std::uint32_t i) const {
  const NodeData& node = graph.nodes[i];
  std::string s = std::string(to_string(node.kind)) + " node '" + node.name + "'";
  if (node.kind == NodeKind::collective)
    s += " (" + detail::describe(node) + ", issue #" + std::to_string(issue_index[i]) + ")";
  else if (node.kind == NodeKind::send || node.kind == NodeKind::recv)
    s += " (" + detail::describe(node) + ")";
  return s + " on rank " + std::to_string(backend.rank()) + " of " +
         std::to_string(backend.world_size()) + " (" + std::string(backend.name()) + ")";
}

void Executor::Impl::compile() {
  // Capped at ~31 years, which never fires in practice: beyond ~292 years the nanosecond count
  // would overflow (found by fuzzing LOOM_TIMEOUT_S), and the engine adds it to now().
  constexpr double longest_timeout_s = 1e9;
  const double seconds = std::min(options.timeout->count(), longest_timeout_s);
  timeout = std::chrono::nanoseconds(static_cast<std::int64_t>(seconds * 1e9));
  profile = *options.profile;
  profiler.set_enabled(profile);
  selector = AlgorithmSelector::from_environment();

  detail::check_structure(graph);
  detail::check_acyclic(graph);
  detail::check_communication(graph, backend.world_size());
  order = detail::schedule_order(graph);
  detail::check_races(graph, order);
  gpu = detail::GpuNodes::create(graph, order);

  // Streams of communication: the communicator's collectives, and one per (direction, peer,
  // tag) for point-to-point, whose matching order is then the same on every run.
  const std::size_t n = graph.nodes.size();
  issue_index.assign(n, -1);
  algorithm_of.assign(n, "");
  reason_of.assign(n, "");
  sequencer_of.assign(n, -1);
  slot_of.assign(n, 0);
  std::map<std::tuple<int, int, int>, std::vector<std::uint32_t>> channels;
  for (std::uint32_t i : order) {
    const NodeData& node = graph.nodes[i];
    if (node.kind == NodeKind::collective) {
      issue_index[i] = static_cast<std::int64_t>(collective_order.size());
      collective_order.push_back(i);
      const AlgorithmChoice planned = selector.choose(args_of(node.collective), backend);
      algorithm_of[i] = to_string(planned.algorithm);
      reason_of[i] = planned.reason;
    } else if (node.kind == NodeKind::send || node.kind == NodeKind::recv) {
      channels[{static_cast<int>(node.kind), node.peer, node.tag}].push_back(i);
      algorithm_of[i] = algorithm_native;
    }
  }
  auto add_sequencer = [&](std::string name, std::vector<std::uint32_t> nodes,
                           std::size_t limit = 0) {
    const int id = static_cast<int>(sequencers.size());
    for (std::uint32_t slot = 0; slot < nodes.size(); ++slot) {
      sequencer_of[nodes[slot]] = id;
      slot_of[nodes[slot]] = slot;
    }
    sequencers.push_back(std::make_unique<detail::Sequencer>(
        std::move(name), std::move(nodes), [this](std::uint32_t node) { issue(node); }, limit));
  };
  add_sequencer("world", collective_order, options.collectives_in_flight);
  for (auto& [key, nodes] : channels) {
    const auto& [kind, peer, tag] = key;
    add_sequencer(std::string(to_string(static_cast<NodeKind>(kind))) + " peer " +
                      std::to_string(peer) + " tag " + std::to_string(tag),
                  nodes);
  }

  check_ranks_agree();
  build_flow_graph();
  if (profile) records.assign(n, Record{});
  if (collective_order.size() + channels.size() > 0 || gpu)
    engine = std::make_unique<ProgressEngine>();
}

void Executor::Impl::check_ranks_agree() {
  const int world = backend.world_size();
  if (world == 1) return;
  std::vector<CollectiveRecord> mine;
  std::uint64_t hash = 0x6c6f6f6dull;  // "loom"
  for (std::uint32_t k = 0; k < collective_order.size(); ++k) {
    const auto r = CollectiveRecord::of(graph.nodes[collective_order[k]]);
    mine.push_back(r);
    hash = mix(mix(mix(hash, k), static_cast<std::uint64_t>(r.signature)),
               static_cast<std::uint64_t>(r.count));
  }
  // Fixed-size exchanges only, so ranks with different graphs still make the same calls.
  auto exchange = [&](std::vector<std::int64_t>& send, std::vector<std::int64_t>& recv) {
    auto work = backend.allgather_async(Buffer::of(std::span(send)), Buffer::of(std::span(recv)));
    if (timeout.count() > 0 ? !work->wait_for(timeout) : (work->wait(), false))
      throw Error(ErrorCode::timeout,
                  "Executor::compile on rank " + std::to_string(backend.rank()) +
                      ": the check that all ranks compiled the same collectives did not complete "
                      "within " +
                      seconds_text(options.timeout->count()) + " (did every rank compile?)");
  };
  std::vector<std::int64_t> summary{static_cast<std::int64_t>(hash),
                                    static_cast<std::int64_t>(mine.size())};
  std::vector<std::int64_t> summaries(2 * world);
  exchange(summary, summaries);
  bool same = true;
  std::int64_t longest = 0;
  for (int r = 0; r < world; ++r) {
    same = same && summaries[2 * r] == summaries[0] && summaries[2 * r + 1] == summaries[1];
    longest = std::max(longest, summaries[2 * r + 1]);
  }
  if (same) return;
  std::vector<std::int64_t> records_mine(2 * longest, -1), records_all(2 * longest * world);
  for (std::size_t k = 0; k < mine.size(); ++k) {
    records_mine[2 * k] = mine[k].signature;
    records_mine[2 * k + 1] = mine[k].count;
  }
  exchange(records_mine, records_all);
  auto record_of = [&](int rank, std::int64_t k) {
    const std::size_t at = 2 * (static_cast<std::size_t>(rank) * longest + k);
    return CollectiveRecord{records_all[at], records_all[at + 1]};
  };
  std::int64_t first = 0;
  for (; first < longest; ++first) {
    bool differ = false;
    for (int r = 1; r < world; ++r)
      differ = differ || !(record_of(r, first) == record_of(0, first));
    if (differ) break;
  }
  std::string text =
      "ranks compiled different collective sequences; the first difference is "
      "collective #" +
      std::to_string(first) + ":";
  for (int r = 0; r < world; ++r) {
    const auto rec = record_of(r, first);
    text += (r == 0 ? " rank " : ", rank ") + std::to_string(r) +
            (rec.signature < 0 ? " has no collective #" + std::to_string(first) + " (only " +
                                     std::to_string(summaries[2 * r + 1]) + ")"
                               : " issues " + rec.describe());
  }
  if (first < static_cast<std::int64_t>(collective_order.size()))
    text += "; on this rank (" + std::to_string(backend.rank()) + ") it is node '" +
            graph.nodes[collective_order[first]].name + "'";
  throw Error(ErrorCode::mismatch, text);
}

void Executor::Impl::build_flow_graph() {
  const std::size_t n = graph.nodes.size();
  inputs.assign(n, nullptr);
  outputs.assign(n, nullptr);
  async_of.assign(n, nullptr);
  std::vector<std::uint32_t> predecessors(n, 0);
  for (const auto& edge : graph.edges) ++predecessors[edge.second];
  launched.assign(n, nullptr);
  for (std::uint32_t i = 0; i < n; ++i) {
    const NodeData& node = graph.nodes[i];
    const auto priority = static_cast<flow::node_priority_t>(node.priority);
    if (gpu && gpu->on_gpu(i)) {
      build_gpu_node(i, priority);
      continue;
    }
    if (sequencer_of[i] < 0) {
      // The body moves into the TBB node, so running a node touches only that node's memory
      // (the executor's copy of the graph keeps names and buffers for DOT and errors).
      std::function<void()> body = std::move(graph.nodes[i].body);
      if (node.kind == NodeKind::copy) {
        body = [src = node.collective.send, dst = node.collective.recv] {
          if (src.bytes() != 0) std::memmove(dst.data(), src.data(), src.bytes());
        };
      }
      auto& c = compute_nodes.emplace_back(std::make_unique<ComputeNode>(
          flow_graph,
          [this, i, body = std::move(body)](const flow::continue_msg&) {
            execute(i, body);
            return flow::continue_msg();
          },
          priority));
      inputs[i] = c.get();
      outputs[i] = c.get();
      continue;
    }
    // A continue_node counts the predecessors (async_node would fire once per message), then
    // the async_node hands the operation to the sequencer and returns at once.
    auto& gate = compute_nodes.emplace_back(std::make_unique<ComputeNode>(
        flow_graph, [](const flow::continue_msg&) { return flow::continue_msg(); }, priority));
    auto& async = async_nodes.emplace_back(std::make_unique<AsyncNode>(
        flow_graph, flow::unlimited,
        [this, i](const flow::continue_msg&, AsyncNode::gateway_type& gateway) {
          arrive(i, gateway);
        },
        priority));
    flow::make_edge(*gate, *async);
    inputs[i] = gate.get();
    // async_node takes successors only through its output port.
    outputs[i] = &flow::output_port<0>(*async);
    async_of[i] = async.get();
  }
  for (std::uint32_t i = 0; i < n; ++i)
    if (predecessors[i] == 0) flow::make_edge(start, *inputs[i]);
  for (const auto& [from, to] : graph.edges) {
    const bool device_side = launched[from] != nullptr && launched[to] != nullptr;
    flow::make_edge(device_side ? *launched[from] : *outputs[from], *inputs[to]);
  }
}

void Executor::Impl::build_gpu_node(std::uint32_t i, flow::node_priority_t priority) {
  auto& launch = compute_nodes.emplace_back(std::make_unique<ComputeNode>(
      flow_graph,
      [this, i, body = std::move(graph.nodes[i].gpu_body)](const flow::continue_msg&) {
        execute(i, [&] { gpu->launch(i, body); });
        return flow::continue_msg();
      },
      priority));
  auto& done = async_nodes.emplace_back(std::make_unique<AsyncNode>(
      flow_graph, flow::unlimited,
      [this, i](const flow::continue_msg&, AsyncNode::gateway_type& gateway) {
        if (failed.load(std::memory_order_acquire)) return;
        gateway.reserve_wait();
        engine->watch(
            gpu->completion(i, where(i)),
            [this, i](std::exception_ptr failure) { complete(i, std::move(failure)); }, timeout);
      },
      priority));
  flow::make_edge(*launch, *done);
  inputs[i] = launch.get();
  launched[i] = launch.get();
  outputs[i] = &flow::output_port<0>(*done);
  async_of[i] = done.get();
}

void Executor::Impl::execute(std::uint32_t i, const std::function<void()>& body) {
  if (failed.load(std::memory_order_relaxed)) return;
  if (!profile) {
    try {
      body();
    } catch (...) {
      fail(i, std::current_exception());
    }
    return;
  }
  Record& record = records[i];
  record.lane = tbb::this_task_arena::current_thread_index();
  record.start_ns = now_ns();
  try {
    body();
  } catch (...) {
    fail(i, std::current_exception());
  }
  record.end_ns = now_ns();
}

void Executor::Impl::arrive(std::uint32_t i, AsyncNode::gateway_type& gateway) {
  if (failed.load(std::memory_order_acquire)) return;
  if (profile) records[i].ready_ns = now_ns();
  gateway.reserve_wait();
  if (!sequencers[sequencer_of[i]]->ready(slot_of[i])) gateway.release_wait();
}

std::unique_ptr<Work> Executor::Impl::start_operation(std::uint32_t i) {
  const NodeData& node = graph.nodes[i];
  const CollectiveSpec& c = node.collective;
  switch (node.kind) {
    case NodeKind::send:
      return backend.send_async(c.send, node.peer, node.tag);
    case NodeKind::recv:
      return backend.recv_async(c.send, node.peer, node.tag);
    case NodeKind::collective:
      break;
    default:
      throw Error(ErrorCode::internal, "start_operation on a compute node");
  }
  // The selector decides now, at execution: every rank decides alike (same sizes, world,
  // tuning file and overrides), so every rank runs the same algorithm.
  const CollectiveArgs args = args_of(c);
  const AlgorithmChoice choice = selector.choose(args, backend);
  algorithm_of[i] = to_string(choice.algorithm);
  reason_of[i] = choice.reason;
  return start_collective(backend, choice.algorithm, args);
}

// Runs under the node's sequencer lock, on the thread that made the node's turn come.
void Executor::Impl::issue(std::uint32_t i) {
  if (profile) records[i].start_ns = now_ns();
  std::unique_ptr<Work> work;
  try {
    work = start_operation(i);
  } catch (...) {
    fail(i, std::current_exception());
    async_of[i]->gateway().release_wait();
    return;
  }
  engine->watch(
      std::move(work), [this, i](std::exception_ptr failure) { complete(i, std::move(failure)); },
      timeout);
}

// Runs on the progress engine's thread.
void Executor::Impl::complete(std::uint32_t i, std::exception_ptr failure) {
  if (profile) {
    records[i].end_ns = now_ns();
    if (!failure) {
      const NodeData& node = graph.nodes[i];
      const auto start =
          std::chrono::duration_cast<std::chrono::nanoseconds>(run_start.time_since_epoch())
              .count();
      profiler.record({node.name,
                       node.kind == NodeKind::collective
                           ? std::string(to_string(node.collective.op))
                           : std::string(to_string(node.kind)),
                       detail::bytes_of(node), backend.world_size(), algorithm_of[i],
                       start + records[i].start_ns, start + records[i].end_ns});
    }
  }
  auto& gateway = async_of[i]->gateway();
  // A window on the collectives: the next one may go as soon as this one is done.
  if (!failure && graph.nodes[i].kind == NodeKind::collective)
    sequencers[sequencer_of[i]]->finished();
  if (failure)
    fail(i, std::move(failure));
  else
    gateway.try_put(flow::continue_msg());
  gateway.release_wait();
}

void Executor::Impl::fail(std::uint32_t i, std::exception_ptr failure) {
  {
    std::lock_guard lock(error_mutex);
    if (!error) {
      ErrorCode code = graph.nodes[i].kind == NodeKind::compute ? ErrorCode::node_failed
                                                                : ErrorCode::backend_failure;
      std::string what;
      try {
        std::rethrow_exception(failure);
      } catch (const Error& e) {
        what = e.what();
        if (graph.nodes[i].kind != NodeKind::compute) code = e.code();
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
        what = "an exception that is not a std::exception";
      }
      std::string message = where(i) + " failed: " + what;
      if (code == ErrorCode::timeout) {
        timed_out = true;
        message += "; the " + std::string(backend.name()) +
                   " backend cannot tell which ranks did not arrive";
      }
      error = std::make_exception_ptr(Error(code, message));
    }
  }
  failed.store(true, std::memory_order_release);
  flow_graph.cancel();
  for (auto& sequencer : sequencers)
    for (std::uint32_t slot : sequencer->close())
      async_of[sequencer->node(slot)]->gateway().release_wait();
}

// After a failed run: issue what this run had not issued yet, so every rank ends the run at
// the same point of each communication stream and the next run lines up again.
void Executor::Impl::drain() {
  for (auto& sequencer : sequencers) {
    for (std::uint32_t slot = sequencer->next(); slot < sequencer->size(); ++slot) {
      const std::uint32_t i = sequencer->node(slot);
      try {
        auto work = start_operation(i);
        if (timeout.count() > 0 ? !work->wait_for(timeout) : (work->wait(), false))
          throw Error(ErrorCode::timeout,
                      "did not complete within " + seconds_text(options.timeout->count()));
      } catch (const std::exception& e) {
        poisoned = "an earlier run failed and draining its communication failed too at " +
                   where(i) + ": " + e.what();
        return;
      }
    }
  }
}

void Executor::Impl::run() {
  std::lock_guard lock(run_mutex);
  if (!poisoned.empty()) throw Error(ErrorCode::cancelled, "Executor::run refused: " + poisoned);
  failed.store(false);
  error = nullptr;
  timed_out = false;
  for (auto& sequencer : sequencers) sequencer->reset();
  if (profile) std::fill(records.begin(), records.end(), Record{});
  run_start = Clock::now();
  start.try_put(flow::continue_msg());
  flow_graph.wait_for_all();
  has_profile = profile;
  if (failed.load()) {
    flow_graph.reset();
    if (timed_out) {
      std::string what;
      try {
        std::rethrow_exception(error);
      } catch (const Error& e) {
        what = e.message();
      }
      poisoned = "a watchdog timeout left the communicator in an unknown state (" + what + ")";
    } else {
      drain();
    }
    if (options.trace_path) write_trace_file();
    std::rethrow_exception(error);
  }
  if (options.trace_path) write_trace_file();
}

std::vector<detail::TraceSpan> Executor::Impl::spans() const {
  std::vector<detail::TraceSpan> out;
  if (!has_profile) return out;
  for (std::uint32_t i = 0; i < graph.nodes.size(); ++i) {
    const NodeData& node = graph.nodes[i];
    const Record& r = records[i];
    if (r.end_ns == 0 && r.start_ns == 0) continue;  // did not run (a failed run)
    const bool comm = sequencer_of[i] >= 0;
    // Every communication node uses the one communicator of the backend: one lane family.
    out.push_back({node.name, std::string(to_string(node.kind)), detail::describe(node), r.start_ns,
                   r.end_ns, comm ? -1 : std::max(r.lane, 0), comm ? "world" : "",
                   detail::bytes_of(node), comm ? algorithm_of[i] : "", issue_index[i],
                   r.ready_ns});
  }
  return out;
}

void Executor::Impl::write_trace_file() const {
  std::string path = *options.trace_path;
  if (backend.world_size() > 1) {
    const auto dot = path.rfind('.');
    const auto slash = path.rfind('/');
    const std::string suffix = ".rank" + std::to_string(backend.rank());
    if (dot == std::string::npos || (slash != std::string::npos && dot < slash))
      path += suffix;
    else
      path.insert(dot, suffix);
  }
  std::ofstream out(path);
  if (!out) throw Error(ErrorCode::invalid_argument, "cannot write the trace file '" + path + "'");
  detail::write_chrome_trace(out, backend.rank(), spans());
}

Executor::Executor(const Graph& graph, Backend& backend, ExecutorOptions options)
    : _impl(std::make_unique<Impl>(graph, backend, std::move(options))) {
  _impl->compile();
}

Executor::~Executor() = default;

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

std::vector<std::string> Executor::issue_order() const {
  std::vector<std::string> names;
  for (std::uint32_t i : _impl->collective_order) names.push_back(_impl->graph.nodes[i].name);
  return names;
}

std::size_t Executor::size() const noexcept {
  return _impl->graph.nodes.size();
}

std::vector<NodeTiming> Executor::last_run() const {
  std::vector<NodeTiming> out;
  if (!_impl->has_profile) return out;
  const auto& g = _impl->graph;
  for (std::uint32_t i = 0; i < g.nodes.size(); ++i) {
    const Record& r = _impl->records[i];
    const bool comm = _impl->sequencer_of[i] >= 0;
    out.push_back({g.nodes[i].name, g.nodes[i].kind, r.start_ns, r.end_ns, r.lane,
                   detail::bytes_of(g.nodes[i]), _impl->issue_index[i],
                   comm ? _impl->algorithm_of[i] : "", _impl->reason_of[i]});
  }
  return out;
}

void Executor::dump_dot(std::ostream& out) const {
  const auto& g = _impl->graph;
  detail::DotAnnotations notes;
  notes.issue_index = _impl->issue_index;
  notes.algorithm.resize(g.nodes.size());
  for (std::uint32_t i = 0; i < g.nodes.size(); ++i)
    if (_impl->sequencer_of[i] >= 0) notes.algorithm[i] = _impl->algorithm_of[i];
  if (_impl->has_profile) {
    notes.duration_us.resize(g.nodes.size());
    for (std::uint32_t i = 0; i < g.nodes.size(); ++i) {
      const Record& r = _impl->records[i];
      notes.duration_us[i] = std::max<double>(r.end_ns - r.start_ns, 0) / 1000.0;
    }
    notes.critical_path = detail::critical_path(g, notes.duration_us);
    for (std::uint32_t v : notes.critical_path) notes.critical_path_us += notes.duration_us[v];
  }
  detail::write_dot(out, g, &notes);
}

const CommunicationProfiler& Executor::profiler() const noexcept {
  return _impl->profiler;
}

void Executor::write_trace(std::ostream& out) const {
  detail::write_chrome_trace(out, _impl->backend.rank(), _impl->spans());
}

void Executor::write_trace(const std::string& path) const {
  std::ofstream out(path);
  if (!out) throw Error(ErrorCode::invalid_argument, "cannot write the trace file '" + path + "'");
  write_trace(out);
}

}  // namespace loom
