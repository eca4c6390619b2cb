// Stand-in for a header Debian's libtorch-dev 1.13 does not ship, which c10d/reducer.hpp
// includes. reducer.hpp needs two names from it; loom_torch only calls Reducer's exported
// register_comm_hook and never makes a DistAutogradContext, so the declarations suffice.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

namespace torch::distributed::autograd {

class DistAutogradContext {
 public:
  using GradCallback = std::function<bool(at::Tensor&)>;
};
using ContextPtr = std::shared_ptr<DistAutogradContext>;

}  // namespace torch::distributed::autograd
