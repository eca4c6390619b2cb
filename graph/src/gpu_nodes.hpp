// GpuNodes: what the executor needs to run GPU compute nodes: a stream per node from a stream
// pool, an event recorded at each node's end, waits on the events of GPU predecessors (on the
// device, no host synchronisation), and a Work that completes when a node's event does.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "graph_state.hpp"
#include "loom/cuda_stream.hpp"
#include "loom/work.hpp"

namespace loom::detail {

class GpuNodes {
 public:
  /// @brief nullptr when `graph` has no GPU compute node; otherwise streams on the current
  /// CUDA device, assigned round-robin in `order`. Throws ErrorCode::unavailable naming the
  /// first GPU node when no device can be used.
  static std::unique_ptr<GpuNodes> create(const GraphState& graph,
                                          const std::vector<std::uint32_t>& order);

  /// @brief Whether node `i` is a GPU compute node.
  bool on_gpu(std::uint32_t i) const noexcept { return _stream_of[i] >= 0; }

  /// @brief Enqueues node `i`: its stream waits for the events of its GPU predecessors, then
  /// `body` enqueues the node's work, then the node's event is recorded. Never blocks.
  void launch(std::uint32_t i, const std::function<void(StreamRef)>& body);

  /// @brief A Work that finishes when everything node `i` enqueued in its last launch is done.
  std::unique_ptr<Work> completion(std::uint32_t i, std::string description);

  int device() const noexcept { return _device; }

 private:
  GpuNodes(const GraphState& graph, const std::vector<std::uint32_t>& order, int device);

  int _device;
  std::unique_ptr<cuda::StreamPool> _streams;
  std::vector<int> _stream_of;                                // per node: -1 unless on the GPU
  std::vector<std::vector<std::uint32_t>> _gpu_predecessors;  // per node
  std::vector<std::unique_ptr<cuda::Event>> _done;            // per node: its end
};

}  // namespace loom::detail
