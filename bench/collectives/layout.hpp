// Layout: how one benchmark size maps to per-rank buffers, and the bus-bandwidth factors, as in
// nccl-tests (doc/PERFORMANCE.md).
#pragma once

#include <cstddef>
#include <string_view>

#include "loom/backend.hpp"
#include "loom/dtype.hpp"

namespace loom::bench {

/// @brief The buffers of one step. `bytes` is nccl-tests' size column: the whole buffer for
/// allreduce, broadcast, reduce and alltoall, the gathered (receive) buffer for allgather and
/// the scattered (send) buffer for reducescatter.
struct Layout {
  std::size_t count = 0;       ///< elements in that buffer (the count column)
  std::size_t bytes = 0;       ///< count x element size (the size column)
  std::size_t send_count = 0;  ///< elements each rank sends
  std::size_t recv_count = 0;  ///< elements each rank receives (broadcast: its one buffer)
};

/// @brief The layout for a requested size: count = bytes / element size, rounded down to a
/// multiple of `ranks` where the collective splits the buffer in blocks.
Layout layout_for(Collective collective, std::size_t bytes, DType dtype, int ranks);

/// @brief busbw / algbw: 2(n-1)/n for allreduce, (n-1)/n for allgather, reducescatter and
/// alltoall, 1 for broadcast and reduce.
double bus_factor(Collective collective, int ranks);

/// @brief Whether the collective applies a reduction operator.
bool reduces(Collective collective);

/// @brief The name -o takes and the output prints: "allreduce", "reducescatter", ...
std::string_view collective_name(Collective collective);

}  // namespace loom::bench
