// TrainStep: the MLP described as a loom::StepModel (each layer's forward, parameter and input
// gradients as CPU bodies on OpenBLAS or GPU bodies on cuBLAS, and a per-bucket SGD update);
// loom::DataParallelStep builds, schedules, plans and runs its step.
#include "train_step.hpp"

#include <cblas.h>

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

}  // namespace

#if LOOM_TRAIN_STEP_CUDA
// A GPU body: `...` enqueued through the device model `gpu` on the executor's stream `s`.
#define LOOM_GPU_BODY(...) [=, gpu = _gpu.get()](StreamRef s) { __VA_ARGS__; }
#else
#define LOOM_GPU_BODY(...) std::function<void(StreamRef)>()
#endif

TrainStep::TrainStep(Backend& backend, TrainConfig config)
    : _config(std::move(config)), _model(_config.shape, backend.rank(), backend.world_size()) {
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
  if (!_config.gradient_views)
    for (const Layer& l : _model.layers()) {
      _own_gradients.emplace_back(l.weight.size(), 0.0f);
      _own_gradients.emplace_back(l.bias.size(), 0.0f);
    }
  _step = std::make_unique<DataParallelStep>(backend, describe_model(), step_options());
}

TrainStep::~TrainStep() = default;

DataParallelOptions TrainStep::step_options() const {
  DataParallelOptions options;
  options.mode = _config.mode;
  options.bucketing = _config.bucketing;
  options.executor = _config.executor;
  options.automatic_plan = _config.automatic_plan;
  return options;
}

// The MLP as the library's StepModel: layer k's W_k and b_k, its kernels as node bodies, the
// memory each one reads and writes (the host model's, or the device model's on a GPU).
StepModel TrainStep::describe_model() {
  StepModel m;
  m.update_name = "sgd";
  m.device = _config.device;
  const int depth = _config.shape.depth;
  std::vector<Layer>* layers = &_model.layers();  // the nodes outlive this call, not the model
  const Buffer data = Buffer::of(std::span(_model.input_of(0)));
  std::function<Buffer(int)> input = [layers, data](int k) {
    return k == 0 ? data : view((*layers)[k - 1].a);
  };
  std::function<Buffer(int)> weight = [layers](int k) { return view((*layers)[k].weight); };
  std::function<Buffer(int)> bias = [layers](int k) { return view((*layers)[k].bias); };
  std::function<Buffer(int)> z = [layers](int k) { return view((*layers)[k].z); };
  std::function<Buffer(int)> a = [layers](int k) { return view((*layers)[k].a); };
  std::function<Buffer(int)> grad_z = [layers](int k) { return view((*layers)[k].grad_z); };
#if LOOM_TRAIN_STEP_CUDA
  if (CudaMlp* gpu = _gpu.get()) {
    input = [gpu](int k) { return gpu->input(k); };
    weight = [gpu](int k) { return gpu->weight(k); };
    bias = [gpu](int k) { return gpu->bias(k); };
    z = [gpu](int k) { return gpu->z(k); };
    a = [gpu](int k) { return gpu->a(k); };
    grad_z = [gpu](int k) { return gpu->grad_z(k); };
  }
#endif
  for (int k = 0; k < depth; ++k) {
    StepLayer layer;
    layer.parameters = {{"layer" + std::to_string(k) + ".weight", weight(k), {}},
                        {"layer" + std::to_string(k) + ".bias", bias(k), {}}};
    if (!_config.gradient_views) {
      layer.parameters[0].gradient = view(_own_gradients[2 * k]);
      layer.parameters[1].gradient = view(_own_gradients[2 * k + 1]);
    }
    layer.forward = [=, this] {
      std::vector<Buffer> writes{z(k)};
      if (k + 1 < depth) writes.push_back(a(k));
      return StepWork{[this, k] { _model.forward(k); },
                      LOOM_GPU_BODY(gpu->forward(k, s.native)),
                      {input(k), weight(k), bias(k)},
                      std::move(writes)};
    };
    // On the GPU: computed on the device, then copied into the (pinned) host bucket.
    layer.parameter_gradients = [=, this](std::span<const Buffer> grads) {
      const Buffer grad_w = grads[0], grad_b = grads[1];
      return StepWork{
          [this, k, grad_w, grad_b] {
            _model.weight_gradient(k, grad_w.as<float>(), grad_b.as<float>());
          },
          LOOM_GPU_BODY(gpu->weight_gradient(k, grad_w.as<float>(), grad_b.as<float>(), s.native)),
          {input(k), grad_z(k)},
          {grad_w, grad_b}};
    };
    if (k > 0)
      layer.input_gradient = [=, this] {
        return StepWork{[this, k] { _model.input_gradient(k); },
                        LOOM_GPU_BODY(gpu->input_gradient(k, s.native)),
                        {grad_z(k), weight(k), z(k - 1)},
                        {grad_z(k - 1)}};
      };
    m.layers.push_back(std::move(layer));
  }
  m.loss = [=, this] {
    return StepWork{[this] { _loss = _model.loss_and_output_gradient(); },
                    LOOM_GPU_BODY(gpu->loss_and_output_gradient(s.native)),
                    {z(depth - 1)},
                    {grad_z(depth - 1)}};
  };
  const float lr = _config.learning_rate;
  m.update = [=, this](std::span<const ParameterSlice> slices) {
    std::vector<ParameterSlice> mine(slices.begin(), slices.end());
    StepWork work;
    work.cpu = [mine, lr] {
      for (const ParameterSlice& s : mine)
        cblas_saxpy(static_cast<int>(s.gradient.count()), -lr, s.gradient.as<float>(), 1,
                    s.values.as<float>(), 1);
    };
#if LOOM_TRAIN_STEP_CUDA
    if (CudaMlp* gpu = _gpu.get())
      work.gpu = [mine, lr, gpu](StreamRef s) {
        for (const ParameterSlice& x : mine)
          gpu->sgd(static_cast<int>(x.layer), x.parameter == 0, x.offset, x.gradient.as<float>(),
                   x.gradient.count(), lr, s.native);
      };
#endif
    return work;
  };
  if (_config.registration == Registration::reverse)
    for (int k = depth - 1; k >= 0; --k)
      m.registration.insert(m.registration.end(), {{std::size_t(k), 0}, {std::size_t(k), 1}});
  return m;
}

#undef LOOM_GPU_BODY

void TrainStep::run() {
  _step->run();
}

float TrainStep::loss() const {
#if LOOM_TRAIN_STEP_CUDA
  if (_gpu) return _gpu->loss();
#endif
  return _loss;
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
  _step->rebuild_buckets();
}

void TrainStep::schedule_from_last_run() {
  _step->schedule_from_last_run();
}

const TimedPlan& TrainStep::plan_automatically(const PlanSearch& search) {
  return _step->plan_automatically(search);
}

}  // namespace loom::examples
