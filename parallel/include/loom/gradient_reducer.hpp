// GradientReducer: the data-parallel step of a model whose backward runs outside loom (an
// autograd engine): gradients handed over as they are produced, bucketed, averaged in a fixed
// issue order, and each bucket's parameters released for their update as soon as it lands.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "loom/backend.hpp"
#include "loom/bucketer.hpp"
#include "loom/executor.hpp"
#include "loom/graph.hpp"
#include "loom/overlap_metrics.hpp"
#include "loom/plan.hpp"

namespace loom {

/// @brief The issue order IssuePriority::forward gives `buckets` (filled from gradients of
/// `bytes` each): the order ByteScheduler's priority queue would issue them in on a wire
/// carrying one bucket at a time, if the gradients became ready at a uniform rate per byte in
/// `ready_order` over a backward of time 1 and the wire took `wire_ratio` for all of them.
/// Whenever the wire frees, of the buckets expected to be ready it takes the one whose
/// earliest parameter in `forward_order` comes first (ties: bucket index); when none is
/// ready, the next to become ready. A function of its arguments only: the same on every rank.
/// Empty ready_order: reverse registration; empty forward_order: registration order.
std::vector<std::size_t> forward_issue_order(const std::vector<Bucket>& buckets,
                                             const std::vector<std::size_t>& bytes,
                                             const std::vector<std::size_t>& ready_order,
                                             const std::vector<std::size_t>& forward_order,
                                             double wire_ratio);

/// @brief The order GradientReducer issues `buckets` (filled from `parameters` under `plan`)
/// in: plan.issue_order if given, else forward_issue_order() under IssuePriority::forward with
/// a collective limit, else bucket order (the expected ready order).
std::vector<std::size_t> planned_issue_order(const std::vector<Bucket>& buckets,
                                             const std::vector<ParameterSpec>& parameters,
                                             const ReducerPlan& plan);

/// @brief The parameters updated together: a parameter goes with the last of its buckets to be
/// issued; groups in issue order.
struct UpdateGroups {
  std::vector<std::vector<std::size_t>> parameters;  ///< per group
  std::vector<std::vector<std::size_t>> buckets;     ///< per group, in issue order
  std::vector<std::size_t> group_of;                 ///< per parameter
};

/// @brief The update groups of `bucketer`'s buckets issued in `issue_order` (as GradientReducer
/// makes them).
UpdateGroups make_update_groups(const Bucketer& bucketer,
                                const std::vector<std::size_t>& issue_order);

/// @brief The update groups of a sharded plan: every bucket is updated exactly once (its shard),
/// so buckets that share a (split) parameter go in one group; a group comes where the last of
/// its buckets is issued, and holds every parameter with elements in its buckets.
UpdateGroups make_shard_groups(const Bucketer& bucketer,
                               const std::vector<std::size_t>& issue_order);

/// @brief The order a sharded plan all-gathers its update groups (`groups`: per group, its
/// buckets) in: by the first parameter the next forward needs of each (`forward_order`, else
/// registration order), ties by group.
std::vector<std::size_t> shard_gather_order(const std::vector<Bucket>& buckets,
                                            const std::vector<std::vector<std::size_t>>& groups,
                                            const std::vector<std::size_t>& forward_order,
                                            std::size_t parameters);

/// @brief What one rank updates of one parameter under a sharded plan: the elements
/// [offset, offset + count) of the parameter, which lie in this rank's shard of `bucket`.
struct ShardPiece {
  std::size_t parameter = 0;
  std::size_t offset = 0;  ///< first element of the parameter in this piece
  std::size_t count = 0;   ///< elements
  std::size_t bucket = 0;
  /// @brief The piece's values in loom's parameter memory (parameter_values()): the update
  /// writes them, and the all-gather sends them to every rank.
  Buffer values;
  /// @brief The piece's averaged gradient once its group's update is ready (wait_update()):
  /// a slice of this rank's reduce-scattered shard.
  Buffer gradient;
};

/// @brief Averages the gradients of a model whose backward happens outside loom.
///
/// The step is a Graph compiled once: one external node per gradient ("grad.<name>", in the
/// group of its module), each bucket's (pack ->) allreduce (-> unpack) chain from the Bucketer,
/// and per update group an external node "update<k>" after the buckets its parameters lie in.
/// Per step: begin() starts the run; ready(p, gradient) copies gradient p (scaled by 1 / world
/// size, as DDP does before its sum) into loom's bucket memory and signals its node, from any
/// thread; a bucket's allreduce is issued, in the fixed order, once its gradients are in; the
/// client polls (poll()) or waits (wait_update()) for update groups whose buckets landed,
/// applies its optimizer to their parameters reading the averaged gradient (gradient(p)), and
/// says so with updated(k); finish() ends the step.
///
/// Sharded (ReducerPlan::shard): every bucket is padded to a multiple of the world size and
/// rank r owns the r-th of its equal shards. The reducer owns the parameters' memory too
/// (parameter_values(): the client copies the values in once and makes the parameters views of
/// it). Each bucket is reduce-scattered into the rank's shard as its gradients are in (with
/// ShardLevel::gradients its pages then go back to the kernel); update group k then holds every
/// bucket that shares a parameter with another of the group, and its update is the client's
/// optimizer applied to shard_pieces(k) only, so its state is for the shard. After updated(k),
/// "<b>.shard" copies the rank's updated shard out and
/// "<b>.allgather" gathers every rank's into the parameter memory: the client waits for that
/// with wait_gathered(k) before the parameters are read (the next forward). Every wait has the
/// executor's timeout; failures are loom::Error naming the node, parameter and rank. The plan can
/// change between steps (replan()); the graph, trace, DOT and "why exposed" report are the
/// executor's.
class GradientReducer {
 public:
  /// @brief Builds and compiles the step for `backend` (compiling communicates: every rank
  /// constructs its reducer at the same point, with the same parameters). Throws
  /// ErrorCode::invalid_argument naming a bad parameter (no name, duplicate, no elements) or
  /// plan, ErrorCode::unsupported for compression of non-float32 gradients or an integer one.
  ///
  /// Parameters on a CUDA device (a build with CUDA, unsharded plans, one device, a backend
  /// that moves its memory: nccl, or mpi and ucx staging) have their buckets in device memory:
  /// ready() enqueues each gradient's scaled copy on `device_stream`, which the caller orders
  /// after the gradient's producer and gives the backend as its BackendSetup::device_stream
  /// (nullptr: the legacy default stream), so the bucket's collective starts after it on the
  /// device; gradient(p) is then device memory. The waits stay on the host (a group's update
  /// is ready when its collectives' device work completed). ErrorCode::unsupported names a
  /// device parameter the backend cannot move or a sharded plan of device parameters.
  GradientReducer(std::vector<ParameterSpec> parameters, Backend& backend, ReducerPlan plan = {},
                  ExecutorOptions executor = {}, cuda::NativeStream device_stream = nullptr);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  std::size_t num_parameters() const noexcept;
  const ParameterSpec& parameter(std::size_t p) const;
  const ReducerPlan& plan() const noexcept;
  const std::vector<Bucket>& buckets() const noexcept;
  /// @brief The buckets in the order their allreduces are issued (the same on every rank).
  const std::vector<std::size_t>& issue_order() const noexcept;
  /// @brief Where parameter p's averaged gradient is once its buckets landed (loom's memory,
  /// valid until the next replan()). Under a sharded plan only this rank's shard is averaged
  /// (ShardPiece::gradient): the reduce-scatter takes this memory as its workspace
  /// (CollectiveArgs::send_is_workspace), so after it the memory holds partial sums, no gradient.
  Buffer gradient(std::size_t p) const;

  /// @brief Update groups: the parameters updated together, in the order their buckets are
  /// issued. A parameter belongs to the group of the last of its buckets to be issued.
  std::size_t num_update_groups() const noexcept;
  const std::vector<std::size_t>& update_group(std::size_t k) const;
  /// @brief The update group of parameter p.
  std::size_t update_group_of(std::size_t p) const;

  /// @brief Starts a step. ErrorCode::invalid_argument if the last one was not finished.
  void begin();
  /// @brief Whether a step was begun and not finished.
  bool in_step() const noexcept;
  /// @brief Hands over parameter p's gradient (same count, dtype and device as declared; any
  /// thread): copied into the bucket, scaled by 1 / world size (for a device parameter,
  /// enqueued on the device stream: the gradient must stay valid until that copy ran).
  /// ErrorCode::invalid_argument for a mismatch, a second gradient for p in this step, or no step
  /// in progress. used = false (track_usage): p produced no gradient on this rank in this step, but
  /// the rank holds one from before (accumulated under no_sync): that is its share, as DDP sends
  /// it, while p counts as unused here for globally_unused().
  void ready(std::size_t p, Buffer gradient, bool used = true);
  /// @brief Parameter p produced no gradient on this rank in this step: its share is zero.
  void mark_unused(std::size_t p);
  /// @brief Whether parameter p's gradient was handed over (ready or mark_unused) this step.
  bool handed_over(std::size_t p) const;
  /// @brief track_usage: every parameter was handed over; starts the usage allreduce.
  void backward_done();

  /// @brief Update groups whose buckets (and usage count) landed since the last poll, in issue
  /// order; never waits.
  std::vector<std::size_t> poll();
  /// @brief Waits (the executor's timeout) until update group k's buckets landed.
  void wait_update(std::size_t k);
  /// @brief Device buckets whose backend runs every collective on the device stream (nccl
  /// with NcclConfig::run_on_input_stream): waits (the executor's timeout) only until update
  /// group k's collectives were issued, and the usage counts (track_usage) landed. Its averages
  /// are then ready on the device behind the device stream: a reader ordered after that stream
  /// (an event) reads them without the host waiting for the reduction. A bucket with a GPU
  /// unpack (compression), whose work is on the executor's streams, is waited for whole.
  void wait_issued(std::size_t k);
  /// @brief The client applied update group k (external_updates: signals its node).
  void updated(std::size_t k);
  /// @brief Sharded plans: this rank's pieces of update group k (what its optimizer updates);
  /// ErrorCode::invalid_argument for an unsharded plan.
  const std::vector<ShardPiece>& shard_pieces(std::size_t k) const;
  /// @brief Sharded plans: parameter p's values in loom's memory (zero until the client copies
  /// them in; kept across replan(), where the memory moves). After a step's wait_gathered(k)
  /// they hold every rank's updated shard.
  Buffer parameter_values(std::size_t p) const;
  /// @brief Sharded plans: waits (the executor's timeout) until update group k's updated shards
  /// were all-gathered into the parameter memory; the client signalled updated(k) before.
  void wait_gathered(std::size_t k);
  /// @brief Sharded plans: whether update group k's all-gathers ended in this step (never
  /// waits).
  bool gathered(std::size_t k) const;
  /// @brief Sharded plans: the update groups in the order their all-gathers are issued (the
  /// same on every rank): by the first parameter the next forward needs of them
  /// (ReducerPlan::forward_order, else registration order), after every reduction. A group's
  /// all-gather is issued only once every group before it here was updated: a client that
  /// waits for group k's first applies the updates of the groups before it.
  const std::vector<std::size_t>& gather_order() const;
  /// @brief track_usage, after an update group's wait: whether p was unused on every rank.
  bool globally_unused(std::size_t p) const;
  /// @brief Ends the step (Executor::wait): throws the run's failure, if any.
  void finish();

  /// @brief Rebuilds the buckets and recompiles with `plan` (collective: every rank, between
  /// steps, with the same plan). Gradient memory moves; a sharded plan's parameter memory too,
  /// the old kept until the step after the replan finishes (a backward begun under the old
  /// plan still reads it).
  void replan(ReducerPlan plan);
  /// @brief Frees now what the last replan replaced (a sharded plan's old parameter memory),
  /// once the client knows that the backward running when the plan changed has ended; the
  /// finish() of the step after the replan frees it otherwise.
  void release_replaced();
  /// @brief The order the gradients were handed over in the last finished step (parameter
  /// indices), for ReducerPlan::ready_order; empty before.
  std::vector<std::size_t> observed_ready_order() const;
  /// @brief When each parameter's gradient was handed over (ready or mark_unused) in the last
  /// finished step, in seconds since its begin() (-1: not handed over); empty before.
  std::vector<double> handed_over_seconds() const;
  /// @brief Rank 0's `order` on every rank (a collective on the reducer's backend, with its
  /// timeout): ready orders differ slightly between ranks and buckets must not.
  std::vector<std::size_t> agreed(const std::vector<std::size_t>& order);

  Executor& executor() noexcept;
  /// @brief The options the executor was compiled with, unset fields from the environment.
  ExecutorOptions executor_options() const;
  const Graph& graph() const noexcept;
  Backend& backend() noexcept;
  const Backend& backend() const noexcept;
  /// @brief The "why exposed" report of the last finished (profiled) step, one line per
  /// bucket, naming the modules whose gradients it holds.
  std::string explain() const;

 private:
  struct State;
  std::unique_ptr<State> _state;
};

}  // namespace loom
