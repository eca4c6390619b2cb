// The Python class loom_torch._C.GradientReducer: loom's GradientReducer over a backend of its
// own beside a loom process group, with torch tensors in and views of loom's buckets out.
#pragma once

#include <pybind11/pybind11.h>

namespace loom::torch {

/// @brief Adds GradientReducer to the extension module (called by module.cpp).
void bind_gradient_reducer(pybind11::module_& m);

}  // namespace loom::torch
