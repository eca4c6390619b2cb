// Candidate timing: every candidate algorithm of some collectives timed at some sizes in
// interleaved rounds, by every rank together; what loom-tune --full and the calibration share.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "loom/backend.hpp"
#include "loom/tuning.hpp"

namespace loom {

/// @brief What time_candidates() times, and how long.
struct CandidateTimingOptions {
  std::vector<Collective> collectives{Collective::allreduce};
  /// @brief Benchmark sizes in bytes (nccl-tests' convention: the whole buffer; allgather:
  /// the gathered one; reduce_scatter: the whole input).
  std::vector<std::size_t> sizes;
  /// @brief Every candidate at every size is timed once per round; each keeps its median.
  int rounds = 7;
  /// @brief Time spent per (collective, size, candidate), split over the rounds (at least one
  /// call per round).
  double seconds_per_point = 0.05;
  /// @brief The forms to time (TimingForm): asynchronous is start_collective(...)->wait(), how
  /// loom runs collectives (the executor, the torch process group, GradientReducer); blocking
  /// is run_collective. They differ for native only, so native is timed once per form and
  /// loom's algorithms once; the result holds a table per form, each candidate's spread taken
  /// against that form's native. Not empty, no unknown, no repeats.
  std::vector<TimingForm> forms{TimingForm::asynchronous};
};

/// @brief Every rank's maximum of `v` (the slowest rank decides a collective's time).
/// Collective: every rank calls it.
double max_over_ranks(Backend& backend, double v);

/// @brief float32 sum buffers for `collective` at benchmark size `bytes` over `world` ranks,
/// in `send` and `recv` (grown as needed; the returned arguments point into them).
CollectiveArgs benchmark_args(Collective collective, std::size_t bytes, int world,
                              std::vector<float>& send, std::vector<float>& recv);

/// @brief Times every candidate that can run (cannot_run) of every collective at every size.
/// Collective: every rank calls it with the same options. Each round visits every point: the
/// (collective, size) groups in turn, starting one group later each round, each group's
/// candidates in an order shuffled per round (the same on every rank), so that a burst of load
/// on a shared machine lands in some rounds of every candidate rather than deciding one
/// candidate's figure, and no candidate always runs after the same neighbour; a point's
/// time per round is the slowest rank's average per call, so every rank returns the same
/// figures. Returns per form, per point the median over rounds and its spread against that
/// form's native (see Measurement::spread_seconds), tagged with the form. `on_round(k)` is called
/// after round k (1-based).
std::vector<Measurement> time_candidates(Backend& backend, const CandidateTimingOptions& options,
                                         const std::function<void(int)>& on_round = {});

/// @brief The order time_candidates visits its points in round `round`, given each (collective,
/// size) group's point count in list order: indices into that list, the groups in turn from
/// group `round` on, each group's points shuffled by a generator seeded by the round and the
/// group (the same on every rank, every run).
std::vector<std::size_t> candidate_visit_order(const std::vector<std::size_t>& group_sizes,
                                               int round);

}  // namespace loom
