// TrainStep: a short client of loom::DataParallelStep: the MLP described as a StepModel
// (per-layer forward, parameter and input gradients, a per-bucket SGD update), on the CPU
// (OpenBLAS) or a CUDA device (cuBLAS).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/backend.hpp"
#include "loom/bucketer.hpp"
#include "loom/data_parallel_step.hpp"
#include "loom/executor.hpp"
#include "loom/graph.hpp"
#include "mlp.hpp"

namespace loom::examples {

// The step's scheduling is the library's (loom/data_parallel_step.hpp): the example describes
// its MLP as a loom::StepModel.
using loom::describe;
using loom::OverlapMode;
using loom::parse_overlap_mode;
using loom::PlanSearch;
using loom::TimedPlan;
using loom::to_string;

/// @brief The order in which the model registers its parameters (DDP buckets in reverse).
enum class Registration : unsigned char {
  /// @brief W0, b0, W1, b1, ...: reverse registration is backward's order (DDP's assumption).
  forward,
  /// @brief The last layer first: DDP's first bucket then holds the gradients backward
  /// produces last, so its in-order launch waits for all of backward.
  reverse,
};

std::string_view to_string(Registration registration) noexcept;
Registration parse_registration(std::string_view name);

/// @brief Everything a TrainStep is built from.
struct TrainConfig {
  MlpShape shape;
  float learning_rate = 0.05f;
  OverlapMode mode = OverlapMode::loom;
  Registration registration = Registration::forward;
  /// @brief Caps, split, compression, pool. average stays on (gradients of a mean loss).
  BucketerOptions bucketing;
  /// @brief Let loom own the gradient memory (gradients are views into buckets); false keeps
  /// gradients in the model and packs them.
  bool gradient_views = true;
  /// @brief Where the model computes: the CPU (OpenBLAS) or a CUDA device (cuBLAS on the
  /// executor's streams, gradients copied into the pinned host buckets that MPI reduces).
  Device device = Device::cpu();
  ExecutorOptions executor;
  /// @brief loom mode: plan buckets, issue order and collectives in flight automatically
  /// (PlanSearch): run() predicts after the first profile_runs runs, times the shortlist over
  /// the next runs and then runs the fastest (collective; rank 0 decides, every rank runs the
  /// same plans). bucketing's caps are only the first runs'. Profiles the runs until the plan is
  /// decided (ExecutorOptions::profile decides after). loom mode only: ErrorCode::invalid_argument
  /// at construction in the others.
  std::optional<PlanSearch> automatic_plan;
};

class CudaMlp;

/// @brief The model, its Bucketer and the compiled step on one rank.
class TrainStep {
 public:
  /// @brief Builds and compiles the step (compiling communicates: call on every rank).
  TrainStep(Backend& backend, TrainConfig config);
  // The graph's nodes point into this object's model: it cannot move.
  TrainStep(const TrainStep&) = delete;
  TrainStep& operator=(const TrainStep&) = delete;
  ~TrainStep();

  /// @brief Runs one step: forward, backward, allreduce, update. In loom mode the forward of
  /// the step comes at the end of the previous run (the first run does it first).
  void run();
  /// @brief This rank's loss in the last forward: before the run's update in sequential and
  /// ddp modes, after it (the next step's forward) in loom mode.
  float loss() const;
  /// @brief Every parameter, layer by layer (W0, b0, W1, ...), concatenated.
  std::vector<float> parameters() const;
  /// @brief Rebuilds the buckets in the order gradients became ready in the last run (rank
  /// 0's order, broadcast) and recompiles, as DDP does after its first iteration. Needs a
  /// profiled run; collective: call on every rank.
  void rebuild_buckets();
  /// @brief loom mode: plans the buckets' issue order from the last (profiled) run, with one
  /// collective on the wire at a time. The first plan is the ready order; each later one
  /// reorders, lowest layer first, the buckets that were still waiting for the wire when
  /// backward ended (the next forward needs layer 0 first). Rank 0's plan is broadcast and
  /// the step recompiled; collective. After an automatic plan it keeps the plan's buckets and
  /// sets its in-flight limit to 1. Other modes: nothing. Needs ExecutorOptions::profile.
  void schedule_from_last_run();
  /// @brief The planned issue order (bucket indices), empty before schedule_from_last_run().
  const std::vector<std::size_t>& issue_order() const noexcept { return _step->issue_order(); }
  /// @brief loom mode: predicts every candidate plan (PlanSearch) from the runs since the
  /// last plan (or the last run) on rank 0 and runs the best predicted on every rank, untimed.
  /// Collective. Needs a profiled run; other modes: ErrorCode::invalid_argument.
  const TimedPlan& plan_automatically(const PlanSearch& search = {});
  /// @brief The plan running now (nullptr before one).
  const TimedPlan* plan() const noexcept { return _step->plan(); }
  /// @brief The automatic plan's timed shortlist, once it has decided (rank 0's predictions
  /// and measurements on every rank), in the order tried; empty before.
  const std::vector<TimedPlan>& plans_tried() const noexcept { return _step->plans_tried(); }

  Executor& executor() noexcept { return _step->executor(); }
  /// @brief The graph the step's executor was compiled from (loom mode: without the first
  /// step's forward, which a separate prologue runs once).
  const Graph& graph() const noexcept { return _step->graph(); }
  const Bucketer& bucketer() const noexcept { return _step->bucketer(); }
  /// @brief The library step the MLP runs in.
  DataParallelStep& step() noexcept { return *_step; }
  /// @brief The host model (its initial state only, when the step runs on a CUDA device).
  const Mlp& model() const noexcept { return _model; }
  const TrainConfig& config() const noexcept { return _config; }

 private:
  StepModel describe_model();
  DataParallelOptions step_options() const;

  TrainConfig _config;
  Mlp _model;
  std::unique_ptr<CudaMlp> _gpu;  // the model on the device, when config.device is CUDA
  // The model's own gradients, when it keeps them (gradient_views off): per layer W, b.
  std::vector<std::vector<float>> _own_gradients;
  float _loss = 0;
  std::unique_ptr<DataParallelStep> _step;
};

}  // namespace loom::examples
