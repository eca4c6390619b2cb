// Algorithm: loom's own collective algorithms (ring, recursive doubling, Rabenseifner, trees,
// Bruck...), written once over a Backend's algorithm channel, and the backend's native call.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "loom/algorithm_info.hpp"
#include "loom/backend.hpp"

namespace loom {

/// @brief How a collective is performed: the backend's own call or one of loom's algorithms.
/// The value is the algorithm's id in the algorithm table (algorithm_info.hpp): stable across
/// ranks and releases. The names below are loom's own rows; a row registered with
/// register_algorithm has an id of its own (any value no row has), and is an Algorithm too.
enum class Algorithm : unsigned char {
  native = 0,              ///< the backend's call (MPI_Iallreduce, the local rendezvous, ...)
  ring = 1,                ///< allreduce (chunked, pipelined), allgather, reduce_scatter
  recursive_doubling = 2,  ///< "rd": allreduce (non-power-of-two fold), allgather (power of two)
  rabenseifner = 3,        ///< allreduce: recursive-halving reduce-scatter + rd allgather
  binomial_tree = 4,       ///< "tree": reduce, broadcast, allreduce (reduce + broadcast)
  bruck = 5,               ///< allgather, any rank count
  recursive_halving = 6,   ///< "halving": reduce_scatter (non-power-of-two fold)
  scatter_allgather = 7,   ///< broadcast: scatter from the root + ring allgather
  hierarchical = 8,        ///< over the Topology (needs several nodes, one with several ranks):
                           ///< allreduce (intra-node reduce-scatter, inter-node allreduce per
                           ///< shard, intra-node allgather), allgather and reduce_scatter (through
                           ///< each node's leader, a ring of leaders), broadcast (a tree of nodes)
};

/// @brief The row's name, used in LOOM_<COLL> ranges, tuning files and -a: "native", "ring",
/// "rd", "rabenseifner", "tree", "bruck", "halving", "scatter_allgather", "hierarchical", or a
/// registered row's; "unknown" for an id no row has.
std::string_view to_string(Algorithm algorithm) noexcept;
/// @brief Parses a row's name or alias ("recursive_doubling", "binomial", "binomial_tree",
/// "recursive_halving"); throws ErrorCode::invalid_argument naming the token and the names
/// expected otherwise.
Algorithm parse_algorithm(std::string_view name);

/// @brief The rows that implement `collective`, native first.
std::span<const Algorithm> candidates(Collective collective) noexcept;

/// @brief Why `algorithm` cannot perform `args` on `backend` ("count 3 < 4 ranks", "not a
/// power-of-two rank count", "buffers on a device"), or "" when it can. native always can.
std::string cannot_run(Algorithm algorithm, const CollectiveArgs& args, const Backend& backend);

/// @brief How many chunks hierarchical allreduce pipelines `bytes` in: one per
/// hierarchical_chunk_bytes, 1 to hierarchical_max_chunks. Chunk c runs stage s (intra-node
/// reduce-scatter, each inter-node step, intra-node allgather) at step c + s, so one chunk's
/// intra-node phases travel while another crosses the inter-node link.
int hierarchical_chunks(std::size_t bytes);
inline constexpr std::size_t hierarchical_chunk_bytes = std::size_t{1} << 20;
inline constexpr std::size_t hierarchical_max_chunks = 16;

/// @brief Whether hierarchical allreduce of `bytes` on `topology` runs its inter-node phase as
/// a ring (each shard cut into one block per node: 2(N-1) steps, a node's link carrying
/// 2(N-1)/N of the vector) rather than recursive doubling (log2 N exchanges plus the fold's
/// two, the whole vector each): on 3 nodes or more when the vector's blocks (before it is cut
/// into pipelined chunks, whose steps overlap) hold at least hierarchical_ring_block_bytes,
/// where bandwidth outweighs the ring's extra steps. The selector's model and the step
/// simulator follow the same rule.
bool hierarchical_inter_ring(const Topology& topology, std::size_t bytes);
inline constexpr std::size_t hierarchical_ring_block_bytes = std::size_t{64} << 10;

/// @brief Starts `args` with `algorithm` on `backend` and returns its handle at once; the
/// operation advances whenever the handle is tested (e.g. by a ProgressEngine), so it overlaps
/// with compute exactly as a native call does. Arguments are validated as the backend's own
/// calls validate them. Throws ErrorCode::unsupported when cannot_run() says why not.
/// Recorded in the backend's flight recorder as every asynchronous operation is (see
/// Backend::collective_async): as `name` (empty: the collective's name), with the algorithm;
/// `operation`, when given, receives its record.
std::unique_ptr<Work> start_collective(Backend& backend, Algorithm algorithm,
                                       const CollectiveArgs& args, std::string_view name = {},
                                       Backend::OperationRecord* operation = nullptr);

/// @brief The collectives of a backend whose transport moves messages only (a
/// PointToPointBackend: ucx), which are its native calls: the algorithm the cost model (the
/// built-in alpha-beta-gamma parameters, AlgorithmSelector::predict on the backend's topology)
/// finds cheapest among those that can run `args` (never native), alltoall by pairwise exchange,
/// barrier by dissemination. Not recorded (the backend records its native calls); `args` as
/// Backend::validate accepts them.
std::unique_ptr<Work> start_on_algorithms(Backend& backend, const CollectiveArgs& args);
/// @brief The algorithm start_on_algorithms runs for `args` (native for alltoall and barrier,
/// which it runs by pairwise exchange and dissemination, and for calls without a message).
Algorithm algorithm_for_transport(const CollectiveArgs& args, const Backend& backend);

/// @brief Performs `args` with `algorithm` and returns when it is done. `native` takes the
/// backend's blocking path (Backend::collective), which for small messages is several times
/// faster than starting the asynchronous form and waiting for it; the others are
/// start_collective(...)->wait().
void run_collective(Backend& backend, Algorithm algorithm, const CollectiveArgs& args);

}  // namespace loom
