// The planning vocabulary both data-parallel steps share: the plan (ReducerPlan: buckets, issue
// order, collectives in flight), what a search tries (PlanSearch), a shortlisted plan with its
// predicted and measured step (TimedPlan), and the round-robin timing of a shortlist
// (PlanTrials). DataParallelStep (step_planner.hpp) and GradientReducer (reducer_prediction.hpp)
// search with them; loom_torch.parallelize reads them through the GradientReducer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/bucketer.hpp"

namespace loom {

/// @brief Which bucket the reducer issues first when several are ready for a limited wire.
enum class IssuePriority : unsigned char {
  /// @brief The order the buckets are expected to become ready in (DDP's order).
  ready,
  /// @brief ByteScheduler's priority, as a fixed order: a bucket holding parameters the next
  /// forward needs earlier goes before a lower-priority one expected to be waiting with it.
  /// Applies with collectives_in_flight > 0 (without a limit every ready bucket is issued at
  /// once, and a fixed order could only delay one).
  forward,
};

const char* to_string(IssuePriority priority) noexcept;

/// @brief What each rank keeps whole and what it keeps only a shard of (its 1 / world size of
/// every bucket, counts padded to the world size): ZeRO's stages 1 and 2.
enum class ShardLevel : unsigned char {
  /// @brief Every rank holds whole gradients and updates every parameter (DDP).
  none,
  /// @brief Each bucket is reduce-scattered as its gradients are in (the same bytes on the wire
  /// as an allreduce): each rank receives only its shard's average and updates only its shard
  /// (its optimizer state is for the shard), and the updated shards are all-gathered into the
  /// parameters (ZeRO-1, as DeepSpeed's stage 1 with reduce_scatter). The gradient buckets stay
  /// resident.
  optimizer,
  /// @brief As optimizer, and each bucket's memory goes back to the kernel once scattered: the
  /// gradients are resident only from their hand-over to their bucket's scatter (ZeRO-2).
  gradients,
};

const char* to_string(ShardLevel level) noexcept;
/// @brief Parses "none|optimizer|gradients"; ErrorCode::invalid_argument naming the token
/// otherwise.
ShardLevel parse_shard_level(std::string_view name);

/// @brief How a step buckets, orders and reduces: the plan a planner (or the user) picks. A
/// GradientReducer runs all of it; a DataParallelStep takes the bucketing (cap, first bucket,
/// partition), the issue order and the collectives in flight (its compression and the rest are
/// DataParallelOptions').
struct ReducerPlan {
  /// @brief A bucket is closed once it holds this many bytes (DDP's bucket_cap_mb).
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;
  /// @brief The first bucket's limit, small so that communication starts early.
  std::size_t first_bucket_bytes = std::size_t{1} << 20;
  /// @brief Partition gradients larger than the cap across buckets (ByteScheduler's partition),
  /// so that a bucket the next forward needs early never waits behind one giant gradient.
  bool partition_large = false;
  /// @brief At most this many allreduces on the wire at once (0: no limit).
  std::size_t collectives_in_flight = 0;
  Compression compression = Compression::none;
  /// @brief The order the gradients are expected to become ready in (parameter indices, first
  /// first): buckets are filled in this order. Empty: reverse registration (backward's usual
  /// order, as DDP assumes before its first step).
  std::vector<std::size_t> ready_order;
  /// @brief The buckets' issue order (a permutation of the bucket indices; the same on every
  /// rank). Empty: made from `priority` (bucket order, i.e. the expected ready order, or
  /// forward_issue_order()).
  std::vector<std::size_t> issue_order;
  /// @brief How the issue order is made when issue_order is empty.
  IssuePriority priority = IssuePriority::ready;
  /// @brief The order the next forward uses the parameters in (parameter indices, first
  /// first), for IssuePriority::forward. Empty: registration order.
  std::vector<std::size_t> forward_order;
  /// @brief For IssuePriority::forward: the expected wire time of all gradients over the
  /// backward's time (the model forward_issue_order() schedules with).
  double wire_ratio = 1.0;
  /// @brief Count, per parameter, the ranks that produced its gradient in a step (DDP's
  /// find_unused_parameters): the client hands over unused ones with mark_unused() and learns
  /// after the step which were unused on every rank (globally_unused()). Costs one more
  /// allreduce at the end of backward, which every bucket's update waits for.
  bool track_usage = false;
  /// @brief Add an external node per update group, which the client signals with updated()
  /// once it applied the update: the run then spans the updates, and the trace shows them.
  bool external_updates = true;
  /// @brief Shard the averaged gradients, the update and its state across the ranks; needs
  /// external_updates (the all-gather follows the update).
  ShardLevel shard = ShardLevel::none;

  /// @brief ErrorCode::invalid_argument, "<who>: ...", naming the first bad field: a cap or
  /// first bucket of 0 bytes, a wire_ratio not finite and > 0, an issue order that repeats a
  /// bucket, a shard level without external_updates. The orders' lengths are checked against the
  /// parameters by the reducer that runs the plan.
  void check(const std::string& who) const;
};

/// @brief "cap 25 MiB, first 1 MiB, partition, float16, in flight 1, planned order, shard
/// gradients".
std::string describe(const ReducerPlan& plan);

/// @brief A plan on the wire (rank 0's decisions reach the other ranks so): the fields a search
/// varies (cap, first bucket, partition, collectives in flight, priority, wire_ratio, shard
/// level) and the issue order, appended to `out`. The one encoding every planner uses; PlanReader
/// reads it.
void encode_plan(const ReducerPlan& plan, std::vector<std::int64_t>& out);

/// @brief Reads, in order, values that encode_plan and the planner's own values make up.
class PlanReader {
 public:
  /// @brief `who` names the reader in its errors ("agree_on_plans on rank 1").
  PlanReader(std::span<const std::int64_t> values, std::string who);
  /// @brief The next value; ErrorCode::mismatch naming who and where when there is none.
  std::int64_t next();
  /// @brief The next value as the double whose bits it holds.
  double next_double();
  /// @brief A plan encode_plan wrote: `base` with the encoded fields read into it.
  ReducerPlan plan(ReducerPlan base);
  /// @brief Whether every value was read.
  bool done() const noexcept { return _at == _values.size(); }

 private:
  std::span<const std::int64_t> _values;
  std::size_t _at = 0;
  std::string _who;
};

/// @brief Whether two plans run the same: bucketing, collectives in flight, priority (and
/// wire_ratio where it is used), shard level and issue order.
bool same_plan(const ReducerPlan& a, const ReducerPlan& b);

/// @brief How much faster (a fraction of the running plan's measured step) a timed plan must be
/// to replace the running plan: plans closer than this are what a few noisy trial rounds cannot
/// tell apart, and the running plan stays (the GPT-like model of bench/torch/real_models.py
/// switched for 0.2-2% and then ran slower; loom-overlap's MLP switched to 25 buckets for a
/// trial's 1% and ran 3-5% slower).
inline constexpr double plan_switch_gain = 0.03;

/// @brief What an automatic plan searches, and how it decides: candidate bucketings (cap x
/// first bucket x partition), each with its issue orders and collectives in flight, predicted
/// by the step simulator; the best predicted are shortlisted, timed round-robin (PlanTrials)
/// and decided on rank 0's figures. Rank 0 decides everything; every rank runs its plans.
///
/// PlanSearch{} holds DataParallelStep's defaults (DataParallelOptions::automatic_plan);
/// for_gradient_reducer() the GradientReducer's (rank_plans, shortlist_reducer_plans,
/// choose_reducer_plan; loom_torch.parallelize's bucket_cap_mb="auto"). Fields read by one of
/// the two only say so.
struct PlanSearch {
  /// @brief Bucket caps tried (bytes).
  std::vector<std::size_t> caps_bytes = {
      std::size_t{256} << 10, std::size_t{512} << 10, std::size_t{1} << 20, std::size_t{2} << 20,
      std::size_t{4} << 20,   std::size_t{8} << 20,   std::size_t{25} << 20};
  /// @brief First-bucket sizes tried with each cap (those not below the cap are skipped; the
  /// cap itself is always tried).
  std::vector<std::size_t> first_bucket_bytes = {std::size_t{256} << 10, std::size_t{1} << 20};
  /// @brief Also try partitioning gradients larger than the cap (ReducerPlan::partition_large).
  bool try_partition = true;
  /// @brief Collectives in flight tried: 0 (no limit) .. max_in_flight.
  std::size_t max_in_flight = 2;
  /// @brief GradientReducer: also try IssuePriority::forward beside ready (with a collective
  /// limit).
  bool try_forward_priority = true;
  /// @brief GradientReducer (shortlist_reducer_plans): plans predicted under this factor of the
  /// running plan's predicted step are timed (>= 1; 1: only plans predicted faster). Above 1
  /// because on a few shared cores the model's error is often larger than a candidate's
  /// predicted gain: the simulator ranks, the trials' clock decides (the GPT-like model of
  /// bench/torch/real_models.py kept DDP's 25 MiB, no plan predicted faster, where smaller caps
  /// ran faster).
  double shortlist_margin = 1.10;
  /// @brief Profiled runs (steps) the plans are predicted from.
  int profile_runs = 2;
  /// @brief Plans timed, the running plan among them for the GradientReducer (0 or 1: the best
  /// predicted is taken untimed).
  std::size_t shortlist = 4;
  /// @brief Rounds over the shortlist (each plan runs once per round, round-robin, so a noisy
  /// machine disturbs them alike); the first round (new executors, new bucket memory) is not
  /// counted; PlanTrials::steps_s (each plan against the first in the same rounds) decides.
  int trial_runs = 4;
  /// @brief Per-message latency of the fitted wire (seconds).
  double latency_s = 50e-6;
  /// @brief DataParallelStep: compute workers per rank in the simulation (0: the running
  /// executor's, Executor::workers()).
  int workers = 0;
  /// @brief DataParallelStep: SimulationOptions::cores and comm_cpu (CPU the transport takes on
  /// few cores).
  double cores = 0;
  double comm_cpu = 0;
  /// @brief GradientReducer: the shard levels tried with every bucketing (empty: the running
  /// plan's only).
  std::vector<ShardLevel> shard_levels;
  /// @brief GradientReducer: the bytes per rank a plan may take (PlanMemory::total(),
  /// reducer_prediction.hpp); 0: no budget. Plans over it are predicted, never chosen.
  std::size_t memory_budget_bytes = 0;
  /// @brief GradientReducer: what PlanMemory counts beside loom's own memory: the optimizer's
  /// state per parameter element it updates, in bytes (Adam's two float32 moments: 8), and the
  /// activations the client measured.
  double state_bytes_per_element = 0;
  std::size_t activation_bytes = 0;

  /// @brief The GradientReducer's search (loom_torch.parallelize's bucket_cap_mb="auto"): caps
  /// 1, 2, 4, 10, 25 and 50 MiB, in flight 0..3; planned after 3 profiled steps, the running
  /// plan and the two fastest predicted timed 5 rounds. Five: a median of four same-round
  /// ratios per plan (with two counted steps one noisy step on a loaded host decided: the MLP's
  /// chosen plan timed 15% faster in its trials and ran 13% slower after).
  static PlanSearch for_gradient_reducer();
  /// @brief Runs DataParallelStep's automatic plan takes before its final plan runs
  /// (profile_runs, then every timed plan's trial_runs).
  int runs_to_decide() const;
  /// @brief ErrorCode::invalid_argument, "<who>: ...", naming the first bad field.
  void check(const std::string& who) const;
  /// @brief The bucketings this search tries, the one enumeration every planner uses: each cap,
  /// with the cap itself and each smaller first_bucket_bytes as its first bucket, unpartitioned
  /// and then (try_partition, where a gradient of `largest_gradient_bytes` exceeds the cap:
  /// otherwise partitioning changes nothing) partitioned. Each is `base` with those three
  /// fields set and no issue order. ErrorCode::invalid_argument for a cap of 0 bytes.
  std::vector<ReducerPlan> bucketings(const ReducerPlan& base,
                                      std::size_t largest_gradient_bytes) const;
};

/// @brief A plan as a search found it: the plan, its bucket count, the simulator's step for it
/// and, once timed, rank 0's measured step.
struct TimedPlan {
  ReducerPlan plan;
  std::size_t buckets = 0;
  /// @brief Its predicted memory per rank (PlanMemory::total()) and whether that is within
  /// PlanSearch::memory_budget_bytes (always, without a budget).
  std::size_t memory_bytes = 0;
  bool fits = true;
  double predicted_step_s = 0;  ///< the simulator's step for this plan
  double measured_step_s = 0;   ///< rank 0's step under it (PlanTrials::steps_s; 0: not timed)
};

/// @brief describe(plan.plan), then the bucket count when known: "cap 512 KiB, first 256 KiB,
/// partition, in flight 2, planned order, 17 buckets".
std::string describe(const TimedPlan& plan);

/// @brief Times a shortlist round-robin: each plan runs once per round, `rounds` rounds; the
/// first round (new executors, new bucket memory) is not counted. A plan's measurement is taken
/// against the first plan's in the same round (steps_s()), so that a host whose speed drifts
/// between rounds (a shared machine's often does, by tens of percent over seconds) disturbs
/// every plan of a round alike. Plans are indices into the caller's shortlist, so every
/// planner (DataParallelStep's, the GradientReducer's automatic plan) times its own.
class PlanTrials {
 public:
  /// @brief ErrorCode::invalid_argument for no plans or fewer than 2 rounds.
  PlanTrials(std::size_t plans, int rounds);
  /// @brief The plan whose run record() expects next.
  std::size_t current() const noexcept { return _current; }
  /// @brief How many plans are timed.
  std::size_t plans() const noexcept { return _runs_s.size(); }
  /// @brief Records the current plan's run; returns the plan to run next (current() after).
  /// ErrorCode::invalid_argument once done(), or for a negative or non-finite time.
  std::size_t record(double run_s);
  /// @brief Whether every plan ran `rounds` times.
  bool done() const noexcept;
  /// @brief Each plan's step, in seconds: the first plan's median over its counted runs, and
  /// for every other plan that median times the median over the counted rounds of the plan's
  /// run over the first plan's run in the same round (ErrorCode::invalid_argument before
  /// done()).
  std::vector<double> steps_s() const;
  /// @brief The index of the lowest time (the first among equals); ErrorCode::invalid_argument
  /// for none.
  static std::size_t fastest(std::span<const double> seconds);
  /// @brief The plan to run from times whose first is the running plan's: the fastest when it
  /// beats the first by more than plan_switch_gain, else 0 (the running plan stays);
  /// ErrorCode::invalid_argument for none.
  static std::size_t keep_or_switch(std::span<const double> seconds);

 private:
  std::vector<std::vector<double>> _runs_s;
  std::size_t _rounds;
  std::size_t _current = 0;
};

}  // namespace loom
