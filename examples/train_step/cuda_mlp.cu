// CudaMlp: cuBLAS (column-major) on the row-major layout of Mlp, plus the element-wise kernels.
// Row-major X (batch x in) is column-major X^T (in x batch), so Z = X W is computed as
// Z^T = W^T X^T with every matrix passed as stored.
#include "cuda_mlp.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <string>

#include "loom/error.hpp"

namespace loom::examples {
namespace {

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess)
    throw Error(ErrorCode::backend_failure,
                std::string("CudaMlp: ") + what + ": " + cudaGetErrorString(rc));
}

void check(cublasStatus_t rc, const char* what) {
  if (rc != CUBLAS_STATUS_SUCCESS)
    throw Error(ErrorCode::backend_failure,
                std::string("CudaMlp: ") + what + ": cuBLAS status " + std::to_string(rc));
}

cudaStream_t native(void* stream) {
  return static_cast<cudaStream_t>(stream);
}

unsigned blocks(std::size_t n) {
  return static_cast<unsigned>((n + 255) / 256);
}

__global__ void bias_relu(float* z, float* a, const float* bias, int rows, int cols) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<std::size_t>(rows) * cols) return;
  const float v = z[i] + bias[i % cols];
  z[i] = v;
  if (a != nullptr) a[i] = v > 0.0f ? v : 0.0f;
}

// grad = (z - t) / batch; loss += 0.5 * sum (z - t)^2 / batch, accumulated per block.
__global__ void mse(const float* z, const float* target, float* grad, float* loss, std::size_t n,
                    float inverse_batch) {
  __shared__ float partial[256];
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  float e2 = 0.0f;
  if (i < n) {
    const float e = z[i] - target[i];
    grad[i] = e * inverse_batch;
    e2 = e * e;
  }
  partial[threadIdx.x] = e2;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(loss, 0.5f * partial[0] * inverse_batch);
}

__global__ void relu_mask(float* grad, const float* z, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n && z[i] <= 0.0f) grad[i] = 0.0f;
}

struct DeviceArray {
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  float* data = nullptr;
  std::size_t count = 0;
  void allocate(std::size_t n) {
    count = n;
    if (n > 0) check(cudaMalloc(&data, n * sizeof(float)), "cudaMalloc");
  }
  void upload(const std::vector<float>& host) {
    allocate(host.size());
    if (!host.empty())
      check(cudaMemcpy(data, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
            "cudaMemcpy");
  }
  ~DeviceArray() {
    if (data != nullptr) cudaFree(data);
  }
};

struct DeviceLayer {
  int in = 0, out = 0;
  DeviceArray weight, bias, z, a, grad_z, grad_weight, grad_bias;
};

}  // namespace

struct CudaMlp::Impl {
  MlpShape shape;
  int device = 0;
  DeviceArray inputs, targets, ones, loss;
  float* host_loss = nullptr;  // pinned
  int depth = 0;
  std::unique_ptr<DeviceLayer[]> layers;
  // cuBLAS handles are not safe to share between threads: graph nodes take one each.
  std::mutex handles_mutex;
  std::vector<cublasHandle_t> free_handles;

  cublasHandle_t take(void* stream) {
    cublasHandle_t h = nullptr;
    {
      std::lock_guard lock(handles_mutex);
      if (!free_handles.empty()) {
        h = free_handles.back();
        free_handles.pop_back();
      }
    }
    if (h == nullptr) {
      check(cublasCreate(&h), "cublasCreate");
      check(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");  // no TF32
    }
    check(cublasSetStream(h, native(stream)), "cublasSetStream");
    return h;
  }
  void give_back(cublasHandle_t h) {
    std::lock_guard lock(handles_mutex);
    free_handles.push_back(h);
  }
  // Runs `body` with a handle bound to `stream`.
  template <class Body>
  void with_blas(void* stream, Body body) {
    cublasHandle_t h = take(stream);
    try {
      body(h);
    } catch (...) {
      give_back(h);
      throw;
    }
    give_back(h);
  }
  const float* input_of(int k) const { return k == 0 ? inputs.data : layers[k - 1].a.data; }
};

CudaMlp::CudaMlp(const Mlp& host, int device) : _impl(std::make_unique<Impl>()) {
  Impl& m = *_impl;
  m.shape = host.shape();
  m.device = device;
  check(cudaSetDevice(device), "cudaSetDevice");
  m.inputs.upload(host.input_of(0));
  m.targets.upload(host.targets());
  m.ones.upload(std::vector<float>(static_cast<std::size_t>(m.shape.batch), 1.0f));
  m.loss.allocate(1);
  check(cudaHostAlloc(&m.host_loss, sizeof(float), cudaHostAllocDefault), "cudaHostAlloc");
  *m.host_loss = 0.0f;
  m.depth = static_cast<int>(host.layers().size());
  m.layers = std::make_unique<DeviceLayer[]>(host.layers().size());
  for (std::size_t k = 0; k < host.layers().size(); ++k) {
    const Layer& l = host.layers()[k];
    DeviceLayer& d = m.layers[k];
    d.in = l.in;
    d.out = l.out;
    d.weight.upload(l.weight);
    d.bias.upload(l.bias);
    d.z.allocate(l.z.size());
    d.a.allocate(l.a.size());
    d.grad_z.allocate(l.grad_z.size());
    d.grad_weight.allocate(l.weight.size());
    d.grad_bias.allocate(l.bias.size());
  }
}

CudaMlp::~CudaMlp() {
  if (!_impl) return;
  cudaDeviceSynchronize();
  for (cublasHandle_t h : _impl->free_handles) cublasDestroy(h);
  if (_impl->host_loss != nullptr) cudaFreeHost(_impl->host_loss);
}

int CudaMlp::device() const noexcept {
  return _impl->device;
}

namespace {
Buffer on(const DeviceArray& a, int device) {
  return Buffer(a.data, a.count, DType::float32, Device::cuda(device));
}
}  // namespace

Buffer CudaMlp::input(int k) const {
  return k == 0 ? on(_impl->inputs, _impl->device) : a(k - 1);
}
Buffer CudaMlp::weight(int k) const {
  return on(_impl->layers[k].weight, _impl->device);
}
Buffer CudaMlp::bias(int k) const {
  return on(_impl->layers[k].bias, _impl->device);
}
Buffer CudaMlp::z(int k) const {
  return on(_impl->layers[k].z, _impl->device);
}
Buffer CudaMlp::a(int k) const {
  return on(_impl->layers[k].a, _impl->device);
}
Buffer CudaMlp::grad_z(int k) const {
  return on(_impl->layers[k].grad_z, _impl->device);
}

void CudaMlp::forward(int k, void* stream) {
  Impl& m = *_impl;
  DeviceLayer& l = m.layers[k];
  const int batch = m.shape.batch;
  const float one = 1.0f, zero = 0.0f;
  m.with_blas(stream, [&](cublasHandle_t h) {
    check(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, l.out, batch, l.in, &one, l.weight.data, l.out,
                      m.input_of(k), l.in, &zero, l.z.data, l.out),
          "forward sgemm");
  });
  bias_relu<<<blocks(l.z.count), 256, 0, native(stream)>>>(l.z.data, l.a.data, l.bias.data, batch,
                                                           l.out);
  check(cudaGetLastError(), "bias_relu launch");
}

void CudaMlp::loss_and_output_gradient(void* stream) {
  Impl& m = *_impl;
  DeviceLayer& last = m.layers[m.depth - 1];
  check(cudaMemsetAsync(m.loss.data, 0, sizeof(float), native(stream)), "cudaMemsetAsync");
  mse<<<blocks(last.z.count), 256, 0, native(stream)>>>(last.z.data, m.targets.data,
                                                        last.grad_z.data, m.loss.data, last.z.count,
                                                        1.0f / static_cast<float>(m.shape.batch));
  check(cudaGetLastError(), "mse launch");
  check(cudaMemcpyAsync(m.host_loss, m.loss.data, sizeof(float), cudaMemcpyDeviceToHost,
                        native(stream)),
        "loss copy");
}

void CudaMlp::weight_gradient(int k, float* host_weight, float* host_bias, void* stream) {
  Impl& m = *_impl;
  DeviceLayer& l = m.layers[k];
  const int batch = m.shape.batch;
  const float one = 1.0f, zero = 0.0f;
  m.with_blas(stream, [&](cublasHandle_t h) {
    // dW^T (out x in) = G^T (out x batch) * X (batch x in), column-major.
    check(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, l.out, l.in, batch, &one, l.grad_z.data, l.out,
                      m.input_of(k), l.in, &zero, l.grad_weight.data, l.out),
          "weight-gradient sgemm");
    // db = G^T (out x batch) * ones.
    check(cublasSgemv(h, CUBLAS_OP_N, l.out, batch, &one, l.grad_z.data, l.out, m.ones.data, 1,
                      &zero, l.grad_bias.data, 1),
          "bias-gradient sgemv");
  });
  check(cudaMemcpyAsync(host_weight, l.grad_weight.data, l.grad_weight.count * sizeof(float),
                        cudaMemcpyDeviceToHost, native(stream)),
        "weight-gradient copy to the bucket");
  check(cudaMemcpyAsync(host_bias, l.grad_bias.data, l.grad_bias.count * sizeof(float),
                        cudaMemcpyDeviceToHost, native(stream)),
        "bias-gradient copy to the bucket");
}

void CudaMlp::input_gradient(int k, void* stream) {
  Impl& m = *_impl;
  DeviceLayer& l = m.layers[k];
  DeviceLayer& below = m.layers[k - 1];
  const int batch = m.shape.batch;
  const float one = 1.0f, zero = 0.0f;
  m.with_blas(stream, [&](cublasHandle_t h) {
    // G_{k-1}^T (in x batch) = W (in x out, i.e. W^T stored column-major, transposed) * G^T.
    check(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, l.in, batch, l.out, &one, l.weight.data, l.out,
                      l.grad_z.data, l.out, &zero, below.grad_z.data, l.in),
          "input-gradient sgemm");
  });
  relu_mask<<<blocks(below.grad_z.count), 256, 0, native(stream)>>>(below.grad_z.data, below.z.data,
                                                                    below.grad_z.count);
  check(cudaGetLastError(), "relu_mask launch");
}

void CudaMlp::sgd(int k, bool weight, std::size_t offset, const float* host_grad, std::size_t count,
                  float lr, void* stream) {
  Impl& m = *_impl;
  DeviceLayer& l = m.layers[k];
  float* param = (weight ? l.weight.data : l.bias.data) + offset;
  float* grad = (weight ? l.grad_weight.data : l.grad_bias.data) + offset;
  check(cudaMemcpyAsync(grad, host_grad, count * sizeof(float), cudaMemcpyHostToDevice,
                        native(stream)),
        "reduced-gradient copy from the bucket");
  const float alpha = -lr;
  m.with_blas(stream, [&](cublasHandle_t h) {
    check(cublasSaxpy(h, static_cast<int>(count), &alpha, grad, 1, param, 1), "sgd saxpy");
  });
}

float CudaMlp::loss() const {
  return *_impl->host_loss;
}

std::vector<float> CudaMlp::parameters() const {
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  std::vector<float> out;
  for (int k = 0; k < _impl->depth; ++k)
    for (const DeviceArray* a : {&_impl->layers[k].weight, &_impl->layers[k].bias}) {
      const std::size_t at = out.size();
      out.resize(at + a->count);
      check(cudaMemcpy(out.data() + at, a->data, a->count * sizeof(float), cudaMemcpyDeviceToHost),
            "cudaMemcpy");
    }
  return out;
}

}  // namespace loom::examples
