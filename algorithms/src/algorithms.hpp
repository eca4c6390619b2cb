// Factories of loom's collective algorithms (one file each); start_collective picks among them.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "loom/backend.hpp"
#include "schedule_steps.hpp"
#include "stepwise_algorithm.hpp"

namespace loom::algorithms {

/// @brief The blocks a ring allgather moves: equal blocks of `block` elements, or `out` cut
/// as evenly as possible into one block per rank (even == false).
class RingAllgatherSteps {
 public:
  RingAllgatherSteps(Buffer out, std::size_t block, bool even);
  Buffer block(int index, int world) const;

 private:
  Buffer _out;
  std::size_t _block;
  bool _even;
};

// Each takes arguments that Backend::validate accepted, a world of at least two ranks and a
// non-empty buffer (start_collective handles the trivial cases itself).
std::unique_ptr<ChannelWork> ring_allreduce(Backend& b, const CollectiveArgs& a,
                                            const WorkLabel& what);
std::unique_ptr<ChannelWork> recursive_doubling_allreduce(Backend& b, const CollectiveArgs& a,
                                                          const WorkLabel& what);
std::unique_ptr<ChannelWork> rabenseifner_allreduce(Backend& b, const CollectiveArgs& a,
                                                    const WorkLabel& what);
std::unique_ptr<ChannelWork> hierarchical_allreduce(Backend& b, const CollectiveArgs& a,
                                                    const WorkLabel& what);
std::unique_ptr<ChannelWork> hierarchical_allgather(Backend& b, const CollectiveArgs& a,
                                                    const WorkLabel& what);
std::unique_ptr<ChannelWork> hierarchical_reduce_scatter(Backend& b, const CollectiveArgs& a,
                                                         const WorkLabel& what);
std::unique_ptr<ChannelWork> hierarchical_broadcast(Backend& b, const CollectiveArgs& a,
                                                    const WorkLabel& what);
/// @brief How many shards hierarchical allreduce cuts the vector into: the fewest ranks any
/// node of `topology` holds.
int hierarchical_shards(const Topology& topology);
std::unique_ptr<ChannelWork> tree_allreduce(Backend& b, const CollectiveArgs& a,
                                            const WorkLabel& what);
std::unique_ptr<ChannelWork> tree_reduce(Backend& b, const CollectiveArgs& a,
                                         const WorkLabel& what);
std::unique_ptr<ChannelWork> tree_broadcast(Backend& b, const CollectiveArgs& a,
                                            const WorkLabel& what);
std::unique_ptr<ChannelWork> scatter_allgather_broadcast(Backend& b, const CollectiveArgs& a,
                                                         const WorkLabel& what);
std::unique_ptr<ChannelWork> ring_allgather(Backend& b, const CollectiveArgs& a,
                                            const WorkLabel& what);
std::unique_ptr<ChannelWork> recursive_doubling_allgather(Backend& b, const CollectiveArgs& a,
                                                          const WorkLabel& what);
std::unique_ptr<ChannelWork> bruck_allgather(Backend& b, const CollectiveArgs& a,
                                             const WorkLabel& what);
std::unique_ptr<ChannelWork> ring_reduce_scatter(Backend& b, const CollectiveArgs& a,
                                                 const WorkLabel& what);
std::unique_ptr<ChannelWork> recursive_halving_reduce_scatter(Backend& b, const CollectiveArgs& a,
                                                              const WorkLabel& what);
// Each algorithm's messages (AlgorithmInfo's schedule), in the file of its factory.
bool ring_allreduce_schedule(const Topology& t, double n, MessageSchedule& s);
bool recursive_doubling_allreduce_schedule(const Topology& t, double n, MessageSchedule& s);
bool rabenseifner_allreduce_schedule(const Topology& t, double n, MessageSchedule& s);
bool tree_allreduce_schedule(const Topology& t, double n, MessageSchedule& s);
bool tree_reduce_schedule(const Topology& t, double n, MessageSchedule& s);
bool tree_broadcast_schedule(const Topology& t, double n, MessageSchedule& s);
bool ring_allgather_schedule(const Topology& t, double n, MessageSchedule& s);
bool recursive_doubling_allgather_schedule(const Topology& t, double n, MessageSchedule& s);
bool bruck_allgather_schedule(const Topology& t, double n, MessageSchedule& s);
bool ring_reduce_scatter_schedule(const Topology& t, double n, MessageSchedule& s);
bool recursive_halving_reduce_scatter_schedule(const Topology& t, double n, MessageSchedule& s);
bool scatter_allgather_broadcast_schedule(const Topology& t, double n, MessageSchedule& s);
bool hierarchical_allreduce_schedule(const Topology& t, double n, MessageSchedule& s);
bool hierarchical_allgather_schedule(const Topology& t, double n, MessageSchedule& s);
bool hierarchical_reduce_scatter_schedule(const Topology& t, double n, MessageSchedule& s);
bool hierarchical_broadcast_schedule(const Topology& t, double n, MessageSchedule& s);
/// @brief The leaders' ring of hierarchical allgather and reduce_scatter: N - 1 steps, leader v
/// sending node (v - k)'s segment (`per_rank` bytes per rank of it) to leader v + 1, reduced on
/// arrival when `reduces`.
void leaders_ring_steps(MessageSchedule& s, const Topology& t, double per_rank, bool reduces);

/// @brief Starts `args` with `algorithm`, which cannot_run allows for them (the selector chose
/// it), recorded as start_collective records (`name`, `operation`), and returns its handle. The
/// arguments are validated once, inside the record, as start_collective validates them (a bad
/// call is a recorded failure); cannot_run is not evaluated again. native is the backend's
/// recorded call (Backend::collective_async), whose own validation is that one. For
/// AlgorithmSelector::start.
std::unique_ptr<Work> start_chosen(Backend& backend, Algorithm algorithm,
                                   const CollectiveArgs& args, std::string_view name,
                                   Backend::OperationRecord* operation);
/// @brief The blocking form, for AlgorithmSelector::run: native is the backend's blocking call
/// (Backend::collective, validated there), an algorithm start_chosen(...)->wait().
void run_chosen(Backend& backend, Algorithm algorithm, const CollectiveArgs& args);

// The alltoall and barrier of a backend without collectives of its own (start_on_algorithms).
std::unique_ptr<ChannelWork> pairwise_alltoall(Backend& b, const CollectiveArgs& a,
                                               const WorkLabel& what);
std::unique_ptr<ChannelWork> dissemination_barrier(Backend& b, const CollectiveArgs& a,
                                                   const WorkLabel& what);

}  // namespace loom::algorithms
