// Collective: the collective operations and their arguments, one type shared by the backends,
// the algorithms, the graph and the benchmarks.
#pragma once

#include <string_view>

#include "loom/buffer.hpp"
#include "loom/dtype.hpp"

namespace loom {

/// @brief The collective operations loom schedules.
enum class Collective : unsigned char {
  broadcast,
  reduce,
  allreduce,
  allgather,
  reduce_scatter,
  alltoall,
  barrier
};

std::string_view to_string(Collective collective) noexcept;
/// @brief Parses "allreduce", "reduce_scatter" (also "reducescatter"), ...
Collective parse_collective(std::string_view name);

/// @brief One collective and its arguments, as the *_async calls take them. Broadcast uses
/// `send` (in place); reduce uses `recv` on the root only; barrier uses nothing.
struct CollectiveArgs {
  Collective op = Collective::allreduce;
  Buffer send;
  Buffer recv;
  ReduceOp reduce_op = ReduceOp::sum;
  int root = 0;
  /// @brief The caller does not read `send` after the operation: loom's own algorithms may use
  /// its memory as their workspace (the ring reduce-scatter then accumulates its partial sums
  /// in the input's blocks and takes no scratch). A graph counts the node as writing `send`.
  /// Native calls (MPI, NCCL) leave `send` as it was.
  bool send_is_workspace = false;
};

}  // namespace loom
