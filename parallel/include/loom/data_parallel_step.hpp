// DataParallelStep: the data-parallel training step of any model that loom computes, described
// as an ordered list of layers (parameter groups) with their forward, backward and update work:
// bucketed allreduce in a fixed issue order, each bucket's update as soon as it lands, the next
// step's forward pipelined behind the communication tail, and the automatic plan.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/backend.hpp"
#include "loom/bucketer.hpp"
#include "loom/executor.hpp"
#include "loom/graph.hpp"
#include "loom/step_planner.hpp"

namespace loom {

/// @brief How communication is scheduled against backward.
enum class OverlapMode : unsigned char {
  /// @brief All of backward, then every bucket's allreduce, then every update.
  sequential,
  /// @brief PyTorch DDP's policy: a bucket's allreduce starts once it is ready and every
  /// earlier bucket (in bucket order) has started.
  ddp,
  /// @brief loom: buckets issued in an order fixed at compile time (the order the graph makes
  /// them ready, or the one schedule_from_last_run() or the automatic plan makes), each update
  /// as soon as its bucket is reduced, and steps pipelined: a run ends with the next step's
  /// forward, whose layer k starts once layer k's updates are in, while later layers' buckets
  /// are still on the wire.
  loom,
};

std::string_view to_string(OverlapMode mode) noexcept;
/// @brief "sequential|ddp|loom"; loom::Error naming the token otherwise.
OverlapMode parse_overlap_mode(std::string_view name);

/// @brief The work of one node: a CPU body (a TBB worker runs it) or a GPU body (it enqueues
/// on the stream the executor gives it), and the memory it reads and writes (the executor's
/// race check and the step's dependencies rest on them).
struct StepWork {
  std::function<void()> cpu;
  std::function<void(StreamRef)> gpu;
  std::vector<Buffer> reads;
  std::vector<Buffer> writes;
};

/// @brief One parameter of a layer.
struct StepParameter {
  std::string name;  ///< unique in the model ("layer3.weight")
  /// @brief Its elements (on the model's device): the updates read and write slices of it.
  Buffer values;
  /// @brief The model's own gradient memory, packed into buckets and unpacked back. Empty on
  /// every parameter: loom owns the gradients (views into the buckets, nothing packed).
  Buffer gradient;
};

/// @brief A piece of one parameter a bucket holds, handed to the model's update.
struct ParameterSlice {
  std::size_t layer = 0;
  std::size_t parameter = 0;  ///< index in the layer's parameters
  std::size_t offset = 0;     ///< first element of the piece in the parameter
  Buffer gradient;            ///< the averaged gradient of the piece
  Buffer values;              ///< the parameter's elements the piece updates
};

/// @brief One layer (a parameter group) of a model, in forward order. Each function is called
/// every time the step builds a graph and returns the work of one node.
struct StepLayer {
  std::vector<StepParameter> parameters;
  /// @brief The layer's forward from its input to its output.
  std::function<StepWork()> forward;
  /// @brief The gradients of the layer's parameters into `gradients` (one Buffer per
  /// parameter, in the layer's order: loom's bucket memory or the model's own).
  std::function<StepWork(std::span<const Buffer> gradients)> parameter_gradients;
  /// @brief The gradient with respect to the layer's input, for the layer below; empty for the
  /// first layer.
  std::function<StepWork()> input_gradient;
};

/// @brief A model the step computes: layers in forward order, the loss after the last one
/// (it writes the last layer's output gradient) and the update of a bucket's slices.
///
/// Nodes are named "forward<k>", "loss", "backward<k>.weights" (parameter gradients),
/// "backward<k>.input", "bucket<b>.<update_name>", and the next step's forward
/// "forward<k>.next", "loss.next".
struct StepModel {
  std::vector<StepLayer> layers;
  std::function<StepWork()> loss;
  std::function<StepWork(std::span<const ParameterSlice> slices)> update;
  std::string update_name = "update";
  /// @brief Registration order of the parameters, (layer, parameter) pairs (buckets are filled
  /// from its reverse, as DDP does). Empty: layer by layer, in each layer's order.
  std::vector<std::pair<std::size_t, std::size_t>> registration;
  /// @brief Where the work runs: the CPU (cpu bodies) or a CUDA device (gpu bodies, on the
  /// executor's streams).
  Device device = Device::cpu();
};

/// @brief How the step runs.
struct DataParallelOptions {
  OverlapMode mode = OverlapMode::loom;
  /// @brief Cap, first bucket, partition (BucketerOptions::partition_large), compression, pool;
  /// average is always on (gradients of a mean loss).
  BucketerOptions bucketing;
  ExecutorOptions executor;
  /// @brief loom mode: plan buckets, issue order and collectives in flight automatically
  /// (PlanSearch): run() predicts after the first profile_runs runs, times the shortlist (the
  /// configured plan as it runs first, then the best predicted others) over the next runs and
  /// then runs the configured plan unless another was faster by more than plan_switch_gain, in
  /// which case the fastest (collective; rank 0 decides, every rank runs the same plans).
  /// Profiles the runs until the plan is decided (ExecutorOptions::profile decides after).
  /// Other modes:
  /// ErrorCode::invalid_argument at construction.
  std::optional<PlanSearch> automatic_plan;
};

/// @brief The compiled data-parallel step of a StepModel on one rank.
class DataParallelStep {
 public:
  /// @brief Builds and compiles the step (compiling communicates: call on every rank with the
  /// same model shape). ErrorCode::invalid_argument naming a layer or parameter that is
  /// incomplete (no forward, no parameter gradients, no values, a first layer with an input
  /// gradient missing elsewhere...), or a bad option.
  DataParallelStep(Backend& backend, StepModel model, DataParallelOptions options);
  // The graph's nodes point into this object: it cannot move.
  DataParallelStep(const DataParallelStep&) = delete;
  DataParallelStep& operator=(const DataParallelStep&) = delete;
  ~DataParallelStep();

  /// @brief Runs one step: forward, backward, allreduce, update. In loom mode the forward of
  /// the step comes at the end of the previous run (the first run does it first).
  void run();
  /// @brief Rebuilds the buckets in the order gradients became ready in the last run (rank
  /// 0's order, agreed) and recompiles, as DDP does after its first iteration. Needs a
  /// profiled run; collective.
  void rebuild_buckets();
  /// @brief loom mode: plans the buckets' issue order from the last (profiled) run, with one
  /// collective on the wire at a time. The first plan is the ready order; each later one
  /// reorders, lowest layer first, the buckets that were still waiting for the wire when
  /// backward ended (the next forward needs layer 0 first). Rank 0's plan is agreed and the
  /// step recompiled; collective. After an automatic plan it keeps the plan's buckets and sets
  /// its in-flight limit to 1. Other modes: nothing. Needs ExecutorOptions::profile.
  void schedule_from_last_run();
  /// @brief The planned issue order (bucket indices), empty before a plan.
  const std::vector<std::size_t>& issue_order() const noexcept;
  /// @brief loom mode: predicts every candidate plan (PlanSearch) from the runs since the
  /// last plan (or the last run) on rank 0 and runs the best predicted on every rank, untimed.
  /// Collective. Needs a profiled run; other modes: ErrorCode::invalid_argument.
  const TimedPlan& plan_automatically(const PlanSearch& search = {});
  /// @brief The plan running now (nullptr before one): its bucketing, issue order and
  /// collectives in flight, with its bucket count, prediction and (once timed) measurement.
  const TimedPlan* plan() const noexcept;
  /// @brief The automatic plan's timed shortlist once it has decided (rank 0's predictions
  /// and measurements on every rank), in the order tried; empty before.
  const std::vector<TimedPlan>& plans_tried() const noexcept;

  Executor& executor() noexcept;
  /// @brief The graph the executor was compiled from (loom mode: without the first step's
  /// forward, which a separate prologue runs once).
  const Graph& graph() const noexcept;
  const Bucketer& bucketer() const noexcept;
  const DataParallelOptions& options() const noexcept;
  /// @brief The parameters in registration order, and where each one's layer is.
  std::size_t num_parameters() const noexcept;
  const StepParameter& parameter(std::size_t p) const;
  std::size_t layer_of(std::size_t p) const;

 private:
  struct State;
  std::unique_ptr<State> _state;
};

}  // namespace loom
