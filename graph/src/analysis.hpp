// Graph analyses on Boost.Graph: validation (structure, cycles, collectives, races), the
// deterministic schedule order and the critical path of a measured run.
#pragma once

#include <cstdint>
#include <vector>

#include "graph_state.hpp"

namespace loom::detail {

/// @brief Dangling edges, self edges and duplicate names; throws ErrorCode::graph_invalid.
void check_structure(const GraphState& graph);

/// @brief Throws ErrorCode::graph_invalid naming the nodes of one cycle, if there is one.
void check_acyclic(const GraphState& graph);

/// @brief Buffers of collectives, sends, receives and copies against the op and world size
/// (world_size <= 0: only world-independent checks). Throws naming the node.
void check_communication(const GraphState& graph, int world_size);

/// @brief A topological order in which the collectives come in the order they will be issued:
/// topological among themselves, ties broken by higher priority, then insertion order.
/// Deterministic: the same graph gives the same order on every rank.
/// Precondition: acyclic.
std::vector<std::uint32_t> schedule_order(const GraphState& graph);

/// @brief Two nodes with no path between them that touch overlapping bytes, one writing, are
/// a data race: throws ErrorCode::graph_invalid naming both. `order` is schedule_order().
void check_races(const GraphState& graph, const std::vector<std::uint32_t>& order);

/// @brief The heaviest path (sum of node weights) through the DAG, from a source to a sink.
std::vector<std::uint32_t> critical_path(const GraphState& graph,
                                         const std::vector<double>& weights);

/// @brief Everything above, in that order.
void validate_graph(const GraphState& graph, int world_size);

}  // namespace loom::detail
