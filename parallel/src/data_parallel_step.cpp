// DataParallelStep: builds a StepModel's step graph (forward chain, per-layer backward nodes, the
// Bucketer's chains, per-bucket updates, the pipelined next forward) for one of three overlap
// modes, compiles and runs it, and plans it (issue order from a profiled run, or the automatic
// plan of step_planner.cpp).
#include "loom/data_parallel_step.hpp"

#include <algorithm>
#include <chrono>
#include <set>

#include "invalid_argument.hpp"
#include "loom/error.hpp"

namespace loom {

std::string_view to_string(OverlapMode mode) noexcept {
  switch (mode) {
    case OverlapMode::sequential:
      return "sequential";
    case OverlapMode::ddp:
      return "ddp";
    case OverlapMode::loom:
      return "loom";
  }
  return "unknown";
}

OverlapMode parse_overlap_mode(std::string_view name) {
  for (OverlapMode m : {OverlapMode::sequential, OverlapMode::ddp, OverlapMode::loom})
    if (name == to_string(m)) return m;
  throw Error(ErrorCode::invalid_argument,
              "unknown mode '" + std::string(name) + "' (expected sequential, ddp or loom)");
}

namespace {

[[noreturn]] void invalid(const std::string& what) {
  throw_invalid_argument("DataParallelStep: " + what);
}

std::string layer_text(std::size_t k) {
  return "layer " + std::to_string(k);
}

// The compute nodes of one step's graph, by layer (layer 0 has no input gradient).
struct Nodes {
  std::vector<Task> forward, weights, input;
  Task loss;
};

// A bucket's update and the layers whose parameters it writes.
struct Update {
  Task task;
  std::set<std::size_t> layers;
};

}  // namespace

struct DataParallelStep::State {
  State(Backend& b, StepModel m, DataParallelOptions o)
      : backend(b), model(std::move(m)), options(std::move(o)) {}

  // A step graph as built: what the planner reads, and each layer's parameter-gradient node.
  struct Built {
    PlanGraph plan;
    std::vector<Task> weights;
  };
  // A compiled plan: its buckets, the executor bound to their memory, and the graph.
  struct Compiled {
    std::unique_ptr<Bucketer> bucketer;
    std::unique_ptr<Executor> executor;
    Built built;
    std::vector<std::size_t> issue_order;
    std::optional<TimedPlan> plan;
  };
  // DataParallelOptions::automatic_plan's progress: profiling, timing the shortlist, decided.
  struct AutomaticPlanning {
    std::vector<std::vector<NodeTiming>> runs;  // profiled, at most PlanSearch::profile_runs
    std::vector<Compiled> compiled;             // each shortlisted plan's; the running one empty
    std::vector<TimedPlan> shortlist;           // while it is timed
    std::optional<PlanTrials> trials;           // while the shortlist is timed
    std::vector<TimedPlan> tried;               // once decided
    bool decided = false;
  };

  Backend& backend;
  StepModel model;
  DataParallelOptions options;
  std::vector<std::pair<std::size_t, std::size_t>> params;  // registration order: (layer, index)
  std::vector<std::vector<std::size_t>> layer_params;       // per layer: registration indices
  std::unique_ptr<Bucketer> bucketer;
  Built running;  // what executor was compiled from
  std::unique_ptr<Executor> executor;
  std::unique_ptr<Executor> prologue;  // loom mode: the first step's forward
  bool primed = false;
  std::vector<std::size_t> issue_order;
  std::vector<std::size_t> ready_order;  // the gradients' order after rebuild_buckets()
  std::optional<TimedPlan> plan;
  AutomaticPlanning automatic;

  const StepParameter& parameter(std::size_t p) const {
    return model.layers[params[p].first].parameters[params[p].second];
  }
  std::chrono::nanoseconds limit() const {
    const auto timeout = options.executor.resolved().timeout;
    return timeout ? std::chrono::duration_cast<std::chrono::nanoseconds>(*timeout)
                   : std::chrono::nanoseconds(0);
  }

  void check_model();
  std::unique_ptr<Bucketer> make_bucketer(const BucketerOptions& bucketing) const;
  Task add_compute(Graph& graph, std::string name, StepWork work, int priority) const;
  Task add_forward(Graph& graph, const std::string& suffix, std::vector<Task>& forward) const;
  void add_backward(Graph& graph, const Bucketer& b, Nodes& nodes) const;
  Task add_sequential_phases(Graph& graph, Nodes& nodes, std::vector<BucketTasks>& buckets) const;
  std::vector<Update> add_updates(Graph& graph, const Bucketer& b, Nodes& nodes,
                                  std::vector<BucketTasks>& buckets, Task reduce_done) const;
  void add_next_forward(Graph& graph, Nodes& nodes, std::vector<Update>& updates) const;
  Built build(const Bucketer& b, std::span<const std::size_t> order) const;
  ExecutorOptions executor_options() const;
  void compile();
  void swap_compiled(Compiled& other);
  std::vector<TimedPlan> predict_plans(const PlanSearch& search, std::size_t keep);
  TimedPlan best_predicted_plan(const PlanSearch& search);
  void apply_plan(TimedPlan chosen);
  void advance_automatic_plan(double run_s);
};

void DataParallelStep::State::check_model() {
  if (model.layers.empty()) invalid("the model has no layers");
  if (!model.loss) invalid("the model has no loss");
  if (!model.update) invalid("the model has no update");
  if (model.update_name.empty()) invalid("StepModel::update_name is empty");
  std::size_t count = 0;
  for (std::size_t k = 0; k < model.layers.size(); ++k) {
    const StepLayer& layer = model.layers[k];
    if (layer.parameters.empty()) invalid(layer_text(k) + " has no parameters");
    if (!layer.forward) invalid(layer_text(k) + " has no forward");
    if (!layer.parameter_gradients) invalid(layer_text(k) + " has no parameter_gradients");
    if (k > 0 && !layer.input_gradient)
      invalid(layer_text(k) + " has no input_gradient (only the first layer may lack one)");
    for (const StepParameter& p : layer.parameters) {
      if (p.name.empty()) invalid(layer_text(k) + " has a parameter without a name");
      if (p.values.data() == nullptr || p.values.count() == 0)
        invalid("parameter '" + p.name + "' (" + layer_text(k) + ") has no values");
      if (p.gradient.data() != nullptr &&
          (p.gradient.count() != p.values.count() || p.gradient.dtype() != p.values.dtype()))
        invalid("parameter '" + p.name + "' has " + std::to_string(p.values.count()) +
                " values but a gradient of " + std::to_string(p.gradient.count()) + " " +
                std::string(to_string(p.gradient.dtype())));
    }
    count += layer.parameters.size();
  }
  if (model.registration.empty()) {
    for (std::size_t k = 0; k < model.layers.size(); ++k)
      for (std::size_t i = 0; i < model.layers[k].parameters.size(); ++i) params.push_back({k, i});
  } else {
    std::set<std::pair<std::size_t, std::size_t>> seen;
    for (const auto& [k, i] : model.registration) {
      if (k >= model.layers.size() || i >= model.layers[k].parameters.size())
        invalid("StepModel::registration names parameter " + std::to_string(i) + " of " +
                layer_text(k) + ", which does not exist");
      if (!seen.insert({k, i}).second)
        invalid("StepModel::registration names parameter " + std::to_string(i) + " of " +
                layer_text(k) + " twice");
    }
    if (seen.size() != count)
      invalid("StepModel::registration names " + std::to_string(seen.size()) + " of the " +
              std::to_string(count) + " parameters");
    params = model.registration;
  }
  layer_params.assign(model.layers.size(), {});
  for (std::size_t p = 0; p < params.size(); ++p) layer_params[params[p].first].push_back(p);
  for (auto& list : layer_params)  // each layer's parameters in the layer's own order
    std::sort(list.begin(), list.end(),
              [&](std::size_t a, std::size_t b) { return params[a].second < params[b].second; });
  if (options.automatic_plan && options.mode != OverlapMode::loom)
    invalid(
        "DataParallelOptions::automatic_plan plans loom mode's buckets and schedule; this step's "
        "mode is " +
        std::string(to_string(options.mode)));
  if (options.automatic_plan) options.automatic_plan->check("DataParallelStep");
}

// A Bucketer of the model's gradients (in the gradients' ready order after a rebuild).
std::unique_ptr<Bucketer> DataParallelStep::State::make_bucketer(
    const BucketerOptions& bucketing) const {
  std::vector<ParameterSpec> specs;
  for (std::size_t p = 0; p < params.size(); ++p) {
    const StepParameter& param = parameter(p);
    ParameterSpec spec;
    spec.name = param.name;
    spec.count = param.values.count();
    spec.dtype = param.values.dtype();
    spec.storage = param.gradient;  // empty: loom owns the memory, gradients are views
    specs.push_back(std::move(spec));
  }
  BucketerOptions options = bucketing;
  options.average = true;
  auto b = std::make_unique<Bucketer>(std::move(specs), options);
  if (!ready_order.empty()) b->rebuild(ready_order);
  return b;
}

// A CPU node, or a GPU node enqueueing on the stream the executor gives it.
Task DataParallelStep::State::add_compute(Graph& graph, std::string name, StepWork work,
                                          int priority) const {
  ComputeOptions options;
  options.priority = priority;
  options.reads = std::move(work.reads);
  options.writes = std::move(work.writes);
  if (model.device.kind == DeviceKind::cuda) {
    if (!work.gpu) invalid("node '" + name + "' has no gpu body (the model is on a CUDA device)");
    return graph.compute_gpu(std::move(name), std::move(work.gpu), std::move(options));
  }
  if (!work.cpu) invalid("node '" + name + "' has no cpu body (the model is on the CPU)");
  return graph.compute(std::move(name), std::move(work.cpu), std::move(options));
}

// The forward chain and the loss, into `graph`; `suffix` names the next step's copy.
Task DataParallelStep::State::add_forward(Graph& graph, const std::string& suffix,
                                          std::vector<Task>& forward) const {
  const std::size_t depth = model.layers.size();
  for (std::size_t k = 0; k < depth; ++k) {
    forward[k] =
        add_compute(graph, "forward" + std::to_string(k) + suffix, model.layers[k].forward(), 0);
    if (k > 0) forward[k - 1].precede(forward[k]);
  }
  Task loss = add_compute(graph, "loss" + suffix, model.loss(), 0);
  forward.back().precede(loss);
  return loss;
}

// Per layer, last first: the parameter gradients (into the Bucketer's gradient memory) and the
// input gradient that the layer below needs.
void DataParallelStep::State::add_backward(Graph& graph, const Bucketer& b, Nodes& nodes) const {
  const std::size_t depth = model.layers.size();
  for (std::size_t k = depth; k-- > 0;) {
    std::vector<Buffer> gradients;
    for (std::size_t p : layer_params[k]) gradients.push_back(b.gradient(p));
    // Before the input gradient that becomes ready with it: TBB would otherwise run the
    // input-gradient chain depth-first and produce every parameter gradient at the very end,
    // leaving no backward compute for communication to hide behind.
    nodes.weights[k] =
        add_compute(graph, "backward" + std::to_string(k) + ".weights",
                    model.layers[k].parameter_gradients(std::span<const Buffer>(gradients)), 1);
    Task upstream = k == depth - 1 ? nodes.loss : nodes.input[k + 1];
    if (upstream.valid()) upstream.precede(nodes.weights[k]);
    if (k > 0) {
      nodes.input[k] = add_compute(graph, "backward" + std::to_string(k) + ".input",
                                   model.layers[k].input_gradient(), 0);
      if (upstream.valid()) upstream.precede(nodes.input[k]);
    }
  }
}

// Sequential: strict phases, so nothing computes while anything communicates: backward, every
// pack, every allreduce, every unpack, the updates. Returns the end of the allreduce phase.
Task DataParallelStep::State::add_sequential_phases(Graph& graph, Nodes& nodes,
                                                    std::vector<BucketTasks>& buckets) const {
  auto backward_done = graph.compute("backward.done", [] {});
  auto packs_done = graph.compute("pack.done", [] {});
  auto reduce_done = graph.compute("allreduce.done", [] {});
  for (std::size_t k = 0; k < model.layers.size(); ++k) {
    nodes.weights[k].precede(backward_done);
    if (k > 0) nodes.input[k].precede(backward_done);
  }
  backward_done.precede(packs_done);
  for (BucketTasks& b : buckets) {
    if (b.pack.valid()) {
      backward_done.precede(b.pack);
      b.pack.precede(packs_done);
    }
    packs_done.precede(b.reduce);
    b.reduce.precede(reduce_done);
    if (b.unpack.valid()) reduce_done.precede(b.unpack);
  }
  return reduce_done;
}

// Every bucket's update, once the bucket is reduced (and the allreduce phase is over, if
// there is one) and backward no longer reads the parameters it overwrites.
std::vector<Update> DataParallelStep::State::add_updates(Graph& graph, const Bucketer& b,
                                                         Nodes& nodes,
                                                         std::vector<BucketTasks>& buckets,
                                                         Task reduce_done) const {
  std::vector<Update> updates;
  for (std::size_t bucket = 0; bucket < buckets.size(); ++bucket) {
    std::vector<ParameterSlice> slices;
    Update update;
    for (const BucketPiece& piece : b.buckets()[bucket].pieces) {
      const auto [layer, index] = params[piece.gradient];
      slices.push_back({layer, index, piece.offset,
                        b.gradient(piece.gradient).slice(piece.offset, piece.count),
                        parameter(piece.gradient).values.slice(piece.offset, piece.count)});
      update.layers.insert(layer);
    }
    StepWork work = model.update(std::span<const ParameterSlice>(slices));
    for (const ParameterSlice& s : slices) {
      work.reads.push_back(s.gradient);
      work.writes.push_back(s.values);
    }
    // Highest: an update runs as soon as its bucket is reduced, ahead of queued backward.
    update.task = add_compute(graph, "bucket" + std::to_string(bucket) + "." + model.update_name,
                              std::move(work), 2);
    buckets[bucket].done().precede(update.task);
    if (reduce_done.valid()) reduce_done.precede(update.task);
    // backward's input gradient of layer k reads its parameters: the update may not overwrite
    // them first.
    for (std::size_t k : update.layers)
      if (k > 0) nodes.input[k].precede(update.task);
    updates.push_back(std::move(update));
  }
  return updates;
}

// loom: the next step's forward, each layer as soon as its updates are in.
void DataParallelStep::State::add_next_forward(Graph& graph, Nodes& nodes,
                                               std::vector<Update>& updates) const {
  std::vector<Task> next(model.layers.size());
  add_forward(graph, ".next", next);
  for (Update& update : updates)
    for (std::size_t k : update.layers) update.task.precede(next[k]);
  // The next forward overwrites layer k's outputs, which this backward reads in layer k + 1.
  for (std::size_t k = 0; k + 1 < model.layers.size(); ++k) {
    nodes.weights[k + 1].precede(next[k]);
    nodes.input[k + 1].precede(next[k]);
  }
}

// The step's graph on `b`'s buckets, issued in bucket order (ddp), the ready order or `order`
// (loom).
DataParallelStep::State::Built DataParallelStep::State::build(
    const Bucketer& b, std::span<const std::size_t> order) const {
  const bool pipelined = options.mode == OverlapMode::loom;
  Built built;
  Graph& g = built.plan.graph;
  Nodes nodes;
  nodes.forward = nodes.weights = nodes.input = std::vector<Task>(model.layers.size());
  if (!pipelined) nodes.loss = add_forward(g, "", nodes.forward);
  add_backward(g, b, nodes);
  std::vector<Task> producers;
  for (const auto& [layer, index] : params) producers.push_back(nodes.weights[layer]);
  AttachOptions attach;
  attach.order = options.mode == OverlapMode::ddp ? BucketOrder::bucket : BucketOrder::ready;
  if (pipelined) attach.issue_order.assign(order.begin(), order.end());
  std::vector<BucketTasks> buckets = b.attach(g, producers, backend.world_size(), attach);
  const Task reduce_done =
      options.mode == OverlapMode::sequential ? add_sequential_phases(g, nodes, buckets) : Task{};
  std::vector<Update> updates = add_updates(g, b, nodes, buckets, reduce_done);
  if (pipelined) add_next_forward(g, nodes, updates);
  built.plan.buckets = std::move(buckets);
  for (const Update& u : updates) built.plan.updates.push_back(u.task);
  built.weights = std::move(nodes.weights);
  return built;
}

// A planned order only decides what the wire carries first if the wire carries one bucket at
// a time.
ExecutorOptions DataParallelStep::State::executor_options() const {
  ExecutorOptions o = options.executor;
  // The plan is made from profiled runs; once it is decided, profiling is what the user asked.
  if (options.automatic_plan && !automatic.decided) o.profile = true;
  if (plan) {
    o.collectives_in_flight = plan->plan.collectives_in_flight;
    return o;
  }
  if (options.mode == OverlapMode::loom && !issue_order.empty() && o.collectives_in_flight == 0)
    o.collectives_in_flight = 1;
  return o;
}

// loom pipelines steps: a run is this step's backward, its buckets' allreduce and updates, and
// the next step's forward and loss. The first forward runs once, in a prologue graph.
void DataParallelStep::State::compile() {
  if (options.mode == OverlapMode::loom && !prologue) {
    Graph first;
    std::vector<Task> first_forward(model.layers.size());
    add_forward(first, "", first_forward);
    prologue = Executor::compile(first, backend, options.executor);
  }
  Built built = build(*bucketer, issue_order);
  executor = Executor::compile(built.plan.graph, backend, executor_options());
  running = std::move(built);
}

void DataParallelStep::State::swap_compiled(Compiled& other) {
  std::swap(bucketer, other.bucketer);
  std::swap(executor, other.executor);
  std::swap(running, other.built);
  std::swap(issue_order, other.issue_order);
  std::swap(plan, other.plan);
}

std::vector<TimedPlan> DataParallelStep::State::predict_plans(const PlanSearch& search,
                                                              std::size_t keep) {
  if (options.mode != OverlapMode::loom)
    throw Error(ErrorCode::invalid_argument,
                "DataParallelStep::plan_automatically plans loom mode's step; this step runs " +
                    std::string(to_string(options.mode)) + " mode");
  // Checked on every rank, so a bad search is the same named error everywhere.
  search.check("DataParallelStep::plan_automatically");
  std::vector<std::vector<NodeTiming>> runs = automatic.runs;
  if (runs.empty()) runs.push_back(executor->last_run());
  if (runs.back().empty())
    throw Error(ErrorCode::invalid_argument,
                "DataParallelStep::plan_automatically needs a profiled run first "
                "(ExecutorOptions::profile)");
  std::vector<TimedPlan> mine;  // empty tells the other ranks that rank 0 failed
  std::string failure;
  if (backend.rank() == 0) {
    try {
      PlanInputs inputs;
      inputs.running = &running.plan;
      inputs.bucketer = bucketer.get();
      inputs.runs = runs;
      inputs.ranks = backend.world_size();
      inputs.workers = executor->workers();
      inputs.collectives_in_flight = executor_options().collectives_in_flight;
      inputs.issue_order = issue_order;
      mine = shortlist_plans(
          search_plans(
              search, inputs, [this](const BucketerOptions& o) { return make_bucketer(o); },
              [this](const Bucketer& b, std::span<const std::size_t> order) {
                return build(b, order).plan;
              }),
          std::max<std::size_t>(1, keep));
    } catch (const std::exception& e) {
      failure = e.what();
      mine.clear();
    }
  }
  std::vector<TimedPlan> plans = agree_on_plans(backend, mine, limit());
  if (!failure.empty()) throw Error(ErrorCode::internal, failure);
  if (plans.empty())
    throw Error(ErrorCode::peer_failed, "DataParallelStep::plan_automatically on rank " +
                                            std::to_string(backend.rank()) +
                                            ": rank 0 could not make a plan");
  return plans;
}

// The running plan and the best predicted other: the faster predicted (the running one on a
// tie).
TimedPlan DataParallelStep::State::best_predicted_plan(const PlanSearch& search) {
  std::vector<TimedPlan> plans = predict_plans(search, 2);
  return std::move(
      *std::min_element(plans.begin(), plans.end(), [](const TimedPlan& a, const TimedPlan& b) {
        return a.predicted_step_s < b.predicted_step_s;
      }));
}

void DataParallelStep::State::apply_plan(TimedPlan chosen) {
  BucketerOptions o = options.bucketing;
  o.bucket_cap_bytes = chosen.plan.bucket_cap_bytes;
  o.first_bucket_bytes = chosen.plan.first_bucket_bytes;
  o.partition_large = chosen.plan.partition_large;
  std::unique_ptr<Bucketer> b = make_bucketer(o);
  if (b->buckets().size() != chosen.buckets)
    throw Error(ErrorCode::mismatch,
                "DataParallelStep::plan_automatically on rank " + std::to_string(backend.rank()) +
                    ": rank 0's plan (" + describe(chosen) + ") has " +
                    std::to_string(chosen.buckets) + " buckets, this rank's model " +
                    std::to_string(b->buckets().size()));
  bucketer = std::move(b);
  issue_order = chosen.plan.issue_order;
  plan = std::move(chosen);
  compile();
}

void DataParallelStep::State::advance_automatic_plan(double run_s) {
  const PlanSearch& search = *options.automatic_plan;
  AutomaticPlanning& a = automatic;
  if (!a.trials) {
    // Profiling the configured buckets.
    a.runs.push_back(executor->last_run());
    if (a.runs.size() < static_cast<std::size_t>(std::max(1, search.profile_runs))) return;
    std::vector<TimedPlan> shortlist = search.shortlist <= 1
                                           ? std::vector<TimedPlan>{best_predicted_plan(search)}
                                           : predict_plans(search, search.shortlist);
    a.runs.clear();
    if (shortlist.size() == 1) {  // nothing to time
      a.tried = shortlist;
      a.decided = true;
      apply_plan(a.tried.front());
      return;
    }
    // Every shortlisted plan compiled once and kept: they then run in turn without
    // recompiling, each on its own warm bucket memory.
    a.compiled.resize(shortlist.size());
    for (std::size_t k = 0; k < shortlist.size(); ++k) {
      apply_plan(shortlist[k]);
      swap_compiled(a.compiled[k]);
    }
    a.trials.emplace(shortlist.size(), std::max(2, search.trial_runs));
    a.shortlist = std::move(shortlist);
    swap_compiled(a.compiled[0]);
    return;
  }
  const std::size_t current = a.trials->current();
  const std::size_t next = a.trials->record(run_s);
  if (!a.trials->done()) {
    swap_compiled(a.compiled[current]);
    swap_compiled(a.compiled[next]);
    return;
  }
  // Rank 0's measurements decide (and are what every rank reports).
  const std::vector<double> steps = a.trials->steps_s();
  for (std::size_t k = 0; k < steps.size(); ++k) a.shortlist[k].measured_step_s = steps[k];
  a.tried = agree_on_plans(backend, a.shortlist, limit());
  if (a.tried.size() != a.compiled.size())
    throw Error(ErrorCode::mismatch, "DataParallelStep's automatic plan on rank " +
                                         std::to_string(backend.rank()) + ": rank 0 timed " +
                                         std::to_string(a.tried.size()) + " plans, this rank " +
                                         std::to_string(a.compiled.size()));
  std::vector<double> agreed;
  for (const TimedPlan& p : a.tried) agreed.push_back(p.measured_step_s);
  // The shortlist's first is the running plan: it stays unless a plan beat it by more than
  // the trials' noise (plan_switch_gain), as GradientReducer's automatic plan decides.
  const std::size_t fastest = PlanTrials::keep_or_switch(agreed);
  if (fastest != current) {
    swap_compiled(a.compiled[current]);
    swap_compiled(a.compiled[fastest]);
  }
  plan = a.tried[fastest];  // with rank 0's measurement
  a.compiled.clear();
  a.shortlist.clear();
  a.trials.reset();
  a.decided = true;
  // Profiling was for the search: without it asked for, the plan runs unprofiled (compiling
  // is collective; every rank decides in the same run).
  if (!options.executor.resolved().profile.value_or(false)) compile();
}

DataParallelStep::DataParallelStep(Backend& backend, StepModel model, DataParallelOptions options)
    : _state(std::make_unique<State>(backend, std::move(model), std::move(options))) {
  State& s = *_state;
  s.check_model();
  s.bucketer = s.make_bucketer(s.options.bucketing);
  s.compile();
}

DataParallelStep::~DataParallelStep() = default;

void DataParallelStep::run() {
  State& s = *_state;
  if (s.prologue && !s.primed) {
    s.prologue->run();
    s.primed = true;
  }
  if (!s.options.automatic_plan || s.automatic.decided) {
    s.executor->run();
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  s.executor->run();
  s.advance_automatic_plan(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

void DataParallelStep::rebuild_buckets() {
  State& s = *_state;
  const auto timings = s.executor->last_run();
  if (timings.empty())
    throw Error(ErrorCode::invalid_argument,
                "DataParallelStep::rebuild_buckets needs a profiled run first "
                "(ExecutorOptions::profile)");
  std::vector<std::string> producer_names;
  for (const auto& [layer, index] : s.params)
    producer_names.push_back(s.running.weights[layer].name());
  const auto observed = Bucketer::ready_order(timings, producer_names);
  s.ready_order = Bucketer::agreed_ready_order(observed, s.backend);
  s.bucketer->rebuild(s.ready_order);
  s.issue_order.clear();  // planned for the old buckets
  s.compile();
}

void DataParallelStep::schedule_from_last_run() {
  State& s = *_state;
  if (s.options.mode != OverlapMode::loom) return;
  const auto timings = s.executor->last_run();
  if (timings.empty())
    throw Error(ErrorCode::invalid_argument,
                "DataParallelStep::schedule_from_last_run needs a profiled run first "
                "(ExecutorOptions::profile)");
  // last_run()[i] is task i of the running graph.
  const auto timing = [&](const Task& t) -> const NodeTiming& { return timings.at(t.id()); };
  // Per bucket: when it became ready (its last producer's end), when its allreduce was issued,
  // and the lowest layer it holds (the next forward needs layer 0 first).
  const auto& buckets = s.bucketer->buckets();
  const std::size_t n = buckets.size();
  std::vector<std::int64_t> ready(n, 0), issued(n, 0);
  std::vector<std::size_t> lowest(n, s.model.layers.size());
  for (std::size_t b = 0; b < n; ++b) {
    for (const BucketPiece& piece : buckets[b].pieces) {
      const std::size_t layer = s.params[piece.gradient].first;
      lowest[b] = std::min(lowest[b], layer);
      ready[b] = std::max(ready[b], timing(s.running.weights[layer]).end_ns);
    }
    issued[b] = timing(s.running.plan.buckets[b].reduce).start_ns;
  }
  std::vector<std::size_t> order = s.issue_order;
  if (order.empty()) {
    // First plan: the order the buckets became ready in, one on the wire at a time; the next
    // run then shows which of them still wait for the wire when backward ends.
    order.resize(n);
    for (std::size_t b = 0; b < n; ++b) order[b] = b;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return ready[a] < ready[b]; });
  } else {
    // The buckets issued once backward was over (the last gradient ready) were all waiting
    // for the wire then: they go lowest layer first, since the next forward needs layer 0
    // first. The ones issued earlier keep their place, so the wire idles no more than before.
    const std::int64_t backward_end = *std::max_element(ready.begin(), ready.end());
    auto tail = std::find_if(order.begin(), order.end(),
                             [&](std::size_t b) { return issued[b] >= backward_end; });
    std::stable_sort(tail, order.end(), [&](std::size_t a, std::size_t b) {
      return lowest[a] != lowest[b] ? lowest[a] < lowest[b] : ready[a] < ready[b];
    });
  }
  // Rank 0's plan on every rank: the issue order must be the same everywhere. The lengths are
  // agreed first, so ranks with other bucket counts fail alike with a mismatch, not a hang.
  s.issue_order = Bucketer::agreed_ready_order(order, s.backend);
  // A planned order is only kept on the wire one collective at a time, whatever an automatic
  // plan chose before.
  if (s.plan) {
    s.plan->plan.collectives_in_flight = 1;
    s.plan->plan.issue_order = s.issue_order;
  }
  s.compile();
}

const std::vector<std::size_t>& DataParallelStep::issue_order() const noexcept {
  return _state->issue_order;
}

const TimedPlan& DataParallelStep::plan_automatically(const PlanSearch& search) {
  State& s = *_state;
  s.apply_plan(s.best_predicted_plan(search));
  return *s.plan;
}

const TimedPlan* DataParallelStep::plan() const noexcept {
  return _state->plan ? &*_state->plan : nullptr;
}

const std::vector<TimedPlan>& DataParallelStep::plans_tried() const noexcept {
  return _state->automatic.tried;
}

Executor& DataParallelStep::executor() noexcept {
  return *_state->executor;
}

const Graph& DataParallelStep::graph() const noexcept {
  return _state->running.plan.graph;
}

const Bucketer& DataParallelStep::bucketer() const noexcept {
  return *_state->bucketer;
}

const DataParallelOptions& DataParallelStep::options() const noexcept {
  return _state->options;
}

std::size_t DataParallelStep::num_parameters() const noexcept {
  return _state->params.size();
}

const StepParameter& DataParallelStep::parameter(std::size_t p) const {
  if (p >= _state->params.size())
    invalid("parameter #" + std::to_string(p) + " does not exist (there are " +
            std::to_string(_state->params.size()) + ")");
  return _state->parameter(p);
}

std::size_t DataParallelStep::layer_of(std::size_t p) const {
  parameter(p);  // names a bad index
  return _state->params[p].first;
}

}  // namespace loom
