// CUDA streams and events (RAII) and the stream pool: compute streams plus a high-priority
// communication stream. Only opaque CUDA handle types appear here, never cuda_runtime.h.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

// The CUDA runtime's own opaque types: cudaStream_t is CUstream_st*, cudaEvent_t is CUevent_st*.
struct CUstream_st;
struct CUevent_st;

namespace loom::cuda {

/// @brief A cudaStream_t, usable wherever CUDA expects one.
using NativeStream = ::CUstream_st*;
/// @brief A cudaEvent_t.
using NativeEvent = ::CUevent_st*;

class Event;

/// @brief An owned, non-blocking CUDA stream on one device.
class Stream {
 public:
  enum class Priority { normal, high };

  /// @brief Creates a stream on `device` (which becomes current on this thread).
  explicit Stream(int device, Priority priority = Priority::normal);
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  NativeStream native() const noexcept { return _stream; }
  int device() const noexcept { return _device; }
  /// @brief Makes later work on this stream wait for `event` on the device (no host wait).
  void wait(const Event& event) const;
  /// @brief Whether everything enqueued so far has finished (cudaStreamQuery; never blocks).
  bool idle() const;
  /// @brief Blocks the calling thread until the stream drains. Never call this on a thread that
  /// must keep communication progressing.
  void synchronize() const;

 private:
  NativeStream _stream = nullptr;
  int _device = 0;
};

/// @brief An owned CUDA event without timing (the cheap kind), for ordering and completion.
class Event {
 public:
  explicit Event(int device);
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  /// @brief Captures the work enqueued so far on `stream`.
  void record(NativeStream stream);
  void record(const Stream& stream) { record(stream.native()); }
  /// @brief Whether the captured work has finished (cudaEventQuery: never blocks). A device
  /// fault is thrown as ErrorCode::backend_failure.
  bool complete() const;
  void synchronize() const;
  NativeEvent native() const noexcept { return _event; }

 private:
  NativeEvent _event = nullptr;
  int _device = 0;
};

/// @brief Enqueues a copy of `bytes` bytes between any two of host, device or pinned memory
/// on `stream` (cudaMemcpyAsync; from pageable host memory the call returns once the source
/// was read). Without CUDA: ErrorCode::unavailable.
void copy_async(void* destination, const void* source, std::size_t bytes, NativeStream stream);
/// @brief Makes later work on `stream` wait for `event` on the device (no host wait).
void stream_wait(NativeStream stream, const Event& event);
/// @brief Zeroes `bytes` bytes of device memory and returns once they are zero.
void zero(void* data, std::size_t bytes);
/// @brief Enqueues zeroing `bytes` bytes of device memory on `stream` (cudaMemsetAsync).
void zero_async(void* data, std::size_t bytes, NativeStream stream);

/// @brief The streams of one device: `compute_streams` normal-priority compute streams handed
/// out round-robin, and one high-priority communication stream so that collectives are not
/// queued behind long kernels.
class StreamPool {
 public:
  StreamPool(int device, std::size_t compute_streams);

  int device() const noexcept { return _device; }
  std::size_t compute_stream_count() const noexcept { return _compute.size(); }
  /// @brief Compute stream `index % compute_stream_count()`.
  const Stream& compute(std::size_t index) const;
  const Stream& communication() const noexcept { return _communication; }

 private:
  int _device;
  std::vector<Stream> _compute;
  Stream _communication;
};

}  // namespace loom::cuda
