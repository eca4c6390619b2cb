// Factories of loom's collective algorithms (one file each); start_collective picks among them.
#pragma once

#include <memory>
#include <string>

#include "loom/backend.hpp"
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
// The alltoall and barrier of a backend without collectives of its own (start_on_algorithms).
std::unique_ptr<ChannelWork> pairwise_alltoall(Backend& b, const CollectiveArgs& a,
                                               const WorkLabel& what);
std::unique_ptr<ChannelWork> dissemination_barrier(Backend& b, const CollectiveArgs& a,
                                                   const WorkLabel& what);

}  // namespace loom::algorithms
