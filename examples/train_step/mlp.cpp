// Mlp: synthetic data, initialisation, and the forward and backward kernels through cblas_sgemm.
#include "mlp.hpp"

#include <cblas.h>

#include <cmath>
#include <random>

#include "loom/error.hpp"

namespace loom::examples {

Mlp::Mlp(const MlpShape& shape, int rank, int world_size) : _shape(shape) {
  if (shape.input < 1 || shape.width < 1 || shape.output < 1 || shape.depth < 1 || shape.batch < 1)
    throw Error(ErrorCode::invalid_argument,
                "Mlp: input, width, output, depth and batch must be >= 1 (got input " +
                    std::to_string(shape.input) + ", width " + std::to_string(shape.width) +
                    ", output " + std::to_string(shape.output) + ", depth " +
                    std::to_string(shape.depth) + ", batch " + std::to_string(shape.batch) + ")");
  if (rank < 0 || rank >= world_size)
    throw Error(ErrorCode::invalid_argument, "Mlp: rank " + std::to_string(rank) +
                                                 " is outside a world of " +
                                                 std::to_string(world_size));
  std::mt19937_64 random(shape.seed);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  // The whole data set is drawn on every rank, so a rank's slice does not depend on the
  // world size: one process over batch x world samples sees exactly the same data.
  const std::size_t samples = static_cast<std::size_t>(shape.batch) * world_size;
  std::vector<float> all_inputs(samples * shape.input);
  for (auto& x : all_inputs) x = unit(random);
  std::vector<float> teacher(static_cast<std::size_t>(shape.input) * shape.output);
  for (auto& t : teacher) t = unit(random) / std::sqrt(static_cast<float>(shape.input));
  std::vector<float> all_targets(samples * shape.output);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(samples), shape.output,
              shape.input, 1.0f, all_inputs.data(), shape.input, teacher.data(), shape.output, 0.0f,
              all_targets.data(), shape.output);
  for (auto& t : all_targets) t = std::tanh(t);
  const std::size_t first = static_cast<std::size_t>(rank) * shape.batch;
  _inputs.assign(all_inputs.begin() + first * shape.input,
                 all_inputs.begin() + (first + shape.batch) * shape.input);
  _targets.assign(all_targets.begin() + first * shape.output,
                  all_targets.begin() + (first + shape.batch) * shape.output);

  for (int k = 0; k < shape.depth; ++k) {
    Layer layer;
    layer.in = k == 0 ? shape.input : shape.width;
    layer.out = k == shape.depth - 1 ? shape.output : shape.width;
    const float bound = std::sqrt(6.0f / static_cast<float>(layer.in + layer.out));
    layer.weight.resize(static_cast<std::size_t>(layer.in) * layer.out);
    for (auto& w : layer.weight) w = bound * unit(random);
    layer.bias.assign(layer.out, 0.0f);
    layer.z.resize(static_cast<std::size_t>(shape.batch) * layer.out);
    if (k + 1 < shape.depth) layer.a.resize(layer.z.size());
    layer.grad_z.resize(layer.z.size());
    _layers.push_back(std::move(layer));
  }
}

const std::vector<float>& Mlp::input_of(int k) const {
  return k == 0 ? _inputs : _layers[k - 1].a;
}

void Mlp::forward(int k) {
  Layer& l = _layers[k];
  const int batch = _shape.batch;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, l.out, l.in, 1.0f,
              input_of(k).data(), l.in, l.weight.data(), l.out, 0.0f, l.z.data(), l.out);
  // Bias and ReLU in one pass per row, through restrict pointers and without branches, so the
  // compiler vectorises them (through the vectors' members it could not rule out aliasing, and
  // these loops cost a quarter of the GEMM).
  float* __restrict z = l.z.data();
  float* __restrict a = l.a.empty() ? nullptr : l.a.data();
  const float* __restrict bias = l.bias.data();
  const int out = l.out;
  for (int n = 0; n < batch; ++n) {
    float* __restrict zr = z + static_cast<std::size_t>(n) * out;
    for (int j = 0; j < out; ++j) zr[j] += bias[j];
    if (a) {
      float* __restrict ar = a + static_cast<std::size_t>(n) * out;
      for (int j = 0; j < out; ++j) ar[j] = zr[j] > 0.0f ? zr[j] : 0.0f;
    }
  }
}

float Mlp::loss_and_output_gradient() {
  Layer& last = _layers.back();
  const float inverse_batch = 1.0f / static_cast<float>(_shape.batch);
  double sum = 0;
  for (std::size_t i = 0; i < last.z.size(); ++i) {
    const float error = last.z[i] - _targets[i];
    sum += static_cast<double>(error) * error;
    last.grad_z[i] = error * inverse_batch;
  }
  return static_cast<float>(0.5 * sum / _shape.batch);
}

void Mlp::weight_gradient(int k, float* grad_weight, float* grad_bias) const {
  const Layer& l = _layers[k];
  const int batch = _shape.batch;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, l.in, l.out, batch, 1.0f, input_of(k).data(),
              l.in, l.grad_z.data(), l.out, 0.0f, grad_weight, l.out);
  // Column sums, rows in order (each element sums in the same order as a plain loop would).
  float* __restrict sum = grad_bias;
  const float* __restrict g = l.grad_z.data();
  const int out = l.out;
  for (int j = 0; j < out; ++j) sum[j] = 0.0f;
  for (int n = 0; n < batch; ++n)
    for (int j = 0; j < out; ++j) sum[j] += g[static_cast<std::size_t>(n) * out + j];
}

void Mlp::input_gradient(int k) {
  const Layer& l = _layers[k];
  Layer& below = _layers[k - 1];
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, _shape.batch, l.in, l.out, 1.0f,
              l.grad_z.data(), l.out, l.weight.data(), l.out, 0.0f, below.grad_z.data(), l.in);
  // ReLU's derivative as a select, not a branch: z is positive for about half the elements at
  // random, and a mispredicted branch per element cost more than the loop's arithmetic.
  float* __restrict g = below.grad_z.data();
  const float* __restrict z = below.z.data();
  const std::size_t size = below.grad_z.size();
  for (std::size_t i = 0; i < size; ++i) g[i] = z[i] <= 0.0f ? 0.0f : g[i];
}

}  // namespace loom::examples
