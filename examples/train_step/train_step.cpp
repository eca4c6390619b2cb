// TrainStep: builds the step's graph (forward chain, per-layer backward nodes, the Bucketer's
// chains, per-bucket SGD) for one of three overlap modes, compiles and runs it.
#include "train_step.hpp"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "loom/error.hpp"

#if LOOM_TRAIN_STEP_CUDA
#include "cuda_mlp.hpp"
#include "loom/cuda_device.hpp"
#endif

namespace loom::examples {

#if !LOOM_TRAIN_STEP_CUDA
// Without cuBLAS no TrainStep makes one, but ~TrainStep destroys the (empty) pointer to it.
class CudaMlp {};
#endif

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

std::string_view to_string(Registration registration) noexcept {
  return registration == Registration::forward ? "forward" : "reverse";
}

Registration parse_registration(std::string_view name) {
  if (name == "forward") return Registration::forward;
  if (name == "reverse") return Registration::reverse;
  throw Error(ErrorCode::invalid_argument, "unknown registration order '" + std::string(name) +
                                               "' (expected forward or reverse)");
}

namespace {

Buffer view(std::vector<float>& v) {
  return Buffer::of(std::span(v));
}

// A bucket's piece of one parameter: the reduced gradient (host bucket) and what it updates.
struct Slice {
  Buffer grad, param;
  int layer;
  bool weight;
  std::size_t offset;
};

#if LOOM_TRAIN_STEP_CUDA
void sgd_on_gpu(CudaMlp& gpu, const std::vector<Slice>& slices, float lr, StreamRef s) {
  for (const Slice& x : slices)
    gpu.sgd(x.layer, x.weight, x.offset, x.grad.as<float>(), x.grad.count(), lr, s.native);
}
// A GPU node's body: `...` enqueued through the device model `gpu` on the executor's stream `s`.
#define LOOM_GPU_BODY(...) [=, gpu = _gpu.get()](StreamRef s) { __VA_ARGS__; }
#else
#define LOOM_GPU_BODY(...) [](StreamRef) {}
#endif

std::string weights_node(int k) {
  return "backward" + std::to_string(k) + ".weights";
}

}  // namespace

TrainStep::TrainStep(Backend& backend, TrainConfig config)
    : _backend(backend),
      _config(std::move(config)),
      _model(_config.shape, backend.rank(), backend.world_size()) {
  // TBB runs the graph's nodes in parallel; BLAS threads on top would oversubscribe the cores.
  openblas_set_num_threads(1);
  if (_config.device.kind == DeviceKind::cuda) {
#if LOOM_TRAIN_STEP_CUDA
    cuda::require_device(_config.device.index);  // names why there is none
    _gpu = std::make_unique<CudaMlp>(_model, _config.device.index);
#else
    throw Error(ErrorCode::unavailable, "TrainStep: device " + to_string(_config.device) +
                                            " asked for, but this build has no CUDA (cuBLAS)");
#endif
  }
  const int depth = _config.shape.depth;
  auto add_layer = [&](int k) {
    Layer& l = _model.layers()[k];
    _parameters.push_back({"layer" + std::to_string(k) + ".weight", k, true, &l.weight, {}});
    _parameters.push_back({"layer" + std::to_string(k) + ".bias", k, false, &l.bias, {}});
  };
  if (_config.registration == Registration::forward)
    for (int k = 0; k < depth; ++k) add_layer(k);
  else
    for (int k = depth - 1; k >= 0; --k) add_layer(k);
  if (_config.automatic_plan && _config.mode != OverlapMode::loom)
    throw Error(ErrorCode::invalid_argument,
                "TrainConfig::automatic_plan plans loom mode's buckets and schedule; this step's "
                "mode is " +
                    std::string(to_string(_config.mode)));
  if (!_config.gradient_views)
    for (Parameter& p : _parameters) p.own_gradient.assign(p.values->size(), 0.0f);
  _bucketer = make_bucketer(_config.bucketing);
  _memory = model_memory();
  compile();
}

TrainStep::~TrainStep() = default;

// A Bucketer of the model's gradients (in the gradients' ready order after a rebuild).
std::unique_ptr<Bucketer> TrainStep::make_bucketer(const BucketerOptions& options) {
  std::vector<GradientSpec> specs;
  for (Parameter& p : _parameters) {
    GradientSpec spec;
    spec.name = p.name;
    spec.count = p.values->size();
    // Views: loom owns the memory. Otherwise the model's own gradients, which are packed.
    if (!_config.gradient_views) spec.storage = view(p.own_gradient);
    specs.push_back(std::move(spec));
  }
  BucketerOptions bucketing = options;
  bucketing.average = true;
  auto bucketer = std::make_unique<Bucketer>(std::move(specs), bucketing);
  if (!_ready_order.empty()) bucketer->rebuild(_ready_order);
  return bucketer;
}

float TrainStep::loss() const {
#if LOOM_TRAIN_STEP_CUDA
  if (_gpu) return _gpu->loss();
#endif
  return _loss;
}

TrainStep::Memory TrainStep::model_memory() {
#if LOOM_TRAIN_STEP_CUDA
  if (CudaMlp* gpu = _gpu.get())
    return {[gpu](int k) { return gpu->input(k); }, [gpu](int k) { return gpu->weight(k); },
            [gpu](int k) { return gpu->bias(k); },  [gpu](int k) { return gpu->z(k); },
            [gpu](int k) { return gpu->a(k); },     [gpu](int k) { return gpu->grad_z(k); }};
#endif
  std::vector<Layer>* layers = &_model.layers();  // the nodes outlive this call, not the model
  const Buffer data = Buffer::of(std::span(_model.input_of(0)));
  return {[layers, data](int k) { return k == 0 ? data : view((*layers)[k - 1].a); },
          [layers](int k) { return view((*layers)[k].weight); },
          [layers](int k) { return view((*layers)[k].bias); },
          [layers](int k) { return view((*layers)[k].z); },
          [layers](int k) { return view((*layers)[k].a); },
          [layers](int k) { return view((*layers)[k].grad_z); }};
}

// loom pipelines steps: a run is this step's backward, its buckets' allreduce and updates, and
// the next step's forward and loss, whose layer k starts as soon as the updates of layer k are
// in, so the forward computes while the other layers' buckets are still on the wire. The first
// forward runs once, in a prologue graph of its own.
void TrainStep::compile() {
  if (_config.mode == OverlapMode::loom && !_prologue) {
    Graph first;
    std::vector<Task> first_forward(_config.shape.depth);
    add_forward(first, "", first_forward);
    _prologue = Executor::compile(first, _backend, _config.executor);
  }
  Graph g = build_graph();
  _executor = Executor::compile(g, _backend, executor_options());
  _graph = std::move(g);
}

// The step's graph for the current buckets and issue order (compiled by compile(), profiled
// for candidate plans by plan_automatically()).
Graph TrainStep::build_graph() {
  const bool pipelined = _config.mode == OverlapMode::loom;
  Graph g;
  Nodes nodes;
  nodes.forward = nodes.weights = nodes.input = std::vector<Task>(_config.shape.depth);
  if (!pipelined) nodes.loss = add_forward(g, "", nodes.forward);
  add_backward(g, nodes);
  std::vector<BucketTasks> buckets = add_buckets(g, nodes);
  const Task reduce_done =
      _config.mode == OverlapMode::sequential ? add_sequential_phases(g, nodes, buckets) : Task{};
  std::vector<Update> updates = add_updates(g, nodes, buckets, reduce_done);
  if (pipelined) add_next_forward(g, nodes, updates);
  return g;
}

// A CPU node, or a GPU node enqueueing on the stream the executor gives it.
Task TrainStep::add_compute(Graph& graph, std::string name, std::function<void()> cpu,
                            std::function<void(StreamRef)> gpu, ComputeOptions options) {
  return _gpu ? graph.compute_gpu(std::move(name), std::move(gpu), std::move(options))
              : graph.compute(std::move(name), std::move(cpu), std::move(options));
}

// The forward chain and the loss, into `graph`; `suffix` names the next step's copy.
Task TrainStep::add_forward(Graph& graph, const std::string& suffix, std::vector<Task>& forward) {
  const Memory& mem = _memory;
  const int depth = _config.shape.depth;
  for (int k = 0; k < depth; ++k) {
    std::vector<Buffer> writes{mem.z(k)};
    if (k + 1 < depth) writes.push_back(mem.a(k));
    forward[k] = add_compute(
        graph, "forward" + std::to_string(k) + suffix, [this, k] { _model.forward(k); },
        LOOM_GPU_BODY(gpu->forward(k, s.native)),
        {.reads = {mem.input(k), mem.weight(k), mem.bias(k)}, .writes = std::move(writes)});
    if (k > 0) forward[k - 1].precede(forward[k]);
  }
  Task loss =
      add_compute(graph, "loss" + suffix, [this] { _loss = _model.loss_and_output_gradient(); },
                  LOOM_GPU_BODY(gpu->loss_and_output_gradient(s.native)),
                  {.reads = {mem.z(depth - 1)}, .writes = {mem.grad_z(depth - 1)}});
  forward.back().precede(loss);
  return loss;
}

// Per layer, last first: the weight gradient (into the Bucketer's gradient memory) and the
// input gradient that the layer below needs.
void TrainStep::add_backward(Graph& graph, Nodes& nodes) {
  const Memory& mem = _memory;
  std::vector<std::size_t> weight_gradient(_config.shape.depth), bias_gradient(_config.shape.depth);
  for (std::size_t i = 0; i < _parameters.size(); ++i)
    (_parameters[i].weight ? weight_gradient : bias_gradient)[_parameters[i].layer] = i;
  for (int k = _config.shape.depth - 1; k >= 0; --k) {
    const Buffer grad_w = _bucketer->gradient(weight_gradient[k]);
    const Buffer grad_b = _bucketer->gradient(bias_gradient[k]);
    Task& weights = nodes.weights[k];
    weights = add_compute(
        graph, weights_node(k),
        [this, k, grad_w, grad_b] {
          _model.weight_gradient(k, grad_w.as<float>(), grad_b.as<float>());
        },
        // On the GPU: computed on the device, then copied into the (pinned) host bucket.
        LOOM_GPU_BODY(gpu->weight_gradient(k, grad_w.as<float>(), grad_b.as<float>(), s.native)),
        // Before the input gradient that becomes ready with it: TBB would otherwise run the
        // input-gradient chain depth-first and produce every weight gradient at the very end,
        // leaving no backward compute for communication to hide behind.
        {.priority = 1, .reads = {mem.input(k), mem.grad_z(k)}, .writes = {grad_w, grad_b}});
    Task upstream = k == _config.shape.depth - 1 ? nodes.loss : nodes.input[k + 1];
    if (upstream.valid()) upstream.precede(weights);
    if (k > 0) {
      nodes.input[k] = add_compute(
          graph, "backward" + std::to_string(k) + ".input", [this, k] { _model.input_gradient(k); },
          LOOM_GPU_BODY(gpu->input_gradient(k, s.native)),
          {.reads = {mem.grad_z(k), mem.weight(k), mem.z(k - 1)}, .writes = {mem.grad_z(k - 1)}});
      if (upstream.valid()) upstream.precede(nodes.input[k]);
    }
  }
}

// Each bucket's pack -> allreduce -> unpack after the weight gradients it holds, issued in
// bucket order (ddp), the ready order or the planned one (loom).
std::vector<BucketTasks> TrainStep::add_buckets(Graph& graph, const Nodes& nodes) {
  std::vector<Task> producers;
  for (const Parameter& p : _parameters) producers.push_back(nodes.weights[p.layer]);
  AttachOptions attach;
  attach.order = _config.mode == OverlapMode::ddp ? BucketOrder::bucket : BucketOrder::ready;
  if (_config.mode == OverlapMode::loom) attach.issue_order = _issue_order;
  return _bucketer->attach(graph, producers, _backend.world_size(), attach);
}

// Sequential: strict phases, so nothing computes while anything communicates: backward, every
// pack, every allreduce, every unpack, the updates. Returns the end of the allreduce phase.
Task TrainStep::add_sequential_phases(Graph& graph, Nodes& nodes,
                                      std::vector<BucketTasks>& buckets) {
  auto backward_done = graph.compute("backward.done", [] {});
  auto packs_done = graph.compute("pack.done", [] {});
  auto reduce_done = graph.compute("allreduce.done", [] {});
  for (int k = 0; k < _config.shape.depth; ++k) {
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

// Bucket `bucket`'s SGD on the parameters its reduced gradients belong to.
TrainStep::Update TrainStep::add_update(Graph& graph, std::size_t bucket) {
  std::vector<Slice> slices;
  std::vector<Buffer> reads, writes;
  std::set<int> layers;
  for (const BucketPiece& piece : _bucketer->buckets()[bucket].pieces) {
    const Parameter& p = _parameters[piece.gradient];
    const Buffer grad = _bucketer->gradient(piece.gradient).slice(piece.offset, piece.count);
    const Buffer param = (p.weight ? _memory.weight(p.layer) : _memory.bias(p.layer))
                             .slice(piece.offset, piece.count);
    slices.push_back({grad, param, p.layer, p.weight, piece.offset});
    reads.push_back(grad);
    writes.push_back(param);
    layers.insert(p.layer);
  }
  const float lr = _config.learning_rate;
  Task task = add_compute(
      graph, "bucket" + std::to_string(bucket) + ".sgd",
      [slices, lr] {
        for (const Slice& s : slices)
          cblas_saxpy(static_cast<int>(s.grad.count()), -lr, s.grad.as<float>(), 1,
                      s.param.as<float>(), 1);
      },
      LOOM_GPU_BODY(sgd_on_gpu(*gpu, slices, lr, s)),
      // Highest: an update runs as soon as its bucket is reduced, ahead of queued backward.
      {.priority = 2, .reads = std::move(reads), .writes = std::move(writes)});
  return {task, std::move(layers)};
}

// Every bucket's update, once the bucket is reduced (and the allreduce phase is over, if
// there is one) and backward no longer reads the weights it overwrites.
std::vector<TrainStep::Update> TrainStep::add_updates(Graph& graph, Nodes& nodes,
                                                      std::vector<BucketTasks>& buckets,
                                                      Task reduce_done) {
  std::vector<Update> updates;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    Update update = add_update(graph, b);
    buckets[b].done().precede(update.task);
    if (reduce_done.valid()) reduce_done.precede(update.task);
    // backward's input gradient of layer k reads W_k: the update may not overwrite it first.
    for (int k : update.layers)
      if (k > 0) nodes.input[k].precede(update.task);
    updates.push_back(std::move(update));
  }
  return updates;
}

// loom: the next step's forward, each layer as soon as its updates are in.
void TrainStep::add_next_forward(Graph& graph, Nodes& nodes, std::vector<Update>& updates) {
  std::vector<Task> next(_config.shape.depth);
  add_forward(graph, ".next", next);
  for (Update& update : updates)
    for (int k : update.layers) update.task.precede(next[k]);
  // The next forward overwrites z_k and a_k, which this backward reads in layer k + 1.
  for (int k = 0; k + 1 < _config.shape.depth; ++k) {
    nodes.weights[k + 1].precede(next[k]);
    nodes.input[k + 1].precede(next[k]);
  }
}

// A planned order only decides what the wire carries first if the wire carries one bucket at
// a time.
ExecutorOptions TrainStep::executor_options() const {
  ExecutorOptions options = _config.executor;
  // The plan is made from profiled runs; once it is decided, profiling is what the user asked.
  if (_config.automatic_plan && !_auto.decided) options.profile = true;
  if (_plan) {
    options.collectives_in_flight = _plan->collectives_in_flight;
    return options;
  }
  if (_config.mode == OverlapMode::loom && !_issue_order.empty() &&
      options.collectives_in_flight == 0)
    options.collectives_in_flight = 1;
  return options;
}

#undef LOOM_GPU_BODY

void TrainStep::run() {
  if (_prologue && !_primed) {
    _prologue->run();
    _primed = true;
  }
  if (!_config.automatic_plan || _config.mode != OverlapMode::loom || _auto.decided) {
    _executor->run();
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  _executor->run();
  advance_automatic_plan(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

std::vector<float> TrainStep::parameters() const {
#if LOOM_TRAIN_STEP_CUDA
  if (_gpu) return _gpu->parameters();
#endif
  std::vector<float> out;
  for (const Layer& l : _model.layers()) {
    out.insert(out.end(), l.weight.begin(), l.weight.end());
    out.insert(out.end(), l.bias.begin(), l.bias.end());
  }
  return out;
}

void TrainStep::rebuild_buckets() {
  const auto timings = _executor->last_run();
  if (timings.empty())
    throw Error(ErrorCode::invalid_argument,
                "TrainStep::rebuild_buckets needs a profiled run first (ExecutorOptions::profile)");
  std::vector<std::string> producer_names;
  for (const Parameter& p : _parameters) producer_names.push_back(weights_node(p.layer));
  const auto observed = Bucketer::ready_order(timings, producer_names);
  _ready_order = Bucketer::agreed_ready_order(observed, _backend);
  _bucketer->rebuild(_ready_order);
  _issue_order.clear();  // planned for the old buckets
  compile();
}

void TrainStep::schedule_from_last_run() {
  if (_config.mode != OverlapMode::loom) return;
  const auto timings = _executor->last_run();
  if (timings.empty())
    throw Error(ErrorCode::invalid_argument,
                "TrainStep::schedule_from_last_run needs a profiled run first "
                "(ExecutorOptions::profile)");
  std::map<std::string, const NodeTiming*> by_name;
  for (const NodeTiming& t : timings) by_name[t.name] = &t;
  auto timing = [&](const std::string& name) {
    const auto it = by_name.find(name);
    if (it == by_name.end())
      throw Error(ErrorCode::internal, "TrainStep::schedule_from_last_run: node '" + name +
                                           "' is not in the last run's timings");
    return *it->second;
  };
  // Per bucket: when it became ready (its last producer's end), when its allreduce was issued,
  // and the lowest layer it holds (the next forward needs layer 0 first).
  const auto& buckets = _bucketer->buckets();
  const std::size_t n = buckets.size();
  std::vector<std::int64_t> ready(n, 0), issued(n, 0);
  std::vector<int> lowest(n, _config.shape.depth);
  for (std::size_t b = 0; b < n; ++b) {
    for (const BucketPiece& piece : buckets[b].pieces) {
      const int layer = _parameters[piece.gradient].layer;
      lowest[b] = std::min(lowest[b], layer);
      ready[b] = std::max(ready[b], timing(weights_node(layer)).end_ns);
    }
    issued[b] = timing("bucket" + std::to_string(b) + ".allreduce").start_ns;
  }
  std::vector<std::size_t> order = _issue_order;
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
  const std::vector<std::size_t> plan = Bucketer::agreed_ready_order(order, _backend);
  _issue_order.assign(plan.begin(), plan.end());
  // A planned order is only kept on the wire one collective at a time, whatever an automatic
  // plan chose before.
  if (_plan) {
    _plan->collectives_in_flight = 1;
    _plan->issue_order = _issue_order;
  }
  compile();
}

}  // namespace loom::examples
