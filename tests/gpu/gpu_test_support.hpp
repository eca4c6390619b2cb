// Helpers for GPU tests: skipping (with the reason) when no device is visible, and moving host
// vectors to and from device memory.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "loom/cuda_device.hpp"

/// Skips the current test, naming why, unless a CUDA device is visible.
#define LOOM_REQUIRE_GPU()                                                        \
  do {                                                                            \
    if (::loom::cuda::device_count() == 0)                                        \
      GTEST_SKIP() << "GPU test skipped: " << ::loom::cuda::unavailable_reason(); \
  } while (false)

namespace loom::test {

template <class T>
cuda::DeviceMemory to_device(const std::vector<T>& host, int device = 0) {
  cuda::DeviceMemory memory(host.size() * sizeof(T), device);
  cuda::copy(memory.data(), host.data(), host.size() * sizeof(T));
  return memory;
}

template <class T>
std::vector<T> to_host(const cuda::DeviceMemory& memory, std::size_t count) {
  std::vector<T> host(count);
  cuda::copy(host.data(), memory.data(), count * sizeof(T));
  return host;
}

}  // namespace loom::test
