// GPU compute nodes: streams, end-of-node events, device-side waits between streams, and the
// Work through which the progress engine sees a node finish.
#include "gpu_nodes.hpp"

#include <algorithm>
#include <string>

#include "loom/cuda_device.hpp"
#include "loom/error.hpp"

namespace loom::detail {
namespace {

// Polls a node's end event; cudaEventQuery never blocks the progress thread.
class EventWork final : public Work {
 public:
  EventWork(std::string description, const cuda::Event& event)
      : Work(std::move(description)), _event(event) {}

 protected:
  bool poll() override { return _event.complete(); }

 private:
  const cuda::Event& _event;
};

constexpr std::size_t max_compute_streams = 4;

}  // namespace

std::unique_ptr<GpuNodes> GpuNodes::create(const GraphState& graph,
                                           const std::vector<std::uint32_t>& order) {
  const auto first = std::find_if(graph.nodes.begin(), graph.nodes.end(), [](const NodeData& n) {
    return n.kind == NodeKind::compute && n.placement == Placement::gpu;
  });
  if (first == graph.nodes.end()) return nullptr;
  if (cuda::device_count() == 0)
    throw Error(ErrorCode::unavailable, "compute node '" + first->name + "' runs on the GPU, but " +
                                            cuda::unavailable_reason());
  return std::unique_ptr<GpuNodes>(new GpuNodes(graph, order, cuda::current_device()));
}

GpuNodes::GpuNodes(const GraphState& graph, const std::vector<std::uint32_t>& order, int device)
    : _device(device) {
  const std::size_t n = graph.nodes.size();
  _stream_of.assign(n, -1);
  _gpu_predecessors.resize(n);
  _done.resize(n);
  std::size_t gpu_nodes = 0;
  for (const NodeData& node : graph.nodes)
    gpu_nodes += node.kind == NodeKind::compute && node.placement == Placement::gpu;
  _streams = std::make_unique<cuda::StreamPool>(device, std::min(gpu_nodes, max_compute_streams));
  // Round-robin in schedule order, so nodes that may run concurrently tend to get different
  // streams; a chain alternates streams too, which costs only a device-side event wait.
  int next = 0;
  for (std::uint32_t i : order) {
    const NodeData& node = graph.nodes[i];
    if (node.kind != NodeKind::compute || node.placement != Placement::gpu) continue;
    _stream_of[i] = next;
    next = (next + 1) % static_cast<int>(_streams->compute_stream_count());
    _done[i] = std::make_unique<cuda::Event>(device);
  }
  for (const auto& [from, to] : graph.edges)
    if (_stream_of[from] >= 0 && _stream_of[to] >= 0) _gpu_predecessors[to].push_back(from);
}

void GpuNodes::launch(std::uint32_t i, const std::function<void(StreamRef)>& body) {
  // TBB workers start on device 0; a caller's thread (Executor::wait joins the arena) gets its
  // own device back.
  const cuda::DeviceGuard on_device(_device);
  const cuda::Stream& stream = _streams->compute(static_cast<std::size_t>(_stream_of[i]));
  for (std::uint32_t p : _gpu_predecessors[i])
    if (_stream_of[p] != _stream_of[i]) stream.wait(*_done[p]);
  body(StreamRef{static_cast<void*>(stream.native()), _device});
  _done[i]->record(stream);
}

std::unique_ptr<Work> GpuNodes::completion(std::uint32_t i, std::string description) {
  return std::make_unique<EventWork>(std::move(description), *_done[i]);
}

}  // namespace loom::detail
