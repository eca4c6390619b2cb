// LoomWork: completes torch's Work and Future from loom's completion.
#include "loom_work.hpp"

#include <ATen/core/jit_type.h>

namespace loom::torch {

LoomWork::LoomWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type),
      _outputs(std::move(outputs)),
      _future(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
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
