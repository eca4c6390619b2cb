// Wiring: the compiled graph's nodes as tbb::flow nodes. Compute and copy nodes are
// continue_nodes; communication and GPU completion are async_nodes whose body hands the
// operation on and returns at once, so no TBB worker ever waits on communication.
#include <cstring>

#include "executor_impl.hpp"

namespace loom {

namespace flow = tbb::flow;
using detail::NodeData;

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
  for (std::uint32_t i = 0; i < n; ++i) {
    const NodeData& node = graph.nodes[i];
    const auto priority = static_cast<flow::node_priority_t>(node.priority);
    if (w.gpu && w.gpu->on_gpu(i)) {
      build_gpu_node(i, priority);
      continue;
    }
    if (!plan.communicates(i) && node.kind != NodeKind::external) {
      // The body moves into the TBB node, so running a node touches only that node's memory
      // (the executor's copy of the graph keeps names and buffers for DOT and errors).
      std::function<void()> body = std::move(graph.nodes[i].body);
      if (node.kind == NodeKind::copy) {
        body = [src = node.collective.send, dst = node.collective.recv] {
          if (src.bytes() != 0) std::memmove(dst.data(), src.data(), src.bytes());
        };
      }
      auto& c = w.compute_nodes.emplace_back(std::make_unique<ComputeNode>(
          w.flow_graph,
          [this, i, body = std::move(body)](const flow::continue_msg&) {
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
