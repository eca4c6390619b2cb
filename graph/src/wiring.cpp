// Wiring: the compiled graph's nodes as tbb::flow nodes. Compute and copy nodes are
// continue_nodes; communication and GPU completion are async_nodes whose body hands the
// operation on and returns at once, so no TBB worker ever waits on communication.
#include <algorithm>
#include <cstring>

#include "executor_impl.hpp"

namespace loom {

namespace flow = tbb::flow;
using detail::NodeData;

// A CPU compute or copy node: one continue_node runs its body (not a GPU node, a communication
// node or an external one, which have async_nodes).
bool Executor::Impl::runs_in_continue_node(std::uint32_t i) const {
  return !plan.communicates(i) && graph.nodes[i].kind != NodeKind::external &&
         !(wiring.gpu && wiring.gpu->on_gpu(i));
}

// A run of CPU compute (or copy) nodes in which each node is the only successor of the one
// before it and that one its only predecessor: TBB would run each next node at once on the
// same thread (a continue_node's single successor is its bypassed task), so one continue_node
// runs them in turn with the same order and parallelism, without a TBB node per node. Only in
// a graph without prioritised nodes: TBB runs a ready prioritised node (a critical task)
// before the bypassed next one and leaves that one to be stolen, which a fused run would not.
// Returns the runs of two or more nodes, in order.
std::vector<std::vector<std::uint32_t>> Executor::Impl::chains_of_compute() const {
  const std::size_t n = graph.nodes.size();
  if (std::any_of(graph.nodes.begin(), graph.nodes.end(),
                  [](const NodeData& node) { return node.priority != 0; }))
    return {};
  std::vector<std::uint32_t> successors(n, 0), predecessors(n, 0);
  std::vector<std::uint32_t> next(n, 0);
  for (const auto& [from, to] : graph.edges) {
    ++successors[from];
    ++predecessors[to];
    next[from] = to;
  }
  // `joined[v]`: v runs right after its only predecessor, in that predecessor's chain.
  std::vector<char> joined(n, 0);
  for (const auto& [from, to] : graph.edges)
    if (successors[from] == 1 && predecessors[to] == 1 && runs_in_continue_node(from) &&
        runs_in_continue_node(to))
      joined[to] = 1;
  std::vector<std::vector<std::uint32_t>> chains;
  for (std::uint32_t i = 0; i < n; ++i) {
    if (joined[i] || !runs_in_continue_node(i)) continue;
    std::vector<std::uint32_t> chain{i};
    // Each step follows a node's only out-edge into a node whose only in-edge it is: the walk
    // ends (an acyclic graph), and no node joins two chains.
    for (std::uint32_t at = i; successors[at] == 1 && joined[next[at]];) {
      at = next[at];
      chain.push_back(at);
    }
    if (chain.size() > 1) chains.push_back(std::move(chain));
  }
  return chains;
}

void Executor::Impl::build_flow_graph() {
  using ComputeNode = detail::Wiring::ComputeNode;
  auto& w = wiring;
  const std::size_t n = graph.nodes.size();
  w.inputs.assign(n, nullptr);
  w.outputs.assign(n, nullptr);
  w.async_of.assign(n, nullptr);
  if (w.gpu) w.launched.assign(n, nullptr);  // only graphs with GPU nodes launch any
  std::vector<std::uint32_t> predecessors(n, 0);
  for (const auto& edge : graph.edges) ++predecessors[edge.second];
  // The body moves into the TBB node, so running a node touches only that node's memory (the
  // executor's copy of the graph keeps names and buffers for DOT and errors).
  auto take_body = [&](std::uint32_t i) {
    const NodeData& node = graph.nodes[i];
    if (node.kind == NodeKind::copy)
      return std::function<void()>([src = node.collective.send, dst = node.collective.recv] {
        if (src.bytes() != 0) std::memmove(dst.data(), src.data(), src.bytes());
      });
    return std::move(graph.nodes[i].body);
  };
  std::vector<char> in_chain(n, 0);
  for (auto& chain : chains_of_compute()) {
    for (std::uint32_t i : chain) in_chain[i] = 1;
    std::vector<std::pair<std::uint32_t, std::function<void()>>> bodies;
    bodies.reserve(chain.size());
    for (std::uint32_t i : chain) bodies.emplace_back(i, take_body(i));
    // After a body throws, execute() returns at once for the rest (the run has failed).
    auto& c = w.compute_nodes.emplace_back(std::make_unique<ComputeNode>(
        w.flow_graph,
        [this, bodies = std::move(bodies)](const flow::continue_msg&) {
          for (const auto& [i, body] : bodies) execute(i, body);
          return flow::continue_msg();
        },
        flow::no_priority));
    w.inputs[chain.front()] = c.get();
    w.outputs[chain.back()] = c.get();
  }
  for (std::uint32_t i = 0; i < n; ++i) {
    const NodeData& node = graph.nodes[i];
    const auto priority = static_cast<flow::node_priority_t>(node.priority);
    if (w.gpu && w.gpu->on_gpu(i)) {
      build_gpu_node(i, priority);
      continue;
    }
    if (runs_in_continue_node(i)) {
      if (in_chain[i]) continue;  // built above
      auto& c = w.compute_nodes.emplace_back(std::make_unique<ComputeNode>(
          w.flow_graph,
          [this, i, body = take_body(i)](const flow::continue_msg&) {
            execute(i, body);
            return flow::continue_msg();
          },
          priority));
      w.inputs[i] = c.get();
      w.outputs[i] = c.get();
      continue;
    }
    // A continue_node counts the predecessors (async_node would fire once per message), then
    // the async_node hands the operation to the sequencer and returns at once (an external
    // node: holds its gateway until the signal).
    auto& gate = w.compute_nodes.emplace_back(std::make_unique<ComputeNode>(
        w.flow_graph, [](const flow::continue_msg&) { return flow::continue_msg(); }, priority));
    auto& async = w.async_nodes.emplace_back(std::make_unique<AsyncNode>(
        w.flow_graph, flow::unlimited,
        [this, i, external = node.kind == NodeKind::external](const flow::continue_msg&,
                                                              AsyncNode::gateway_type& gateway) {
          if (external)
            arrive_external(i, gateway);
          else
            arrive(i, gateway);
        },
        priority));
    flow::make_edge(*gate, *async);
    w.inputs[i] = gate.get();
    // async_node takes successors only through its output port.
    w.outputs[i] = &flow::output_port<0>(*async);
    w.async_of[i] = async.get();
  }
  for (std::uint32_t i = 0; i < n; ++i)
    if (predecessors[i] == 0) flow::make_edge(w.start, *w.inputs[i]);
  for (const auto& [from, to] : graph.edges) {
    if (w.outputs[from] == nullptr) continue;  // inside a chain: its continue_node runs both
    const bool device_side =
        !w.launched.empty() && w.launched[from] != nullptr && w.launched[to] != nullptr;
    flow::make_edge(device_side ? *w.launched[from] : *w.outputs[from], *w.inputs[to]);
  }
}

void Executor::Impl::build_gpu_node(std::uint32_t i, flow::node_priority_t priority) {
  using ComputeNode = detail::Wiring::ComputeNode;
  auto& w = wiring;
  auto& launch = w.compute_nodes.emplace_back(std::make_unique<ComputeNode>(
      w.flow_graph,
      [this, i, body = std::move(graph.nodes[i].gpu_body)](const flow::continue_msg&) {
        execute(i, [&] { wiring.gpu->launch(i, body); });
        return flow::continue_msg();
      },
      priority));
  auto& done = w.async_nodes.emplace_back(std::make_unique<AsyncNode>(
      w.flow_graph, flow::unlimited,
      [this, i](const flow::continue_msg&, AsyncNode::gateway_type& gateway) {
        if (failure.failed.load(std::memory_order_acquire)) return;
        gateway.reserve_wait();
        engine->watch(
            wiring.gpu->completion(i, where(i)),
            [this, i](std::exception_ptr error) { complete(i, std::move(error)); }, timeout);
      },
      priority));
  flow::make_edge(*launch, *done);
  w.inputs[i] = launch.get();
  w.launched[i] = launch.get();
  w.outputs[i] = &flow::output_port<0>(*done);
  w.async_of[i] = done.get();
}

}  // namespace loom
