// Streams, events and the stream pool over the CUDA runtime; without CUDA, constructing any of
// them throws ErrorCode::unavailable naming why.
#include "loom/cuda_stream.hpp"

#include <string>
#include <utility>

#include "loom/config.hpp"
#include "loom/cuda_device.hpp"
#include "loom/error.hpp"
#if LOOM_HAVE_CUDA
#include "cuda_check.hpp"
#endif

namespace loom::cuda {

#if LOOM_HAVE_CUDA

Stream::Stream(int device, Priority priority) : _device(device) {
  DeviceGuard guard(device);
  int least = 0, greatest = 0;  // CUDA priorities: a smaller number is a higher priority
  check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  const int value = priority == Priority::high ? greatest : least;
  check(cudaStreamCreateWithPriority(&_stream, cudaStreamNonBlocking, value),
        "cudaStreamCreateWithPriority on device " + std::to_string(device));
}

Stream::~Stream() {
  if (_stream != nullptr) cudaStreamDestroy(_stream);
}

void Stream::wait(const Event& event) const {
  check(cudaStreamWaitEvent(_stream, event.native(), 0), "cudaStreamWaitEvent");
}

bool Stream::idle() const {
  const cudaError_t status = cudaStreamQuery(_stream);
  if (status == cudaErrorNotReady) return false;
  check(status, "cudaStreamQuery");
  return true;
}

void Stream::synchronize() const {
  check(cudaStreamSynchronize(_stream), "cudaStreamSynchronize");
}

Event::Event(int device) : _device(device) {
  DeviceGuard guard(device);
  check(cudaEventCreateWithFlags(&_event, cudaEventDisableTiming), "cudaEventCreateWithFlags");
}

Event::~Event() {
  if (_event != nullptr) cudaEventDestroy(_event);
}

void Event::record(NativeStream stream) {
  check(cudaEventRecord(_event, stream), "cudaEventRecord");
}

bool Event::complete() const {
  const cudaError_t status = cudaEventQuery(_event);
  if (status == cudaErrorNotReady) return false;
  check(status, "cudaEventQuery");
  return true;
}

void Event::synchronize() const {
  check(cudaEventSynchronize(_event), "cudaEventSynchronize");
}

void copy_async(void* destination, const void* source, std::size_t bytes, NativeStream stream) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDefault, stream),
        "cudaMemcpyAsync of " + std::to_string(bytes) + " bytes");
}

void stream_wait(NativeStream stream, const Event& event) {
  check(cudaStreamWaitEvent(stream, event.native(), 0), "cudaStreamWaitEvent");
}

void zero(void* data, std::size_t bytes) {
  if (bytes == 0) return;
  check(cudaMemset(data, 0, bytes), "cudaMemset of " + std::to_string(bytes) + " bytes");
  check(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
}

void zero_async(void* data, std::size_t bytes, NativeStream stream) {
  if (bytes == 0) return;
  check(cudaMemsetAsync(data, 0, bytes, stream),
        "cudaMemsetAsync of " + std::to_string(bytes) + " bytes");
}

#else  // built without CUDA: nothing can be created

Stream::Stream(int device, Priority) : _device(device) {
  require_device(device);
}
Stream::~Stream() = default;
void Stream::wait(const Event&) const {
  require_device(_device);
}
bool Stream::idle() const {
  return true;
}
void Stream::synchronize() const {}
Event::Event(int device) : _device(device) {
  require_device(device);
}
Event::~Event() = default;
void Event::record(NativeStream) {
  require_device(_device);
}
bool Event::complete() const {
  return true;
}
void Event::synchronize() const {}
void copy_async(void*, const void*, std::size_t, NativeStream) {
  throw Error(ErrorCode::unavailable, unavailable_reason());
}
void zero_async(void*, std::size_t, NativeStream) {
  throw Error(ErrorCode::unavailable, unavailable_reason());
}
void stream_wait(NativeStream, const Event&) {
  throw Error(ErrorCode::unavailable, unavailable_reason());
}
void zero(void*, std::size_t) {
  throw Error(ErrorCode::unavailable, unavailable_reason());
}

#endif

Stream::Stream(Stream&& other) noexcept
    : _stream(std::exchange(other._stream, nullptr)), _device(other._device) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    Stream old(std::move(*this));
    _stream = std::exchange(other._stream, nullptr);
    _device = other._device;
  }
  return *this;
}

Event::Event(Event&& other) noexcept
    : _event(std::exchange(other._event, nullptr)), _device(other._device) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    Event old(std::move(*this));
    _event = std::exchange(other._event, nullptr);
    _device = other._device;
  }
  return *this;
}

StreamPool::StreamPool(int device, std::size_t compute_streams)
    : _device(device), _communication(device, Stream::Priority::high) {
  if (compute_streams == 0)
    throw Error(ErrorCode::invalid_argument, "a stream pool needs at least one compute stream");
  _compute.reserve(compute_streams);
  for (std::size_t i = 0; i < compute_streams; ++i) _compute.emplace_back(device);
}

const Stream& StreamPool::compute(std::size_t index) const {
  return _compute[index % _compute.size()];
}

}  // namespace loom::cuda
