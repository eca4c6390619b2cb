// Mlp: a multi-layer perceptron's parameters, activations and its per-layer forward and
// backward kernels (OpenBLAS sgemm), on a fixed synthetic regression task.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace loom::examples {

/// @brief Model shape and data of the training example.
struct MlpShape {
  int input = 64;   ///< features per sample
  int width = 256;  ///< hidden units per layer
  int output = 16;  ///< regression targets per sample
  int depth = 4;    ///< linear layers (>= 1); ReLU between them
  int batch = 32;   ///< samples per rank
  std::uint64_t seed = 42;
};

/// @brief One linear layer: Z = X W + b, A = relu(Z) (not on the last layer).
struct Layer {
  int in = 0, out = 0;
  std::vector<float> weight;  ///< in x out, row-major
  std::vector<float> bias;    ///< out
  std::vector<float> z;       ///< batch x out, pre-activation
  std::vector<float> a;       ///< batch x out, relu(z) (hidden layers)
  std::vector<float> grad_z;  ///< batch x out, dLoss/dZ
};

/// @brief The model and this rank's slice of the data set.
///
/// The data set has batch x world samples drawn from `seed` (inputs uniform in [-1, 1],
/// targets tanh of a fixed random linear map); rank r trains on samples [r*batch, (r+1)*batch).
/// Weights start from the same seed on every rank. The loss is 0.5 * mean over the rank's
/// samples of the squared error, so the mean over ranks of the ranks' gradients is the
/// gradient over the whole data set.
class Mlp {
 public:
  Mlp(const MlpShape& shape, int rank, int world_size);

  const MlpShape& shape() const noexcept { return _shape; }
  std::vector<Layer>& layers() noexcept { return _layers; }
  const std::vector<Layer>& layers() const noexcept { return _layers; }
  /// @brief Input of layer k (the data for k = 0).
  const std::vector<float>& input_of(int k) const;
  const std::vector<float>& targets() const noexcept { return _targets; }

  /// @brief Z_k = X_k W_k + b_k and A_k = relu(Z_k).
  void forward(int k);
  /// @brief The loss of the last forward; also sets the last layer's grad_z.
  float loss_and_output_gradient();
  /// @brief dW_k = X_k^T G_k and db_k = column sums of G_k, into the given memory.
  void weight_gradient(int k, float* grad_weight, float* grad_bias) const;
  /// @brief G_{k-1} = (G_k W_k^T) * relu'(Z_{k-1}), for k >= 1.
  void input_gradient(int k);

 private:
  MlpShape _shape;
  std::vector<Layer> _layers;
  std::vector<float> _inputs, _targets;
};

}  // namespace loom::examples
