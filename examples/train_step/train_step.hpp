// TrainStep: one data-parallel training step of an Mlp as a loom Graph: forward, per-layer
// backward, bucketed allreduce and a per-bucket SGD update, in three scheduling modes.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/backend.hpp"
#include "loom/bucketer.hpp"
#include "loom/executor.hpp"
#include "loom/graph.hpp"
#include "mlp.hpp"

namespace loom::examples {

/// @brief How communication is scheduled against backward.
enum class OverlapMode : unsigned char {
  /// @brief All of backward, then every bucket's allreduce, then every update.
  sequential,
  /// @brief PyTorch DDP's policy: a bucket's allreduce starts once it is ready and every
  /// earlier bucket (in bucket order) has started.
  ddp,
  /// @brief loom: buckets issued in an order fixed at compile time (the order the graph makes
  /// them ready, or the one schedule_from_last_run() plans), each update as soon as its bucket
  /// is reduced, and steps pipelined: a run ends with the next step's forward, whose layer k
  /// starts once layer k's updates are in, while later layers' buckets are still on the wire.
  loom,
};

std::string_view to_string(OverlapMode mode) noexcept;
/// @brief "sequential|ddp|loom"; loom::Error naming the token otherwise.
OverlapMode parse_overlap_mode(std::string_view name);

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

/// @brief What TrainStep's automatic plan searches, and how it decides.
///
/// Every candidate bucketing (cap x first bucket x split) is built as the step's real graph,
/// given the durations the profiled runs measured (compute nodes by name; each bucket's pack,
/// unpack and update from a per-byte fit of the measured ones) and simulated
/// (loom::best_schedule: issue orders and collectives in flight 0..max_in_flight) on a wire
/// fitted to the runs' measured communication. The simulator ranks; the step then times the
/// shortlist (the best predicted plan for each in-flight limit, then the next best), all of
/// them compiled at once and run in turn, and keeps the fastest measured: a fitted wire misjudges
/// what few cores and TCP do to small messages (bench/results/2026-11-22_to_2026-11-24.md,
/// "Automatic plan", shows by how much). Rank 0 decides everything; every rank runs its plans.
struct PlanSearch {
  /// @brief Bucket caps tried (bytes).
  std::vector<std::size_t> caps_bytes = {
      std::size_t{256} << 10, std::size_t{512} << 10, std::size_t{1} << 20, std::size_t{2} << 20,
      std::size_t{4} << 20,   std::size_t{8} << 20,   std::size_t{25} << 20};
  /// @brief First-bucket sizes tried with each cap (those above the cap are skipped; the cap
  /// itself is always tried).
  std::vector<std::size_t> first_bucket_bytes = {std::size_t{256} << 10, std::size_t{1} << 20};
  /// @brief Also try cutting gradients at the cap (BucketerOptions::split_large).
  bool try_split = true;
  /// @brief Collectives in flight tried: 0 (no limit) .. max_in_flight.
  std::size_t max_in_flight = 2;
  /// @brief Profiled runs the plans are predicted from.
  int profile_runs = 2;
  /// @brief Plans timed (0 or 1: the best predicted is taken untimed).
  std::size_t shortlist = 4;
  /// @brief Rounds over the shortlist (each plan runs once per round, round-robin, so a noisy
  /// machine disturbs them alike); the first round (new executors, new bucket memory) is not
  /// counted and each plan's median over the others decides.
  int trial_runs = 4;
  /// @brief Per-message latency of the fitted wire (seconds).
  double latency_s = 50e-6;
  /// @brief Compute workers per rank in the simulation (0: TBB's current concurrency).
  int workers = 0;
  /// @brief SimulationOptions::cores and comm_cpu (CPU the transport takes on few cores).
  double cores = 0;
  double comm_cpu = 0;

  /// @brief Runs the automatic plan takes before its final plan runs (profile_runs, then every
  /// timed plan's trial_runs).
  int runs_to_decide() const;
};

/// @brief A plan the step can run: buckets, issue order and collectives in flight.
struct StepPlan {
  std::size_t cap_bytes = 0;
  std::size_t first_bucket_bytes = 0;
  bool split_large = false;
  std::size_t collectives_in_flight = 0;  ///< 0: no limit
  std::vector<std::size_t> issue_order;   ///< bucket indices, first issued first
  std::size_t buckets = 0;
  double predicted_step_s = 0;  ///< the simulator's step for this plan
  double measured_step_s = 0;   ///< timed (median of its counted runs), 0 if never timed
};

/// @brief "cap 512 KiB, first 256 KiB, split, 17 buckets, in flight 2".
std::string describe(const StepPlan& plan);

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
  const std::vector<std::size_t>& issue_order() const noexcept { return _issue_order; }
  /// @brief loom mode: predicts every candidate plan (PlanSearch) from the runs since the
  /// last plan (or the last run) on rank 0 and runs the best predicted on every rank, untimed.
  /// Collective. Needs a profiled run; other modes: ErrorCode::invalid_argument.
  const StepPlan& plan_automatically(const PlanSearch& search = {});
  /// @brief The plan running now (nullptr before one).
  const StepPlan* plan() const noexcept { return _plan ? &*_plan : nullptr; }
  /// @brief The automatic plan's timed shortlist, once it has decided (rank 0's predictions
  /// and measurements on every rank), in the order tried; empty before.
  const std::vector<StepPlan>& plans_tried() const noexcept { return _auto.tried; }

  Executor& executor() noexcept { return *_executor; }
  /// @brief The graph the step's executor was compiled from (loom mode: without the first
  /// step's forward, which a separate prologue runs once).
  const Graph& graph() const noexcept { return _graph; }
  const Bucketer& bucketer() const noexcept { return *_bucketer; }
  /// @brief The host model (its initial state only, when the step runs on a CUDA device).
  const Mlp& model() const noexcept { return _model; }
  const TrainConfig& config() const noexcept { return _config; }

 private:
  struct Parameter {
    std::string name;
    int layer;
    bool weight;
    std::vector<float>* values;
    std::vector<float> own_gradient;  // when the model owns its gradients
  };
  // The model's memory as the nodes' reads and writes declare it: the host model's, or the
  // device model's when the step computes on a GPU.
  struct Memory {
    std::function<Buffer(int)> input, weight, bias, z, a, grad_z;
  };
  // The compute nodes of one step's graph, by layer (layer 0 has no input gradient).
  struct Nodes {
    std::vector<Task> forward, weights, input;
    Task loss;
  };
  // A bucket's SGD update and the layers whose parameters it writes.
  struct Update {
    Task task;
    std::set<int> layers;
  };

  Memory model_memory();
  // Builds the step's graph from its parts and compiles it (and, in loom mode, the prologue).
  void compile();
  Graph build_graph();
  // Rank 0: every candidate plan for the profiled runs, fastest predicted first (step_plan.cpp).
  std::vector<StepPlan> search_plans(std::span<const std::vector<NodeTiming>> runs,
                                     const PlanSearch& search);
  // Rank 0's plans (empty if its search failed: every rank throws), on every rank.
  std::vector<StepPlan> agree_on_plans(const std::vector<StepPlan>& mine);
  std::vector<StepPlan> predict_plans(const PlanSearch& search, std::size_t keep);
  void apply_plan(StepPlan plan);
  // run()'s automatic plan: profile, time the shortlist, keep the fastest.
  void advance_automatic_plan(double run_s);
  std::unique_ptr<Bucketer> make_bucketer(const BucketerOptions& options);
  Task add_compute(Graph& graph, std::string name, std::function<void()> cpu,
                   std::function<void(StreamRef)> gpu, ComputeOptions options);
  Task add_forward(Graph& graph, const std::string& suffix, std::vector<Task>& forward);
  void add_backward(Graph& graph, Nodes& nodes);
  std::vector<BucketTasks> add_buckets(Graph& graph, const Nodes& nodes);
  Task add_sequential_phases(Graph& graph, Nodes& nodes, std::vector<BucketTasks>& buckets);
  Update add_update(Graph& graph, std::size_t bucket);
  std::vector<Update> add_updates(Graph& graph, Nodes& nodes, std::vector<BucketTasks>& buckets,
                                  Task reduce_done);
  void add_next_forward(Graph& graph, Nodes& nodes, std::vector<Update>& updates);
  ExecutorOptions executor_options() const;

  Backend& _backend;
  TrainConfig _config;
  Mlp _model;
  std::unique_ptr<CudaMlp> _gpu;       // the model on the device, when config.device is CUDA
  Memory _memory;                      // where nodes read and write the model
  std::vector<Parameter> _parameters;  // registration order
  std::unique_ptr<Bucketer> _bucketer;
  Graph _graph;  // what _executor was compiled from, for the step simulator's profile
  std::unique_ptr<Executor> _executor;
  std::unique_ptr<Executor> _prologue;  // loom mode: the first step's forward
  bool _primed = false;
  std::vector<std::size_t> _issue_order;
  std::vector<std::size_t> _ready_order;  // the gradients' order after rebuild_buckets()
  std::optional<StepPlan> _plan;
  // A compiled plan: its buckets, the executor bound to their memory, and the graph.
  struct Compiled {
    std::unique_ptr<Bucketer> bucketer;
    std::unique_ptr<Executor> executor;
    Graph graph;
    std::vector<std::size_t> issue_order;
    std::optional<StepPlan> plan;
  };
  // Exchanges the running plan with `other`.
  void swap_compiled(Compiled& other);
  struct AutomaticPlan {
    std::vector<std::vector<NodeTiming>> runs;  // profiled, at most PlanSearch::profile_runs
    std::vector<StepPlan> shortlist;            // being timed, round-robin
    std::vector<Compiled> compiled;             // each shortlisted plan's; the running one empty
    std::size_t current = 0;                    // the shortlisted plan running now
    std::vector<std::vector<double>> runs_s;    // each shortlisted plan's timed runs
    std::vector<StepPlan> tried;                // once decided
    bool decided = false;
  } _auto;
  float _loss = 0;
};

}  // namespace loom::examples
