// CudaMlp: the Mlp's model on a CUDA device: cuBLAS GEMMs and small kernels enqueued on the
// stream each graph node is given. Weights and data start as copies of a host Mlp (same seed),
// so the GPU step can be checked against the CPU one. CUDA builds only (LOOM_TRAIN_STEP_CUDA).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "loom/buffer.hpp"
#include "mlp.hpp"

namespace loom::examples {

class CudaMlp {
 public:
  /// @brief Uploads `host`'s weights, biases, inputs and targets to `device`.
  CudaMlp(const Mlp& host, int device);
  ~CudaMlp();
  CudaMlp(const CudaMlp&) = delete;
  CudaMlp& operator=(const CudaMlp&) = delete;

  int device() const noexcept;
  // Device memory of layer k, for the graph's reads/writes declarations.
  Buffer input(int k) const;
  Buffer weight(int k) const;
  Buffer bias(int k) const;
  Buffer z(int k) const;
  Buffer a(int k) const;  ///< empty on the last layer
  Buffer grad_z(int k) const;

  // Each enqueues on `stream` (a cudaStream_t) and returns at once.
  void forward(int k, void* stream);
  /// @brief The loss lands in pinned host memory, readable with loss() once the stream is done.
  void loss_and_output_gradient(void* stream);
  /// @brief dW_k, db_k on the device, then copied to the (pinned) host memory given.
  void weight_gradient(int k, float* host_weight, float* host_bias, void* stream);
  void input_gradient(int k, void* stream);
  /// @brief param[offset, offset + count) of layer k's weight (or bias) -= lr * grad, grad being
  /// host memory (the reduced bucket), copied up first.
  void sgd(int k, bool weight, std::size_t offset, const float* host_grad, std::size_t count,
           float lr, void* stream);

  float loss() const;
  /// @brief W0, b0, W1, ... copied to the host (synchronises the device).
  std::vector<float> parameters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> _impl;
};

}  // namespace loom::examples
