// CUDA devices: counting, selecting, PCI ids, blocking copies and owned device memory. Built
// without CUDA, every query reports no device and every allocation throws unavailable.
#include "loom/cuda_device.hpp"

#include <cstring>
#include <string>
#include <utility>

#include "loom/config.hpp"
#include "loom/error.hpp"
#if LOOM_HAVE_CUDA
#include "cuda_check.hpp"
#endif

namespace loom::cuda {

bool built_with_cuda() noexcept {
  return LOOM_HAVE_CUDA != 0;
}

#if LOOM_HAVE_CUDA

namespace {
// cudaGetDeviceCount's answer, asked once: without a driver it fails, and that is an answer.
struct DeviceCensus {
  int count = 0;
  std::string reason;
  DeviceCensus() {
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      count = 0;
      cudaGetLastError();
      reason = "no CUDA device is visible (cudaGetDeviceCount: " + error_text(status) + ")";
    } else if (count == 0) {
      reason = "no CUDA device is visible (cudaGetDeviceCount returned 0)";
    }
  }
};
const DeviceCensus& census() {
  static const DeviceCensus value;
  return value;
}
}  // namespace

int device_count() noexcept {
  try {
    return census().count;
  } catch (...) {
    return 0;
  }
}

std::string unavailable_reason() {
  return census().reason;
}

void require_device(int device) {
  const int count = device_count();
  if (count == 0) throw Error(ErrorCode::unavailable, unavailable_reason());
  if (device < 0 || device >= count)
    throw Error(ErrorCode::invalid_argument, "CUDA device " + std::to_string(device) +
                                                 " does not exist (" + std::to_string(count) +
                                                 " visible)");
}

void set_device(int device) {
  require_device(device);
  check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
}

DeviceGuard::DeviceGuard(int device) : _device(device) {
  require_device(device);
  if (cudaGetDevice(&_previous) != cudaSuccess) {
    cudaGetLastError();
    _previous = -1;
  }
  if (_previous != device) set_device(device);
}

DeviceGuard::~DeviceGuard() {
  if (_previous >= 0 && _previous != _device) cudaSetDevice(_previous);
}

int current_device() {
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

std::string pci_bus_id(int device) {
  require_device(device);
  char id[32] = {};
  check(cudaDeviceGetPCIBusId(id, sizeof id, device),
        "cudaDeviceGetPCIBusId(" + std::to_string(device) + ")");
  return id;
}

void copy(void* destination, const void* source, std::size_t bytes) {
  if (bytes == 0) return;
  check(cudaMemcpy(destination, source, bytes, cudaMemcpyDefault),
        "cudaMemcpy of " + std::to_string(bytes) + " bytes");
}

DeviceMemory::DeviceMemory(std::size_t bytes, int device) : _bytes(bytes), _device(device) {
  DeviceGuard guard(device);
  if (bytes == 0) return;
  check(cudaMalloc(&_data, bytes),
        "cudaMalloc of " + std::to_string(bytes) + " bytes on device " + std::to_string(device));
}

DeviceMemory::~DeviceMemory() {
  if (_data != nullptr) cudaFree(_data);
}

#else  // built without CUDA

int device_count() noexcept {
  return 0;
}

std::string unavailable_reason() {
  return "loom was built without CUDA (configure with the CUDA toolkit installed, or "
         "-DLOOM_WITH_CUDA=ON to require it)";
}

void require_device(int) {
  throw Error(ErrorCode::unavailable, unavailable_reason());
}
void set_device(int device) {
  require_device(device);
}
DeviceGuard::DeviceGuard(int device) : _device(device) {
  require_device(device);
}
DeviceGuard::~DeviceGuard() = default;
int current_device() {
  throw Error(ErrorCode::unavailable, unavailable_reason());
}
std::string pci_bus_id(int device) {
  require_device(device);
  return {};
}
// Without CUDA every pointer is a host pointer.
void copy(void* destination, const void* source, std::size_t bytes) {
  if (bytes != 0) std::memmove(destination, source, bytes);
}
DeviceMemory::DeviceMemory(std::size_t, int device) {
  require_device(device);
}
DeviceMemory::~DeviceMemory() = default;

#endif

DeviceMemory::DeviceMemory(DeviceMemory&& other) noexcept
    : _data(std::exchange(other._data, nullptr)),
      _bytes(std::exchange(other._bytes, 0)),
      _device(other._device) {}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& other) noexcept {
  if (this != &other) {
    DeviceMemory old(std::move(*this));
    _data = std::exchange(other._data, nullptr);
    _bytes = std::exchange(other._bytes, 0);
    _device = other._device;
  }
  return *this;
}

}  // namespace loom::cuda
