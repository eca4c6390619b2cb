// Tensors as loom sees them: at::Tensor -> loom::Buffer, torch dtypes and reduce ops -> loom's.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "loom/backend.hpp"

namespace loom::torch {

/// @brief loom's dtype for `type`; ErrorCode::unsupported naming it and listing loom's dtypes
/// otherwise. `where` prefixes the message ("allreduce on rank 0 of 2 (mpi)").
DType to_loom(at::ScalarType type, std::string_view where);

/// @brief loom's reduce op for `op`; ErrorCode::unsupported for BAND, BOR, BXOR, PREMUL_SUM.
ReduceOp to_loom(const c10d::ReduceOp& op, std::string_view where);

/// @brief A view of `tensor` that `backend` can move: dense, contiguous, on a device the backend
/// supports, of a dtype loom has. Anything else is a loom::Error naming `what` ("tensor",
/// "output 2") and why.
Buffer to_buffer(const at::Tensor& tensor, const Backend& backend, std::string_view where,
                 std::string_view what = "tensor");

/// @brief The one tensor of a call: c10d passes vectors (one entry per device); loom drives one
/// device per process, so anything but exactly one tensor is ErrorCode::invalid_argument.
const at::Tensor& single(const std::vector<at::Tensor>& tensors, std::string_view where,
                         std::string_view what = "tensors");

}  // namespace loom::torch
