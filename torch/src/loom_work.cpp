// LoomWork: completes torch's Work and Future from loom's completion.
#include "loom_work.hpp"

#include <ATen/core/jit_type.h>

#include <algorithm>

namespace loom::torch {

namespace {

// The CUDA devices of the outputs: a future holding CUDA tensors must name them (it records an
// event on each when it completes, and its consumers' streams wait for those).
std::vector<c10::Device> cuda_devices(const std::vector<at::Tensor>& outputs) {
  std::vector<c10::Device> devices;
  for (const at::Tensor& t : outputs)
    if (t.defined() && t.is_cuda() &&
        std::find(devices.begin(), devices.end(), t.device()) == devices.end())
      devices.push_back(t.device());
  return devices;
}

}  // namespace

LoomWork::LoomWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type),
      _outputs(std::move(outputs)),
      _future(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()), cuda_devices(_outputs))) {}

bool LoomWork::wait(std::chrono::milliseconds timeout) {
  const bool done = c10d::Work::wait(timeout);
  if (done && !_future->devices().empty()) _future->wait();  // current streams after its events
  return done;
}

void LoomWork::complete(std::exception_ptr error) {
  // The future first: a thread woken by wait() may drop the last reference to this work.
  if (error) {
    _future->setError(error);
  } else {
    _future->markCompleted(c10::IValue(_outputs));
  }
  finish(error);
}

}  // namespace loom::torch
