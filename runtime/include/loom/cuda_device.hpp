// CUDA devices as loom sees them: how many are visible, selecting one, device memory (RAII).
// cuda_runtime.h stays out of this header; a build without CUDA reports zero devices.
#pragma once

#include <cstddef>
#include <string>

namespace loom::cuda {

/// @brief Whether this build of loom was compiled with CUDA (LOOM_HAVE_CUDA).
bool built_with_cuda() noexcept;

/// @brief CUDA devices visible to this process; 0 without CUDA, driver or device (never throws).
int device_count() noexcept;

/// @brief Why no device can be used ("loom was built without CUDA", "no CUDA device is
/// visible: cudaGetDeviceCount says ..."), or "" when at least one is.
std::string unavailable_reason();

/// @brief Throws ErrorCode::unavailable naming unavailable_reason() unless `device` exists.
void require_device(int device);

/// @brief Makes `device` current on the calling thread (cudaSetDevice).
void set_device(int device);

/// @brief Makes `device` current for its lifetime and restores the thread's previous device:
/// loom's calls on a user's thread leave that thread's current device as they found it.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int _previous = -1;
  int _device = -1;
};
/// @brief The device current on the calling thread.
int current_device();

/// @brief "0000:41:00.0": the PCI bus id, the same for every process that sees this GPU.
std::string pci_bus_id(int device);

/// @brief Blocking copy between any two of host, device or pinned memory (cudaMemcpy default).
void copy(void* destination, const void* source, std::size_t bytes);

/// @brief Device memory owned by this object (cudaMalloc on construction, cudaFree on
/// destruction).
class DeviceMemory {
 public:
  DeviceMemory() = default;
  /// @brief `bytes` bytes on `device`; ErrorCode::out_of_memory when the device refuses.
  DeviceMemory(std::size_t bytes, int device);
  DeviceMemory(DeviceMemory&& other) noexcept;
  DeviceMemory& operator=(DeviceMemory&& other) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory();

  void* data() const noexcept { return _data; }
  std::size_t bytes() const noexcept { return _bytes; }
  int device() const noexcept { return _device; }

 private:
  void* _data = nullptr;
  std::size_t _bytes = 0;
  int _device = 0;
};

}  // namespace loom::cuda
