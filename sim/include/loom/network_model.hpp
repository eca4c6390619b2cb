// NetworkModel: what a collective costs at a rank count, from the selector's alpha-beta-gamma
// model.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

#include "loom/algorithm.hpp"
#include "loom/algorithm_selector.hpp"
#include "loom/cluster_network.hpp"
#include "loom/tuning.hpp"

namespace loom {

struct StepProfile;

/// @brief An algorithm and its modelled time.
struct CollectiveCost {
  Algorithm algorithm = Algorithm::native;
  double seconds = 0;
};

/// @brief The cost of each communication node alone on the wire: the cheapest candidate by
/// AlgorithmSelector::predict (the choice the selector's model makes without measurements).
class NetworkModel {
 public:
  explicit NetworkModel(TuningParameters tuning);
  /// @brief A link of `bits_per_s` with `latency_s` per message: alpha = latency, beta =
  /// 8 / rate; gamma (the reduction) default_tuning()'s.
  static NetworkModel from_link(double bits_per_s, double latency_s);
  /// @brief A link whose beta makes the profile's collectives, one after another, take the
  /// wire time the profile measured: a wire calibrated on the run itself, for transports no
  /// nominal rate describes (shared memory, a shaped loopback). That time is measured_comm_s,
  /// or the step's non-compute time (measured_step_s - measured_compute_s) where that is
  /// longer: rank 0's own intervals miss what its peers drove before rank 0 issued a collective
  /// (Open MPI's native allreduce on 2 ranks: 42 ms of a 52 ms wire). The step's non-compute
  /// time also holds any idle time (dependency gaps, a slower peer), which the fit then counts
  /// as wire: fit on a profile whose compute has no gaps (sequential mode). Needs
  /// measured_comm_s > 0.
  static NetworkModel fitted(const StepProfile& profile, double latency_s);
  /// @brief Two levels: each collective the cheapest of loom's algorithms replayed on
  /// `cluster` (cluster_cost: a node's shared memory, each node's link shared by its ranks).
  /// At a rank count other than the cluster's, nodes of as many ranks as its node 0 holds, in
  /// blocks (what-if at another scale with the same node). A send or receive crosses a link.
  /// Under simulate(), collectives in flight share this network as they share one wire: each
  /// progresses at 1/k of its two-level time alone (a memory-bound and a link-bound collective
  /// are not told apart).
  static NetworkModel two_level(ClusterNetwork cluster);

  /// @brief `op` on `bytes` over `ranks` (0 at one rank).
  CollectiveCost collective(Collective op, std::size_t bytes, int ranks) const;
  /// @brief A send or receive of `bytes`: alpha + bytes beta.
  double point_to_point(std::size_t bytes) const;
  const TuningParameters& tuning() const noexcept { return _selector.tuning(); }
  /// @brief The two-level network, if this model has one.
  const std::optional<ClusterNetwork>& cluster() const noexcept { return _cluster; }
  /// @brief The two-level network at `ranks` (see two_level()); ErrorCode::invalid_argument
  /// when this model has none.
  ClusterNetwork cluster_at(int ranks) const;

  /// @brief Each collective only by one of `algorithms` (what-if: "flat algorithms only";
  /// empty: every candidate). collective() then throws ErrorCode::invalid_argument naming the
  /// collective where none of them applies to it.
  void allow_only(std::vector<Algorithm> algorithms) { _allowed = std::move(algorithms); }
  const std::vector<Algorithm>& allowed() const noexcept { return _allowed; }

 private:
  bool allowed(Algorithm a) const;

  AlgorithmSelector _selector;
  std::optional<ClusterNetwork> _cluster;
  std::vector<Algorithm> _allowed;  // empty: all
};

/// @brief "2gbit", "100Gbit", "500mbit", "10gbps" (bytes), "1e9" (bits) to bits per second;
/// ErrorCode::invalid_argument naming the text otherwise.
double parse_link_rate(std::string_view text);
/// @brief "200GB/s", "4.5gb/s", "500MB/s" (powers of 1000) or a link rate as parse_link_rate
/// reads it ("100gbit") to bytes per second; ErrorCode::invalid_argument naming the text.
double parse_byte_rate(std::string_view text);
/// @brief "20us", "1.5ms", "0", "3e-6s" to seconds; ErrorCode::invalid_argument otherwise.
double parse_duration(std::string_view text);

}  // namespace loom
