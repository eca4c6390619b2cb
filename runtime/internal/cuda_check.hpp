// Turning CUDA runtime status codes into loom::Error (private to the library; CUDA builds only).
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <string_view>

#include "loom/error.hpp"

namespace loom::cuda {

/// @brief "cudaErrorInvalidValue (invalid argument)".
inline std::string error_text(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")";
}

/// @brief Throws ErrorCode::backend_failure "<what> failed: <CUDA's text>" unless success;
/// out-of-memory becomes ErrorCode::out_of_memory.
inline void check(cudaError_t status, std::string_view what) {
  if (status == cudaSuccess) return;
  // Clear the sticky "last error" of a non-fatal failure so the next call does not report it.
  cudaGetLastError();
  const ErrorCode code =
      status == cudaErrorMemoryAllocation ? ErrorCode::out_of_memory : ErrorCode::backend_failure;
  throw Error(code, std::string(what) + " failed: " + error_text(status));
}

}  // namespace loom::cuda
