// TrainStep: builds the step's graph (forward chain, per-layer backward nodes, the Bucketer's
// chains, per-bucket SGD) for one of three overlap modes, compiles and runs it.
#include "train_step.hpp"

#include <cblas.h>

#include <set>

#include "loom/error.hpp"

namespace loom::examples {

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
  std::vector<GradientSpec> specs;
  for (Parameter& p : _parameters) {
    GradientSpec spec;
    spec.name = p.name;
    spec.count = p.values->size();
    if (!_config.gradient_views) {
      p.own_gradient.assign(p.values->size(), 0.0f);
      spec.storage = view(p.own_gradient);
    }
    specs.push_back(std::move(spec));
  }
  BucketerOptions bucketing = _config.bucketing;
  bucketing.average = true;
  _bucketer = std::make_unique<Bucketer>(std::move(specs), bucketing);
  compile();
}

void TrainStep::compile() {
  Mlp& m = _model;
  auto& layers = m.layers();
  const int depth = _config.shape.depth;
  const Buffer input_data = Buffer::of(std::span(m.input_of(0)));
  auto input_of = [&](int k) { return k == 0 ? input_data : view(layers[k - 1].a); };

  Graph g;
  std::vector<Task> forward(depth), weights(depth), input(depth);
  for (int k = 0; k < depth; ++k) {
    Layer& l = layers[k];
    std::vector<Buffer> writes{view(l.z)};
    if (!l.a.empty()) writes.push_back(view(l.a));
    forward[k] = g.compute(
        "forward" + std::to_string(k), [&m, k] { m.forward(k); },
        {.reads = {input_of(k), view(l.weight), view(l.bias)}, .writes = std::move(writes)});
    if (k > 0) forward[k - 1].precede(forward[k]);
  }
  auto loss = g.compute("loss", [this] { _loss = _model.loss_and_output_gradient(); },
                        {.reads = {view(layers.back().z)}, .writes = {view(layers.back().grad_z)}});
  forward.back().precede(loss);

  std::vector<std::size_t> weight_gradient(depth), bias_gradient(depth);
  for (std::size_t i = 0; i < _parameters.size(); ++i)
    (_parameters[i].weight ? weight_gradient : bias_gradient)[_parameters[i].layer] = i;
  for (int k = depth - 1; k >= 0; --k) {
    Layer& l = layers[k];
    const Buffer grad_w = _bucketer->gradient(weight_gradient[k]);
    const Buffer grad_b = _bucketer->gradient(bias_gradient[k]);
    weights[k] = g.compute(
        weights_node(k),
        [&m, k, grad_w, grad_b] { m.weight_gradient(k, grad_w.as<float>(), grad_b.as<float>()); },
        // Before the input gradient that becomes ready with it: TBB would otherwise run the
        // input-gradient chain depth-first and produce every weight gradient at the very end,
        // leaving no backward compute for communication to hide behind.
        {.priority = 1, .reads = {input_of(k), view(l.grad_z)}, .writes = {grad_w, grad_b}});
    Task upstream = k == depth - 1 ? loss : input[k + 1];
    upstream.precede(weights[k]);
    if (k > 0) {
      input[k] =
          g.compute("backward" + std::to_string(k) + ".input", [&m, k] { m.input_gradient(k); },
                    {.reads = {view(l.grad_z), view(l.weight), view(layers[k - 1].z)},
                     .writes = {view(layers[k - 1].grad_z)}});
      upstream.precede(input[k]);
    }
  }

  std::vector<Task> producers;
  for (const Parameter& p : _parameters) producers.push_back(weights[p.layer]);
  AttachOptions attach;
  attach.order = _config.mode == OverlapMode::ddp ? BucketOrder::bucket : BucketOrder::ready;
  const auto buckets = _bucketer->attach(g, producers, _backend.world_size(), attach);

  // Sequential: strict phases, so nothing computes while anything communicates: backward,
  // every pack, every allreduce, every unpack, the updates.
  Task reduce_done;
  if (_config.mode == OverlapMode::sequential) {
    auto backward_done = g.compute("backward.done", [] {});
    auto packs_done = g.compute("pack.done", [] {});
    reduce_done = g.compute("allreduce.done", [] {});
    for (int k = 0; k < depth; ++k) {
      weights[k].precede(backward_done);
      if (k > 0) input[k].precede(backward_done);
    }
    backward_done.precede(packs_done);
    for (BucketTasks b : buckets) {  // a copy: Task handles are cheap, precede() is non-const
      if (b.pack.valid()) {
        backward_done.precede(b.pack);
        b.pack.precede(packs_done);
      }
      packs_done.precede(b.reduce);
      b.reduce.precede(reduce_done);
      if (b.unpack.valid()) reduce_done.precede(b.unpack);
    }
  }

  const float lr = _config.learning_rate;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    std::vector<std::pair<Buffer, Buffer>> slices;  // (gradient, parameter)
    std::vector<Buffer> reads, writes;
    std::set<int> layers_touched;
    for (const BucketPiece& piece : _bucketer->buckets()[b].pieces) {
      const Parameter& p = _parameters[piece.gradient];
      const Buffer grad = _bucketer->gradient(piece.gradient).slice(piece.offset, piece.count);
      const Buffer param = view(*p.values).slice(piece.offset, piece.count);
      slices.emplace_back(grad, param);
      reads.push_back(grad);
      writes.push_back(param);
      layers_touched.insert(p.layer);
    }
    auto update = g.compute(
        "bucket" + std::to_string(b) + ".sgd",
        [slices, lr] {
          for (const auto& [grad, param] : slices)
            cblas_saxpy(static_cast<int>(grad.count()), -lr, grad.as<float>(), 1, param.as<float>(),
                        1);
        },
        // Highest: an update runs as soon as its bucket is reduced, ahead of queued backward.
        {.priority = 2, .reads = std::move(reads), .writes = std::move(writes)});
    buckets[b].done().precede(update);
    if (reduce_done.valid()) reduce_done.precede(update);
    // backward's input gradient of layer k reads W_k: the update may not overwrite it first.
    for (int k : layers_touched)
      if (k > 0) input[k].precede(update);
  }
  _executor = Executor::compile(g, _backend, _config.executor);
}

void TrainStep::run() {
  _executor->run();
}

std::vector<float> TrainStep::parameters() const {
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
  _bucketer->rebuild(Bucketer::agreed_ready_order(observed, _backend));
  compile();
}

}  // namespace loom::examples
